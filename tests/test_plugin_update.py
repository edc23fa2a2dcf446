"""--modelprof-update: baselines written atomically, nothing hand-written lost, byte-stable."""

import os
import stat
import subprocess
import sys
import time

from conftest import SMALL_GFLOPS_TEXT, write_budget

from pytest_modelprof.budgets import load_budgets

# inference: the only intermediate tensor is the 3 x 4 output (48 bytes); the peak holds
# 20 weights, a 3 x 4 input and that output, float32: 4 * (20 + 12 + 12) = 176 bytes
MEMORY_BASELINES = "peak_activation_mb = 0.000048\npeak_memory_mb = 0.000176"

HAND_WRITTEN = """\
# Budgets of the small model.
[profiles."test_models.py::test_small"]
max_gflops = 1.0   # generous
max_params = 1_000

[profiles."test_models.py::test_small".baseline]
params = 20   # exact
gflops = 5e-08

[profiles."kept"]
max_gflops = 2.0
"""


def test_update_rewrites_baselines_and_keeps_everything_else(project):
    path = write_budget(project, HAND_WRITTEN)
    result = project.runpytest("--modelprof-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_models.py::test_small * updated", "updated budgets?test_models.toml"])
    assert path.read_text() == HAND_WRITTEN.replace("gflops = 5e-08", f"gflops = {SMALL_GFLOPS_TEXT}\n{MEMORY_BASELINES}")


def test_update_twice_leaves_the_file_byte_identical(project):
    path = write_budget(project, HAND_WRITTEN)
    project.runpytest("--modelprof-update").assert_outcomes(passed=1)
    first = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    project.runpytest("--modelprof-update").assert_outcomes(passed=1)
    assert path.read_bytes() == first
    assert path.stat().st_mtime_ns == mtime  # not even rewritten


def test_update_creates_entries_for_new_profiles(project):
    result = project.runpytest("--modelprof-update")
    result.assert_outcomes(passed=1)
    created = project.path / "budgets" / "test_models.toml"
    assert (
        created.read_text()
        == f'[profiles."test_models.py::test_small".baseline]\ngflops = {SMALL_GFLOPS_TEXT}\nparams = 20\n{MEMORY_BASELINES}\n\n'
    )
    project.runpytest("--modelprof-strict").assert_outcomes(passed=1)


def test_update_does_not_silence_a_ceiling(project):
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    result = project.runpytest("--modelprof-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*params: measured 20 params, allowed 10 params (max_params)*"])


def test_update_with_k_touches_only_what_ran(project):
    project.makepyfile(
        test_models="""
        import torch
        from torch import nn

        def test_small(model_profile):
            model_profile(nn.Linear(4, 4), torch.ones(3, 4))

        def test_other(model_profile):
            model_profile(nn.Linear(2, 2), torch.ones(1, 2))
        """
    )
    path = write_budget(
        project,
        '[profiles."test_models.py::test_small".baseline]\ngflops = 1e-09\n\n[profiles."test_models.py::test_other".baseline]\ngflops = 1e-09\n',
    )
    project.runpytest("--modelprof-update", "-k", "test_small").assert_outcomes(passed=1)
    text = path.read_text()
    assert f"gflops = {SMALL_GFLOPS_TEXT}" in text
    assert text.count("gflops = 1e-09") == 1  # test_other did not run: its baseline stays
    assert "stale" not in project.runpytest("-k", "test_small").stdout.str()


def test_stale_entries_are_listed_and_removed_only_with_prune(project):
    text = f'[profiles."test_models.py::test_small".baseline]\ngflops = {SMALL_GFLOPS_TEXT}\nparams = 20\n\n[profiles."test_models.py::test_removed".baseline]\ngflops = 1.0\n'
    path = write_budget(project, text)
    result = project.runpytest()
    result.stdout.fnmatch_lines(["*test_models.py::test_removed * stale", "*--modelprof-update --modelprof-prune removes them*"])
    project.runpytest("--modelprof-update")
    assert "test_removed" in path.read_text()
    project.runpytest("--modelprof-update", "--modelprof-prune")
    assert "test_removed" not in path.read_text()
    assert "test_small" in path.read_text()


