"""``modelprof compare BASE HEAD``: each profile's metrics on both sides, the change in % and
absolute, new and removed profiles, and ``--fail-on`` rules that turn chosen changes into exit 1."""

from __future__ import annotations

import io
import json
import math
import re

import pytest
import torch
from torch import nn

from pytest_modelprof import profile
from pytest_modelprof.cli import main
from pytest_modelprof.compare import CHANGED, NEW, REMOVED, UNCHANGED, Change, ProfileChange, compare, parse_fail_on
from pytest_modelprof.metrics import METRICS

BATCH, IN = 4, 64
VERSION = """
import torch
from torch import nn

def test_projection(model_profile):
    model_profile(nn.Linear({IN}, {out}, bias=False), torch.ones({BATCH}, {IN}), device="meta")

def test_{extra}(model_profile):
    model_profile(nn.Linear(8, 8, bias=False), torch.ones(1, 8), device="meta")
"""


def linear(out: int):
    return profile(nn.Linear(IN, out, bias=False), torch.ones(BATCH, IN), device="meta")


def test_changes_are_measured_against_the_base_in_percent_and_absolute():
    base = {"a": linear(128), "b": linear(64), "gone": linear(8)}
    head = {"a": linear(192), "b": linear(64), "fresh": linear(8)}
    rows = {row.name: row for row in compare(base, head)}
    assert {name: row.status for name, row in rows.items()} == {"a": CHANGED, "b": UNCHANGED, "gone": REMOVED, "fresh": NEW}
    gflops = rows["a"].changes["gflops"]
    assert gflops.base == 2 * BATCH * IN * 128 / 1e9 and gflops.head == 2 * BATCH * IN * 192 / 1e9  # a product: 2 FLOPs per MAC
    assert gflops.absolute == pytest.approx(2 * BATCH * IN * 64 / 1e9)
    assert gflops.relative == pytest.approx(0.5)
    assert rows["a"].changes["params"].relative == pytest.approx(0.5)
    assert rows["gone"].changes["gflops"].head is None and rows["gone"].changes["gflops"].relative is None
    # new and removed first, then the largest change, then the unchanged
    assert [row.name for row in compare(base, head)] == ["fresh", "gone", "a", "b"]


@pytest.mark.parametrize(
    ("rule", "fails"),
    [
        ("gflops:+1%", True),
        ("gflops:+50%", False),
        ("gflops:+49.9%", True),
        ("gflops:-1%", False),
        ("params:+4095", True),
        ("params:+4096", False),
    ],
)
def test_a_fail_on_rule_fails_a_change_beyond_its_amount(rule, fails):
    row = next(r for r in compare({"a": linear(128)}, {"a": linear(192)}) if r.name == "a")  # +50%, +4096 params
    assert (parse_fail_on(rule).failure(row) is not None) is fails


def test_a_failure_shows_the_change_in_plain_notation():
    row = next(r for r in compare({"a": linear(128)}, {"a": linear(192)}) if r.name == "a")
    # 2·4·64·64 = 32,768 more FLOPs: 0.000032768 GFLOPs, at the table's 4 significant digits
    assert parse_fail_on("gflops:+1%").failure(row) == "a: gflops 0.00006554 -> 0.0000983 GFLOPs, +0.00003277, +50.00% (gflops:+1%)"


def test_a_decrease_rule_and_the_new_and_removed_rules():
    rows = compare({"a": linear(192), "gone": linear(8)}, {"a": linear(128), "fresh": linear(8)})
    assert [r.name for r in rows if parse_fail_on("gflops:-30%").failure(r)] == ["a"]  # -33%
    assert [r.name for r in rows if parse_fail_on("removed").failure(r)] == ["gone"]
    assert [r.name for r in rows if parse_fail_on("new").failure(r)] == ["fresh"]


