"""Per-session state: the profiles tests made, their verdicts, xdist merging, and what
the end of the session writes (baselines, JSON artifacts)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budgets import NEW, REGRESSED, STALE, UPDATED, BudgetError, Budgets, Verdict, check, update_files
from .engine.result import Profile

SCHEMA_VERSION = 1


@dataclass
class Record:
    """One profile a test made, and its verdict."""

    name: str
    nodeid: str
    profile: Profile
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nodeid": self.nodeid, "profile": self.profile.to_dict()}


@dataclass
class RunCoverage:
    """What a (worker's) run covered, to tell stale budget entries from ones not run."""

    complete: bool = True  # no deselection, no early stop
    files: set[str] = field(default_factory=set)  # test files collected
    tests: set[str] = field(default_factory=set)  # node ids collected
    ran: set[str] = field(default_factory=set)  # node ids whose test body ran

    def to_json(self) -> dict[str, Any]:
        return {"complete": self.complete, "files": sorted(self.files), "tests": sorted(self.tests), "ran": sorted(self.ran)}

    def merge(self, data: dict[str, Any]) -> None:
        self.complete = self.complete and data["complete"]
        self.files.update(data["files"])
        self.tests.update(data["tests"])
        self.ran.update(data["ran"])


class ModelprofSession:
    def __init__(self, budgets: Budgets, *, update: bool, prune: bool, strict: bool) -> None:
        self.budgets = budgets
        self.update = update
        self.prune = prune
        self.strict = strict
        self.records: dict[str, Record] = {}
        self.coverage = RunCoverage()
        self.stale: list[str] = []
        self.written: list[Path] = []
        self.error: str | None = None

    def record(self, name: str, nodeid: str, profile: Profile) -> Record:
        earlier = self.records.get(name)
        if earlier is not None and earlier.nodeid != nodeid:
            raise ValueError(f"a profile named {name!r} was already made by {earlier.nodeid}; pass a unique name=")
        verdict = check(profile, name, self.budgets.profiles.get(name), baselines=not self.update)
        record = Record(name, nodeid, profile, verdict)
        self.records[name] = record
        return record

    def failures(self, nodeid: str) -> list[str]:
        """Why the test ``nodeid`` fails its budgets (empty when it passes)."""
        messages = []
        for record in self.records.values():
            if record.nodeid != nodeid:
                continue
            if record.verdict.status == REGRESSED:
                lines = "\n  ".join(f.message() for f in record.verdict.regressions)
                messages.append(f"profile {record.name!r} is over its budget:\n  {lines}")
            elif record.verdict.status == NEW and self.strict:
                messages.append(f"profile {record.name!r} has no budget (--modelprof-strict): run pytest --modelprof-update to record one")
        return messages

    # xdist ------------------------------------------------------------------

    def worker_output(self) -> str:
        return json.dumps({"records": [r.to_json() for r in self.records.values()], "coverage": self.coverage.to_json()})

    def merge_worker(self, output: str) -> None:
        data = json.loads(output)
        for item in data["records"]:
            profile = Profile.from_dict(item["profile"])
            self.record(item["name"], item["nodeid"], profile)
        self.coverage.merge(data["coverage"])

    # end of session ----------------------------------------------------------

    def finish(self) -> None:
        """Find stale entries, then (with --modelprof-update) write baselines atomically."""
        self.stale = sorted(name for name in self.budgets.profiles if name not in self.records and self._is_stale(name))
        if not self.update:
            return
        measured = {name: r.profile for name, r in self.records.items()}
        remove = self.stale if self.prune else []
        try:
            self.written = update_files(self.budgets, measured, self.new_entry_path, remove)
        except (BudgetError, OSError) as error:
            self.error = f"could not write baselines: {error}"
            return
        for record in self.records.values():
            if record.verdict.status != REGRESSED:
                record.verdict.status = UPDATED

    def new_entry_path(self, name: str) -> Path:
        """Where a profile without a budget gets one: a file named after the module of the test that made it."""
        test_file = self.records[name].nodeid.partition("::")[0]
        return self.budgets.directory / f"{Path(test_file).stem or 'profiles'}.toml"

    def _is_stale(self, name: str) -> bool:
        test = name.partition("#")[0]
        if "::" not in test:
            return False  # a chosen name: no test can be said to own it
        if test in self.coverage.ran:
            return True  # its test ran and made no such profile
        file = test.partition("::")[0]
        return self.coverage.complete and file in self.coverage.files and test not in self.coverage.tests

    def verdicts(self) -> list[Verdict]:
        rows = [r.verdict for r in sorted(self.records.values(), key=lambda r: r.name)]
        rows += [Verdict(name, STALE, path=self.budgets.profiles[name].path, line=self.budgets.profiles[name].line) for name in self.stale]
        return rows

    def write_json(self, directory: Path) -> None:
        """One JSON file per profile and ``session.json``, as the shipped schema describes."""
        directory.mkdir(parents=True, exist_ok=True)
        entries = []
        for record in sorted(self.records.values(), key=lambda r: r.name):
            file = artifact_name(record.name)
            document = {
                "schema_version": SCHEMA_VERSION,
                "name": record.name,
                "nodeid": record.nodeid,
                "status": record.verdict.status,
                "budget": _where(record.verdict),
                "findings": [_finding(f) for f in record.verdict.findings],
                "notes": record.verdict.notes,
                "profile": record.profile.to_dict(),
            }
            (directory / file).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            entries.append({"name": record.name, "status": record.verdict.status, "file": file})
        counts: dict[str, int] = {}
        for verdict in self.verdicts():
            counts[verdict.status] = counts.get(verdict.status, 0) + 1
        summary = {
            "schema_version": SCHEMA_VERSION,
            "budgets": str(self.budgets.directory),
            "profiles": entries,
            "stale": self.stale,
            "counts": counts,
            "updated_files": [str(p) for p in self.written],
        }
        (directory / "session.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def artifact_name(name: str) -> str:
    """A file name for a profile: readable, safe on every OS, and distinct for distinct names."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:80] or "profile"
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{readable}-{digest}.json"


def _where(verdict: Verdict) -> dict[str, Any] | None:
    return None if verdict.path is None else {"file": str(verdict.path), "line": verdict.line}


def _finding(finding: Any) -> dict[str, Any]:
    return {
        "metric": finding.metric,
        "limit": finding.limit,
        "measured": finding.measured,
        "reference": finding.reference,
        "allowed": finding.allowed,
        "status": finding.status,
        "file": str(finding.path),
        "line": finding.line,
        "message": finding.message(),
        "interval": list(finding.interval) if finding.interval is not None else None,
        "note": finding.note,
    }