def test_read_only_budget_file_is_refused_and_left_as_it_was(project):
    path = write_budget(project, HAND_WRITTEN)
    path.chmod(stat.S_IRUSR | stat.S_IRGRP)
    try:
        result = project.runpytest("--modelprof-update")
        assert result.ret != 0
        result.stdout.fnmatch_lines(["*could not write baselines: *test_models.toml: is read-only*"])
        assert path.read_text() == HAND_WRITTEN
        assert sorted(p.name for p in path.parent.iterdir()) == ["test_models.toml"]
    finally:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_a_failed_write_leaves_no_half_written_file(project, monkeypatch):
    path = write_budget(project, HAND_WRITTEN)

    def broken_replace(source, destination):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    result = project.runpytest("--modelprof-update")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*could not write baselines: disk full*"])
    assert path.read_text() == HAND_WRITTEN
    assert sorted(p.name for p in path.parent.iterdir()) == ["test_models.toml"]


def test_an_entry_whose_figures_did_not_change_is_reported_unchanged(project):
    write_budget(project, HAND_WRITTEN)
    project.runpytest("--modelprof-update").stdout.fnmatch_lines(["*test_models.py::test_small * updated"])
    again = project.runpytest("--modelprof-update")
    again.stdout.fnmatch_lines(["*test_models.py::test_small * unchanged"])
    assert "updated" not in again.stdout.str()


def test_update_keeps_crlf_line_endings(project):
    path = project.path / "budgets" / "test_models.toml"
    path.write_bytes(HAND_WRITTEN.replace("\n", "\r\n").encode())
    project.runpytest("--modelprof-update").assert_outcomes(passed=1)
    data = path.read_bytes()
    assert f"gflops = {SMALL_GFLOPS_TEXT}\r\n".encode() in data
    assert data.count(b"\n") == data.count(b"\r\n")  # no bare LF added


def test_update_writes_through_a_symlinked_budget_file(project):
    shared = project.path / "shared.toml"
    shared.write_text(HAND_WRITTEN)
    link = project.path / "budgets" / "test_models.toml"
    link.symlink_to(shared)
    project.runpytest("--modelprof-update").assert_outcomes(passed=1)
    assert link.is_symlink() and link.resolve() == shared.resolve()
    assert f"gflops = {SMALL_GFLOPS_TEXT}" in shared.read_text()


KILLED_WRITER = """
import sys
from pathlib import Path
from pytest_modelprof.budgets.write import write_atomically

path, texts = Path(sys.argv[1]), [Path(sys.argv[2]).read_text(), Path(sys.argv[3]).read_text()]
print("ready", flush=True)
turn = 0
while True:
    write_atomically(path, texts[turn % 2])
    print("w", end="", flush=True)  # one byte per finished write
    turn += 1
"""


def test_kill_9_during_updates_leaves_each_file_old_or_new(tmp_path):
    old = "".join(f'[profiles."p{i}".baseline]\ngflops = {i}.5\nparams = {i}\n\n' for i in range(3000))
    new = old.replace(".5\n", ".25\n")
    (tmp_path / "old.txt").write_text(old)
    (tmp_path / "new.txt").write_text(new)
    target = tmp_path / "budgets" / "zoo.toml"
    target.parent.mkdir()
    for delay in (0.03, 0.13, 0.29):
        target.write_text(old)
        before = target.stat().st_mtime_ns
        writer = subprocess.Popen(
            [sys.executable, "-c", KILLED_WRITER, str(target), str(tmp_path / "new.txt"), str(tmp_path / "old.txt")], stdout=subprocess.PIPE
        )
        assert writer.stdout.readline() == b"ready\n"
        assert writer.stdout.read(1) == b"w"  # the writer is writing: the kill lands among its writes
        assert target.stat().st_mtime_ns > before  # and its first write (the new text) replaced the file
        time.sleep(delay)
        writer.kill()  # SIGKILL: no cleanup runs
        writer.wait()
        writer.stdout.close()
        assert target.read_text() in (old, new)
    load_budgets(target.parent)  # loads: leftover temporary files are not *.toml