def test_a_base_of_zero_is_an_infinite_change():
    row = ProfileChange("a", CHANGED, {"gflops": Change(METRICS["gflops"], 0.0, 1e-6)})
    assert row.changes["gflops"].relative == math.inf and row.largest == math.inf
    assert parse_fail_on("gflops:+1000%").failure(row) is not None
    assert Change(METRICS["gflops"], 0.0, 0.0).relative == 0.0


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("flops:+1%", "unknown metric 'flops'"),
        ("gflops:1%", "expected METRIC:+N%"),
        ("gflops:+1MB", "gflops is in GFLOPs, got 'MB'"),
        ("calibration_ms:+1%", "unknown metric"),  # a reference, not a limit
    ],
)
def test_a_bad_rule_says_what_was_expected(rule, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_fail_on(rule)


@pytest.fixture
def base_and_head(pytester):
    """Two artifact sets from two versions of a small model: the projection widens from 128 to 192."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_models=VERSION.format(IN=IN, BATCH=BATCH, out=128, extra="kept"))
    pytester.runpytest("--modelprof-json", "base").assert_outcomes(passed=2)
    pytester.makepyfile(test_models=VERSION.format(IN=IN, BATCH=BATCH, out=192, extra="added"))
    pytester.runpytest("--modelprof-json", "head").assert_outcomes(passed=2)
    return pytester.path


def run(directory, *args, monkeypatch):
    out = io.StringIO()
    with monkeypatch.context() as patch:
        patch.chdir(directory)
        status = main(["compare", *args], out)
    return status, out.getvalue()


def test_compare_shows_the_changed_metrics_and_fails_on_request(base_and_head, monkeypatch):
    status, output = run(base_and_head, "base", "head", "--markdown", "comparison.md", monkeypatch=monkeypatch)
    assert status == 0
    projection = next(line for line in output.splitlines() if line.startswith("test_models.py::test_projection"))
    assert "0.00006554 → 0.0000983 (+0.00003277, +50.00%)" in " ".join(projection.split())  # 2·4·64·128 → 2·4·64·192 FLOPs
    assert "8,192 → 12,288 (+4,096, +50.00%)" in projection and projection.endswith("changed")
    assert "1 changed, 1 new, 1 removed, 0 unchanged" in output
    markdown = (base_and_head / "comparison.md").read_text()
    assert markdown.startswith("## Model budgets: base vs head\n")
    assert "| test_models.py::test_projection | 0.00006554 → 0.0000983 (+0.00003277, +50.00%) |" in markdown
    status, output = run(base_and_head, "base", "head", "--fail-on", "gflops:+1%", monkeypatch=monkeypatch)
    assert status == 1
    assert "FAILED --fail-on test_models.py::test_projection: gflops" in output and "+50.00% (gflops:+1%)" in output
    assert run(base_and_head, "base", "head", "--fail-on", "gflops:+60%,params:+60%", monkeypatch=monkeypatch)[0] == 0
    assert run(base_and_head, "base", "head", "--fail-on", "removed", monkeypatch=monkeypatch)[0] == 1


def damage_a_profile(directory):
    session = json.loads((directory / "session.json").read_text())
    return directory / session["profiles"][0]["file"]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda path: path.write_text(path.read_text()[:-40]), r":\d+:\d+: not valid JSON"),
        (lambda path: path.unlink(), ": no such file"),
        (
            lambda path: path.write_text(path.read_text().replace('"schema_version": 2', '"schema_version": 3')),
            ": artifacts of schema version 3",
        ),
        (lambda path: path.write_text(path.read_text().replace('"nodeid"', '"node"')), ": not a pytest-modelprof profile artifact"),
    ],
    ids=["truncated", "missing", "newer-schema", "not-a-profile"],
)
def test_a_corrupt_or_mismatched_artifact_is_a_one_line_error_naming_the_file(base_and_head, monkeypatch, capsys, damage, expected):
    path = damage_a_profile(base_and_head / "head")
    damage(path)
    status, _ = run(base_and_head, "base", "head", monkeypatch=monkeypatch)
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1
    assert error.startswith(f"modelprof: error: head/{path.name}")
    assert re.search(re.escape(path.name) + expected, error)


def test_compare_needs_artifact_directories(base_and_head, monkeypatch, capsys):
    status, _ = run(base_and_head, "base", "nowhere", monkeypatch=monkeypatch)
    assert status == 2
    assert capsys.readouterr().err == "modelprof: error: nowhere: not a directory of pytest-modelprof artifacts (--modelprof-json DIR)\n"


def test_a_damaged_json_file_that_session_json_does_not_list_is_refused_naming_it(base_and_head, monkeypatch, capsys):
    (base_and_head / "head" / "stray.json").write_text('{"name": "half a fi')
    status, _ = run(base_and_head, "base", "head", monkeypatch=monkeypatch)
    assert status == 2
    assert capsys.readouterr().err == (
        "modelprof: error: head/stray.json:1:10: not valid JSON: Unterminated string starting at "
        "(session.json does not list it: remove it, or make the artifacts again)\n"
    )


def test_a_valid_json_file_that_session_json_does_not_list_is_left_out(base_and_head, monkeypatch):
    (base_and_head / "head" / "notes.json").write_text('{"written by": "someone else"}')
    status, output = run(base_and_head, "base", "head", monkeypatch=monkeypatch)
    assert status == 0 and "1 changed, 1 new, 1 removed, 0 unchanged" in output
