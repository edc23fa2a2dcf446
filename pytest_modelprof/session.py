"""Per-session state: the profiles tests made, their verdicts, xdist merging, and what
the end of the session writes (baselines, JSON artifacts)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budgets import NEW, REGRESSED, STALE, UNCHANGED, UPDATED, BudgetError, Budgets, Finding, Verdict, check, update_files
from .budgets.load import shown_path
from .metrics import LIMITED
from .results import Profile

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
    """What a run covered, to tell a stale budget entry (no collected test can make it)
    from one whose test did not get to make it (skipped, failed, deselected, not reached).

    ``complete`` is false after any deselection (``-k``, ``-m``, ``--lf``), an early stop
    (``-x``, ``--maxfail``), a collection error, an interrupt or ``--collect-only``.
    ``scope`` holds the paths (relative to the rootdir, ``/``-separated) collected in
    full: a test file under one of them that was not collected no longer exists.
    """

    complete: bool = True
    scope: list[str] = field(default_factory=list)
    tests: set[str] = field(default_factory=set)  # node ids collected
    passed: set[str] = field(default_factory=set)  # node ids whose every phase passed
    not_passed: set[str] = field(default_factory=set)  # node ids with a phase failed, skipped or xfailed

    def to_json(self) -> dict[str, Any]:
        return {"complete": self.complete, "scope": self.scope, "tests": sorted(self.tests)}

    def merge(self, data: dict[str, Any]) -> None:
        self.complete = self.complete and data["complete"]
        self.scope = sorted(set(self.scope) | set(data["scope"]))
        self.tests.update(data["tests"])

    def report(self, nodeid: str, when: str, outcome: str) -> None:
        """One phase's outcome (``passed``, ``failed``, ``skipped``: xfail is a skip)."""
        if outcome != "passed":
            self.not_passed.add(nodeid)
        elif when == "call":
            self.passed.add(nodeid)

    def is_stale(self, name: str) -> bool:
        """Whether no collected test can make the profile ``name`` (a budget entry's key).

        An entry named after a test (``file::test``, ``file::test#2``) is stale when that
        test passed without making it, or when a complete run did not collect the test
        from a file in scope. An entry under a chosen ``name=`` could come from any test:
        it is never stale.
        """
        test = name.partition("#")[0]
        if "::" not in test:
            return False
        if test in self.tests:
            return test in self.passed and test not in self.not_passed
        file = test.partition("::")[0]
        return self.complete and any(file == path or file.startswith(path.rstrip("/") + "/") or not path for path in self.scope)


class ProfileNameError(ValueError):
    """Two profiles of one session under one name (one budget entry)."""

    def __init__(self, name: str, first: str, second: str) -> None:
        self.name, self.first, self.second = name, first, second
        where = "earlier in this test" if first == second else f"by {first}"
        super().__init__(f"a profile named {name!r} was already made {where}; give each profile a unique name= (in {second})")


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
        self.errors: list[str] = []  # what fails the session besides its tests
        self.conflicts: dict[str, list[str]] = {}  # a name that tests on two xdist workers made: their node ids

    def record(self, name: str, nodeid: str, profile: Profile) -> Record:
        """Keep the profile ``name`` that the test ``nodeid`` made, with its verdict.

        Raises :class:`ProfileNameError` if a profile of that name was already made, by
        this test or another: a name is one budget entry, and two profiles cannot share it.
        """
        earlier = self.records.get(name)
        if earlier is not None:
            raise ProfileNameError(name, earlier.nodeid, nodeid)
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
                lines = [f.message() for f in record.verdict.regressions] + remedies(record.verdict.regressions)
                messages.append(f"profile {record.name!r} is over its budget:\n  " + "\n  ".join(lines))
            elif record.verdict.status == NEW and self.strict:
                messages.append(f"profile {record.name!r} has no budget (--modelprof-strict): run pytest --modelprof-update to record one")
        return messages

    # xdist ------------------------------------------------------------------

    def worker_output(self) -> str:
        return json.dumps({"records": [r.to_json() for r in self.records.values()], "coverage": self.coverage.to_json()})

    def merge_worker(self, output: str) -> None:
        """Take a pytest-xdist worker's profiles. A name that another worker's test also made
        is a conflict: neither profile of it is kept, and the session fails saying why."""
        data = json.loads(output)
        for item in data["records"]:
            name = item["name"]
            if name in self.conflicts:
                self.conflicts[name].append(item["nodeid"])
                continue
            try:
                self.record(name, item["nodeid"], Profile.from_dict(item["profile"]))
            except ProfileNameError as error:
                self.conflicts[name] = [error.first, error.second]
                del self.records[name]
        self.coverage.merge(data["coverage"])

    def conflict_errors(self) -> list[str]:
        return [
            f"a profile named {name!r} was made by {' and by '.join(nodeids)}: neither is checked or written; give each a unique name="
            for name, nodeids in sorted(self.conflicts.items())
        ]

    # end of session ----------------------------------------------------------

    def finish(self) -> None:
        """Find stale entries, then (with --modelprof-update) write baselines atomically."""
        self.errors.extend(self.conflict_errors())
        self.stale = sorted(
            name
            for name in self.budgets.profiles
            if name not in self.records and name not in self.conflicts and self.coverage.is_stale(name)
        )
        if not self.update:
            return
        measured = {name: r.profile for name, r in self.records.items()}
        remove = self.stale if self.prune else []
        try:
            update = update_files(self.budgets, measured, self.new_entry_path, remove)
        except (BudgetError, OSError) as error:
            self.errors.append(f"could not write baselines: {error}")
            return
        self.written = update.written
        for record in self.records.values():
            for metric in LIMITED.values():
                disturbance = metric.disturbance(record.profile)
                if disturbance and metric.measure(record.profile) is not None:
                    record.verdict.notes.append(f"{metric.key}: not recorded as a baseline (any recorded one is kept): {disturbance}")
            if record.verdict.status != REGRESSED:
                record.verdict.status = UPDATED if record.name in update.changed else UNCHANGED

    def new_entry_path(self, name: str) -> Path:
        """Where a profile without a budget gets one: a file named after the module of the test that made it."""
        test_file = self.records[name].nodeid.partition("::")[0]
        return self.budgets.directory / f"{Path(test_file).stem or 'profiles'}.toml"

    def verdicts(self) -> list[Verdict]:
        rows = [r.verdict for r in sorted(self.records.values(), key=lambda r: r.name)]
        rows += [Verdict(name, STALE, path=self.budgets.profiles[name].shown, line=self.budgets.profiles[name].line) for name in self.stale]
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
            "budgets": str(shown_path(self.budgets.directory, self.budgets.root)),
            "profiles": entries,
            "stale": self.stale,
            "counts": counts,
            "updated_files": [str(shown_path(p, self.budgets.root)) for p in self.written],
        }
        (directory / "session.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def remedies(regressions: list[Finding]) -> list[str]:
    """What to do about regressions: a ceiling is edited by hand, a baseline re-recorded."""
    hints = [
        f"{f.limit} is a hand-written ceiling: raise it at {f.path}:{f.line} if the increase is intended, or fix the model"
        for f in regressions
        if f.tolerance is None
    ]
    if any(f.tolerance is not None for f in regressions):
        hints.append("if the change is intended, record the new baseline: pytest --modelprof-update")
    return hints


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
        "reason": finding.reason,
    }
