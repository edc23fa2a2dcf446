"""Per-session state: the profiles tests made, their verdicts, xdist merging and the merging of
shards' artifacts, and what the end of the session writes (baselines; the JSON artifacts
through :mod:`.artifacts`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import ArtifactError, Artifacts, write_artifacts
from .budgets import NEW, REGRESSED, STALE, UNCHANGED, UPDATED, BudgetError, Budgets, Finding, Verdict, check, update_files
from .budgets.load import shown_path
from .metrics import LIMITED, METRICS
from .report.summary import SummaryRow, format_table, summary_row
from .results import Profile


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

    ``collected`` holds every test collected, ``selected`` those left to run after
    deselection (``-k``, ``-m``, a pytest-split shard); ``stopped`` says why the run did
    not run all it selected (an early stop, a collection error, an interrupt,
    ``--collect-only``, ``--lf``, a crashed worker). The run is complete when nothing
    stopped it and it selected all it collected: then a test file under ``scope`` (the
    paths, relative to the rootdir and ``/``-separated, collected in full) that was not
    collected no longer exists. Coverages merge (xdist workers, the shards of a matrix):
    shards that each select part of one collection together cover all of it.
    """

    scope: list[str] = field(default_factory=list)
    collected: set[str] = field(default_factory=set)  # node ids collected, before deselection
    selected: set[str] = field(default_factory=set)  # node ids left to run after deselection
    stopped: set[str] = field(default_factory=set)  # why the run did not run all it selected
    passed: set[str] = field(default_factory=set)  # node ids whose every phase passed
    not_passed: set[str] = field(default_factory=set)  # node ids with a phase failed, skipped or xfailed

    @property
    def complete(self) -> bool:
        return not self.stopped and self.collected <= self.selected

    def incomplete(self) -> str | None:
        """Why the run is not complete, in a sentence; None when it is."""
        if self.stopped:
            return "the run was cut short (" + "; ".join(sorted(self.stopped)) + ")"
        missing = sorted(self.collected - self.selected)
        if not missing:
            return None
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        return f"{len(missing)} of the {len(self.collected)} collected tests were not selected to run ({shown})"

    def stop(self, reason: str) -> None:
        self.stopped.add(reason)

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "collected": sorted(self.collected),
            "selected": sorted(self.selected),
            "stopped": sorted(self.stopped),
            "passed": sorted(self.passed),
            "not_passed": sorted(self.not_passed),
        }

    def merge(self, data: dict[str, Any]) -> None:
        self.scope = sorted(set(self.scope) | set(data["scope"]))
        for key in ("collected", "selected", "stopped", "passed", "not_passed"):
            getattr(self, key).update(data[key])

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
        if test in self.collected:
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
        self.notes: list[str] = []  # what the summary says about the session as a whole
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

    def rows(self) -> list[SummaryRow]:
        """The summary table's rows: one per profile and per stale entry."""
        rows = []
        for verdict in self.verdicts():
            record = self.records.get(verdict.name)
            budget = self.budgets.profiles.get(verdict.name)
            baseline = budget.baselines.get("gflops") if budget else None
            rows.append(summary_row(verdict, record.profile if record else None, baseline))
        return rows

    def summary(self, root: Path) -> list[str]:
        """The end-of-session summary: the table, each profile's notes, the session's notes and
        errors (``ERROR:`` lines), the files written and what to do next."""
        lines = format_table(self.rows())
        lines += [f"{verdict.name}: {note}" for verdict in self.verdicts() for note in verdict.notes]
        lines += self.notes
        lines += [f"ERROR: {error}" for error in self.errors]
        lines += [f"updated {shown_path(path, root).as_posix()}" for path in self.written]
        return lines + self.next_steps()

    def next_steps(self) -> list[str]:
        verdicts = self.verdicts()
        statuses = {v.status for v in verdicts}
        hints = []
        if self.update:
            if self.stale and not self.prune:
                hints.append("stale entries kept; to remove them: pytest --modelprof-update --modelprof-prune")
            return hints
        regressions = [f for v in verdicts for f in v.regressions]
        if any(f.tolerance is not None for f in regressions):
            hints.append("if an increase over a baseline is intended, record it as the new baseline: pytest --modelprof-update")
        if any(f.tolerance is None for f in regressions):
            hints.append(
                "a ceiling (max_*) is written by hand: --modelprof-update does not change it; raise it in its file, or fix the model"
            )
        if "improved" in statuses:
            hints.append("to lock in the improvement: pytest --modelprof-update")
        if "new" in statuses:
            hints.append("to record budgets for new profiles: pytest --modelprof-update")
        if "stale" in statuses:
            hints.append("stale entries (no test made them): pytest --modelprof-update --modelprof-prune removes them")
        return hints

    def write_json(self, directory: Path) -> None:
        """One JSON file per profile and ``session.json``, as the shipped schema describes."""
        records = sorted(self.records.values(), key=lambda r: r.name)
        write_artifacts(
            directory,
            [(r.name, r.nodeid, r.profile, r.verdict) for r in records],
            self.verdicts(),
            coverage=self.coverage.to_json(),
            budgets=self.budgets,
            stale=self.stale,
            written=self.written,
        )


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


# merging the shards of a matrix ---------------------------------------------------


def merge_sessions(shards: list[Artifacts], budgets: Budgets, *, update: bool, prune: bool, strict: bool) -> ModelprofSession:
    """One session from the artifacts of several (the shards of a CI matrix), checked against
    ``budgets`` as one run of the whole suite would be; ``finish()`` it to write baselines.

    Refuses (ArtifactError) shards of different pytest-modelprof versions, and one profile in
    two shards with different figures. Pruning needs the shards to cover the whole collection:
    otherwise nothing is pruned and the session's notes say why.
    """
    versions = {shard.version for shard in shards}
    if len(versions) > 1:
        made = ", ".join(f"{shard.directory} by {shard.version}" for shard in shards)
        raise ArtifactError(f"artifacts made by different pytest-modelprof versions cannot be merged: {made}")
    session = ModelprofSession(budgets, update=update, prune=prune, strict=strict)
    where: dict[str, Path] = {}
    for shard in shards:
        for name, nodeid, profile in shard.records:
            earlier = session.records.get(name)
            if earlier is None:
                session.record(name, nodeid, profile)
                where[name] = shard.files[name]
            elif earlier.nodeid != nodeid or earlier.profile.to_dict() != profile.to_dict():
                raise ArtifactError(
                    f"{shard.files[name]}: profile {name!r} is also in {where[name]}, {_difference(earlier, nodeid, profile)}: "
                    "two shards ran the same test; merge the artifacts of one run of each shard"
                )
        session.coverage.merge(shard.coverage)
    reason = session.coverage.incomplete()
    if prune and reason is not None:
        session.prune = False
        session.notes.append(f"--prune removed nothing: the shards together did not run the whole collection: {reason}")
    return session


def _difference(earlier: Record, nodeid: str, profile: Profile) -> str:
    if earlier.nodeid != nodeid:
        return f"made there by {earlier.nodeid} and here by {nodeid}"
    for metric in METRICS.values():
        first, second = metric.measure(earlier.profile), metric.measure(profile)
        if first != second:
            return f"with different figures ({metric.key} {first} there, {second} here)"
    return "with different figures"
