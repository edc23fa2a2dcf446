"""A suite split over the shards of a CI matrix (pytest-split, each shard under pytest-xdist),
merged with ``modelprof merge``: one summary and one verdict as one run, one baseline write of
the same bytes, and no pruning unless the shards together ran the whole collection.

The runs are subprocesses, made once for the module: each shard in its own copy of the
project, as each job of a matrix has its own checkout.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_split  # noqa: F401  (the shards run under it and xdist, which the test extra installs:
import xdist  # noqa: F401  a broken install fails here, it does not skip)

from pytest_modelprof.cli import main

SHARDS = 3

MLPS = """
import pytest, torch
from torch import nn

@pytest.mark.parametrize("width", [8, 16, 24, 32])
def test_mlp(model_profile, width):
    model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
    model_profile(model, torch.ones(2, width), device="meta", train=True)
"""

CONVS = """
import pytest, torch
from torch import nn

@pytest.mark.parametrize("channels", [3, 4, 5, 6])
def test_conv(model_profile, channels):
    model_profile(nn.Conv2d(channels, 8, 3), torch.ones(1, channels, 16, 16), device="meta")
"""

BUDGETS = """\
# budgets of the MLPs, kept by hand
[profiles."test_mlps.py::test_mlp[8]"]
max_params = 10  # too low: this profile regresses

[profiles."test_mlps.py::test_mlp[16]".baseline]
gflops = 1.0  # far above the figure: improved, and rewritten by an update

[profiles."test_mlps.py::test_gone"]  # no test makes it: stale
max_params = 1
"""


def pytest_run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=project, capture_output=True, text=True, check=False
    )


def modelprof(project: Path, *args: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """``modelprof ARGS`` run in ``project`` (in this process); its exit status and output."""
    out = io.StringIO()
    with monkeypatch.context() as patch:
        patch.chdir(project)
        patch.delenv("GITHUB_ACTIONS", raising=False)
        status = main(list(args), out)
    return status, out.getvalue()


def budgets_section(output: str) -> list[str]:
    """The lines of pytest's "model budgets" section."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("=") and " model budgets " in line) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("="))
    return lines[start:end]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project, one unsharded run of it (``whole``), one unsharded update (``updated``), and
    the shards' artifacts (``artifacts/shard<i>``) from their own checkouts under ``-n 2``."""
    root = tmp_path_factory.mktemp("zoo")
    project = root / "project"
    (project / "budgets").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_mlps.py").write_text(MLPS)
    (project / "test_convs.py").write_text(CONVS)
    (project / "budgets" / "test_mlps.toml").write_text(BUDGETS)
    whole = pytest_run(project, "--modelprof-json", str(root / "artifacts" / "whole"))
    assert whole.returncode == 1, whole.stdout + whole.stderr  # the regressed profile
    (root / "whole.txt").write_text(whole.stdout)
    shutil.copytree(project, root / "updated")
    assert pytest_run(root / "updated", "--modelprof-update", "--modelprof-prune").returncode == 1
    for group in range(1, SHARDS + 1):
        checkout = root / f"shard{group}"
        shutil.copytree(project, checkout)
        shard = pytest_run(
            checkout,
            *("--splits", str(SHARDS), "--group", str(group), "-n", "2"),
            *("--modelprof-update", "--modelprof-json", str(root / "artifacts" / f"shard{group}")),
        )
        assert shard.returncode in (0, 1), shard.stdout + shard.stderr
    return root


def shard_directories(zoo: Path, groups: range = range(1, SHARDS + 1)) -> list[str]:
    return [str(zoo / "artifacts" / f"shard{group}") for group in groups]


def test_each_shard_records_what_it_collected_and_what_it_ran(zoo):
    selected: set[str] = set()
    for directory in shard_directories(zoo):
        coverage = json.loads((Path(directory) / "session.json").read_text())["coverage"]
        assert len(coverage["collected"]) == 8 and not coverage["stopped"]
        assert 0 < len(coverage["selected"]) < 8
        assert not selected & set(coverage["selected"])
        selected |= set(coverage["selected"])
    assert len(selected) == 8


def test_merged_shards_give_the_summary_and_verdicts_of_one_run(zoo, monkeypatch):
    project = zoo / "project"
    status, output = modelprof(project, "merge", *shard_directories(zoo), "-o", str(zoo / "artifacts" / "merged"), monkeypatch=monkeypatch)
    assert status == 1  # as the unsharded run: one profile over its ceiling
    summary = output.splitlines()[1:-1]  # after the title, before "wrote DIR"
    assert summary == budgets_section((zoo / "whole.txt").read_text())
    assert any(line.endswith("regressed") for line in summary) and any(line.endswith("stale") for line in summary)
    merged, whole = zoo / "artifacts" / "merged", zoo / "artifacts" / "whole"
    assert sorted(p.name for p in merged.iterdir()) == sorted(p.name for p in whole.iterdir())
    for path in whole.iterdir():
        assert (merged / path.name).read_text() == path.read_text(), path.name


