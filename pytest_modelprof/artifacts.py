"""The JSON artifacts of a session (``--modelprof-json DIR``, ``modelprof merge -o DIR``): one
file per profile and ``session.json``, written as the shipped schema describes and read back
validated against it, every fault named by its file."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .budgets import Budgets, Verdict
from .budgets.load import shown_path
from .results import Profile

SCHEMA_VERSION = 2  # of the JSON artifacts (session.json and one file per profile)


def project_version() -> str:
    """This package's version, recorded in the artifacts: shards made by different versions are not merged."""
    try:
        return importlib.metadata.version("pytest-modelprof")
    except importlib.metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown"


def artifact_name(name: str) -> str:
    """A file name for a profile: readable, safe on every OS, and distinct for distinct names."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:80] or "profile"
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{readable}-{digest}.json"


def write_artifacts(
    directory: Path,
    records: Sequence[tuple[str, str, Profile, Verdict]],
    verdicts: Sequence[Verdict],
    *,
    coverage: dict[str, Any],
    budgets: Budgets,
    stale: list[str],
    written: list[Path],
) -> None:
    """One JSON file per profile of ``records`` (name, node id, profile, verdict; in the order
    given) and ``session.json``: the coverage, the budget directory, the profiles' files, the
    stale entries, the count of ``verdicts`` by status and the budget files ``written``."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, nodeid, profile, verdict in records:
        file = artifact_name(name)
        document = {
            "schema_version": SCHEMA_VERSION,
            "name": name,
            "nodeid": nodeid,
            "status": verdict.status,
            "budget": _where(verdict),
            "findings": [_finding(f) for f in verdict.findings],
            "notes": verdict.notes,
            "profile": profile.to_dict(),
        }
        (directory / file).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        entries.append({"name": name, "status": verdict.status, "file": file})
    counts: dict[str, int] = {}
    for verdict in verdicts:
        counts[verdict.status] = counts.get(verdict.status, 0) + 1
    summary = {
        "schema_version": SCHEMA_VERSION,
        "modelprof_version": project_version(),
        "coverage": coverage,
        "budgets": shown_path(budgets.directory, budgets.root).as_posix(),
        "profiles": entries,
        "stale": stale,
        "counts": counts,
        "updated_files": [str(shown_path(p, budgets.root)) for p in written],
    }
    (directory / "session.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")


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


# reading artifacts back: merging the shards of a matrix, comparing base and head ---------


class ArtifactError(ValueError):
    """An artifact directory or file that cannot be read or merged; the message names the file."""


@dataclass
class Artifacts:
    """One session's JSON artifacts (``--modelprof-json DIR``), read back and validated."""

    directory: Path
    version: str  # the pytest-modelprof version that wrote them
    budgets: str  # the budget directory, relative to the rootdir
    coverage: dict[str, Any]
    records: list[tuple[str, str, Profile]] = field(default_factory=list)  # name, node id, profile
    files: dict[str, Path] = field(default_factory=dict)  # profile name -> its file


@functools.cache
def _validator(name: str) -> Any:
    import jsonschema  # a dependency, imported when artifacts are read back (not by every pytest run)

    schema = json.loads(resources.files(__package__).joinpath("schema", name).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def _parse(path: Path) -> Any:
    """The JSON document in ``path``; raises ArtifactError naming the file (and the line and column of bad JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{path}: cannot be read: {error}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ArtifactError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None


def read_json(path: Path, schema: str) -> dict[str, Any]:
    """A JSON artifact, validated against the shipped ``schema``; raises ArtifactError naming the file."""
    document = _parse(path)
    if isinstance(document, dict) and document.get("schema_version") != SCHEMA_VERSION:
        found = document.get("schema_version")
        raise ArtifactError(
            f"{path}: artifacts of schema version {found!r}, this pytest-modelprof ({project_version()}) reads version "
            f"{SCHEMA_VERSION}: make them again with this version"
        )
    import jsonschema

    problem = jsonschema.exceptions.best_match(_validator(schema).iter_errors(document))
    if problem is not None:
        where = problem.json_path if problem.path else "the document"
        raise ArtifactError(f"{path}: not a pytest-modelprof {schema.partition('.')[0]} artifact: at {where}: {problem.message[:200]}")
    return document  # type: ignore[no-any-return]


def read_artifacts(directory: Path) -> Artifacts:
    """The artifacts one session wrote into ``directory``: ``session.json`` and the profile files it lists.

    Every other ``*.json`` file there must be valid JSON too (a profile file of an earlier run
    is, and is left out): a damaged one means the directory is not what a run left, and it is
    refused, named, rather than passed over."""
    if not directory.is_dir():
        raise ArtifactError(f"{directory}: not a directory of pytest-modelprof artifacts (--modelprof-json DIR)")
    session = read_json(directory / "session.json", "session.schema.json")
    artifacts = Artifacts(directory, session["modelprof_version"], session["budgets"], session["coverage"])
    for entry in session["profiles"]:
        path = directory / entry["file"]
        document = read_json(path, "profile.schema.json")
        if document["name"] != entry["name"]:
            raise ArtifactError(f"{path}: holds profile {document['name']!r}, session.json lists it as {entry['name']!r}")
        try:
            profile = Profile.from_dict(document["profile"])
        except (TypeError, ValueError, KeyError) as error:
            raise ArtifactError(f"{path}: the profile cannot be read: {type(error).__name__}: {error}") from None
        artifacts.records.append((document["name"], document["nodeid"], profile))
        artifacts.files[document["name"]] = path
    listed = {directory / "session.json", *artifacts.files.values()}
    for path in sorted(directory.glob("*.json")):
        if path not in listed:
            try:
                _parse(path)
            except ArtifactError as error:
                raise ArtifactError(f"{error} (session.json does not list it: remove it, or make the artifacts again)") from None
    return artifacts