def test_a_merged_update_writes_the_bytes_of_one_update(zoo, monkeypatch, tmp_path):
    checkout = tmp_path / "checkout"
    shutil.copytree(zoo / "project", checkout)
    status, output = modelprof(checkout, "merge", *shard_directories(zoo), "--update", "--prune", monkeypatch=monkeypatch)
    assert status == 1, output
    written = sorted(p.name for p in (checkout / "budgets").iterdir())
    assert written == sorted(p.name for p in (zoo / "updated" / "budgets").iterdir()) == ["test_convs.toml", "test_mlps.toml"]
    for name in written:
        assert (checkout / "budgets" / name).read_bytes() == (zoo / "updated" / "budgets" / name).read_bytes()
    assert "test_gone" not in (checkout / "budgets" / "test_mlps.toml").read_text()


def test_a_merged_prune_with_a_missing_shard_removes_nothing_and_says_why(zoo, monkeypatch, tmp_path):
    checkout = tmp_path / "checkout"
    shutil.copytree(zoo / "project", checkout)
    present = shard_directories(zoo, range(1, SHARDS))  # the last shard's artifacts are missing
    status, output = modelprof(checkout, "merge", *present, "--update", "--prune", monkeypatch=monkeypatch)
    text = (checkout / "budgets" / "test_mlps.toml").read_text()
    assert '[profiles."test_mlps.py::test_gone"]' in text
    assert "--prune removed nothing: the shards together did not run the whole collection" in output
    missing = json.loads((zoo / "artifacts" / f"shard{SHARDS}" / "session.json").read_text())["coverage"]["selected"]
    assert status == (0 if "test_mlps.py::test_mlp[8]" in missing else 1)  # the regressed profile, where it ran
    assert f"{len(missing)} of the 8 collected tests were not selected" in output
    assert "stale" not in output.split("--prune")[0]  # an incomplete merge calls nothing stale


def copy_artifacts(zoo: Path, tmp_path: Path) -> list[Path]:
    copies = []
    for directory in shard_directories(zoo):
        copies.append(tmp_path / Path(directory).name)
        shutil.copytree(directory, copies[-1])
    return copies


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("modelprof: error: "), error
    return error


def test_merge_refuses_shards_of_different_versions(zoo, monkeypatch, tmp_path, capsys):
    shards = copy_artifacts(zoo, tmp_path)
    session = json.loads((shards[1] / "session.json").read_text())
    session["modelprof_version"] = "0.0.1"
    (shards[1] / "session.json").write_text(json.dumps(session))
    status, _ = modelprof(zoo / "project", "merge", *map(str, shards), monkeypatch=monkeypatch)
    assert status == 2
    assert "different pytest-modelprof versions" in one_line_error(capsys)


def test_merge_refuses_one_profile_with_two_sets_of_figures(zoo, monkeypatch, tmp_path, capsys):
    first, second, _ = copy_artifacts(zoo, tmp_path)
    session = json.loads((first / "session.json").read_text())
    entry = session["profiles"][0]
    document = json.loads((first / entry["file"]).read_text())
    document["profile"]["forward_flops"] += 2  # as if the other shard had measured it otherwise
    (second / entry["file"]).write_text(json.dumps(document))
    listing = json.loads((second / "session.json").read_text())
    listing["profiles"].append(entry)
    (second / "session.json").write_text(json.dumps(listing))
    status, _ = modelprof(zoo / "project", "merge", str(first), str(second), monkeypatch=monkeypatch)
    assert status == 2
    error = one_line_error(capsys)
    assert f"{second / entry['file']}: profile {entry['name']!r} is also in {first / entry['file']}" in error
    assert "gflops" in error
    # the same figures in two shards are one profile
    (second / entry["file"]).write_text((first / entry["file"]).read_text())
    status, _ = modelprof(zoo / "project", "merge", str(first), str(second), monkeypatch=monkeypatch)
    assert status == 1


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda text: text[: len(text) // 2], r"session.json:\d+:\d+: not valid JSON"),
        (lambda text: text.replace('"schema_version": 2', '"schema_version": 1'), "session.json: artifacts of schema version 1"),
        (lambda text: text.replace('"coverage"', '"covered"'), "session.json: not a pytest-modelprof session artifact"),
    ],
    ids=["truncated", "older-schema", "not-a-session"],
)
def test_a_damaged_artifact_is_a_one_line_error_naming_the_file(zoo, monkeypatch, tmp_path, capsys, damage, expected):
    shards = copy_artifacts(zoo, tmp_path)
    session = shards[2] / "session.json"
    session.write_text(damage(session.read_text()))
    status, _ = modelprof(zoo / "project", "merge", *map(str, shards), monkeypatch=monkeypatch)
    assert status == 2
    assert re.search(re.escape(str(shards[2])) + "/" + expected, one_line_error(capsys))


def test_under_github_actions_the_merge_writes_one_step_summary_and_the_annotations(zoo, monkeypatch, tmp_path):
    summary = tmp_path / "summary.md"
    out = io.StringIO()
    with monkeypatch.context() as patch:
        patch.chdir(zoo / "project")
        patch.setenv("GITHUB_ACTIONS", "true")
        patch.setenv("GITHUB_STEP_SUMMARY", str(summary))
        patch.setenv("GITHUB_WORKSPACE", str(zoo / "project"))
        assert main(["merge", *shard_directories(zoo)], out) == 1
    text = summary.read_text()
    assert text.startswith("## Model budgets\n") and text.count("## Model budgets") == 1
    assert sum(line.startswith("| test_") for line in text.splitlines()) == 9  # 8 profiles and the stale entry
    assert "::error file=budgets/test_mlps.toml,line=3," in out.getvalue()  # at the ceiling that the profile is over
