"""Bad budget files: a clear error naming the file, the line and what was expected."""

import os
import pathlib
from pathlib import Path

import pytest
from conftest import write_budget

PROFILE = '[profiles."test_models.py::test_small"]\n'


@pytest.mark.parametrize(
    "text, expected",
    [
        (PROFILE + "max_gflops = [1,\n", "*test_models.toml:2: not valid TOML*"),
        (PROFILE + "max_gflop = 1.0\n", "*test_models.toml:2: unknown key 'max_gflop' *; did you mean 'max_gflops'?*"),
        (
            PROFILE + "tolerance = '2%'\n[profiles.\"test_models.py::test_small\".baseline]\nparms = 3\n",
            "*test_models.toml:4: unknown key 'parms'*did you mean 'params'?*",
        ),
        (PROFILE + "max_gflops = '4'\n", "*test_models.toml:2: max_gflops must be a finite, non-negative number, got '4'*"),
        (PROFILE + "max_gflops = -1.0\n", "*test_models.toml:2: max_gflops must be a finite, non-negative number, got -1.0*"),
        (PROFILE + "max_gflops = nan\n", "*test_models.toml:2: max_gflops must be a finite, non-negative number, got nan*"),
        (PROFILE + "max_params = inf\n", "*test_models.toml:2: max_params must be a finite, non-negative number, got inf*"),
        (PROFILE + "max_latency_ms = { gpu = 3.0 }\n", "*test_models.toml:2: unknown key 'gpu' in max_latency_ms; did you mean 'cpu'?*"),
        (PROFILE + 'tolerance = "two percent"\n', '*test_models.toml:2: a tolerance for every metric must be a percentage such as "2%"*'),
        (
            PROFILE + 'tolerance = { gflops = "5 MB" }\n',
            '*test_models.toml:2: tolerance for gflops: expected a percentage such as "2%" or an amount such as "1.5 GFLOPs", got \'5 MB\'*',
        ),
        ('[profile."x"]\nmax_gflops = 1.0\n', "*test_models.toml:1: unknown key 'profile' at the top level; did you mean 'profiles'?*"),
    ],
    ids=[
        "malformed",
        "unknown-key",
        "unknown-baseline-key",
        "wrong-type",
        "negative",
        "nan",
        "infinite",
        "unknown-device",
        "tolerance-format",
        "tolerance-unit",
        "top-level",
    ],
)
def test_bad_budget_file(project, text, expected):
    path = write_budget(project, text)
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert path.read_text() == text


def test_budget_directory_that_does_not_exist(project):
    result = project.runpytest("--modelprof-budgets", "nowhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*nowhere: the budget directory does not exist*"])


def test_budget_directory_from_ini(project):
    project.makeini("[pytest]\nmodelprof_budgets = limits\n")
    (project.path / "limits").mkdir()
    (project.path / "limits" / "a.toml").write_text('[profiles."test_models.py::test_small"]\nmax_params = 1\n')
    project.runpytest().assert_outcomes(failed=1)
    project.runpytest("--modelprof-budgets", "budgets").assert_outcomes(passed=1)  # the command line wins


def test_profile_defined_in_two_files(project):
    write_budget(project, PROFILE + "max_params = 100\n", name="a.toml")
    write_budget(project, "# second\n" + PROFILE + "max_params = 200\n", name="b.toml")
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*b.toml:2: profile 'test_models.py::test_small' is also defined at *a.toml:1; each profile belongs in one file*"]
    )


def _not_utf8(budgets):
    (budgets / "latin1.toml").write_bytes(PROFILE.encode() + "# caf\xe9\n".encode("latin-1"))


def _directory(budgets):
    (budgets / "old.toml").mkdir()


def _loop(budgets):
    (budgets / "loop.toml").symlink_to(budgets / "loop.toml")


def _dangling(budgets):
    (budgets / "gone.toml").symlink_to(budgets / "moved-away.toml")


def _huge_integer(budgets):
    (budgets / "huge.toml").write_text(PROFILE + "max_gflops = 1" + "0" * 400 + "\n")


def _array_of_tables(budgets):
    (budgets / "array.toml").write_text("# profiles as an array\n[[profiles]]\nname = 'x'\n")


def _array_of_baselines(budgets):
    (budgets / "array.toml").write_text(PROFILE + 'max_params = 10\n\n[[profiles."test_models.py::test_small".baseline]]\nparams = 3\n')


@pytest.mark.parametrize(
    "make, expected",
    [
        (_not_utf8, "*latin1.toml:2: is not UTF-8 text (byte 0xe9); budget files are UTF-8 TOML"),
        (_directory, "*old.toml: is a directory; expected a budget file*"),
        (_loop, "*loop.toml: is a symlink loop; expected a budget file (*.toml)"),
        (_dangling, "*gone.toml: is a symlink to *moved-away.toml, which does not exist; expected a budget file"),
        (
            _huge_integer,
            "*huge.toml:2: max_gflops must be a finite, non-negative number, got an integer of 401 digits, too large for a float",
        ),
        (_array_of_tables, "*array.toml:2: 'profiles' must be a table of [[]profiles.\"<name>\"[]] tables"),
        (_array_of_baselines, "*array.toml:4: 'baseline' must be a table of metric = value, got a list"),
    ],
    ids=["not-utf8", "directory", "symlink-loop", "dangling-symlink", "huge-integer", "array-of-tables", "array-of-baselines"],
)
def test_bad_budget_directory_entry_is_one_line_naming_it(project, make, expected):
    make(project.path / "budgets")
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-modelprof: " + expected.lstrip("*")] if not expected.startswith("*") else [expected])
    assert len([line for line in result.stderr.lines if line.strip()]) == 1
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_unreadable_budget_file(project, monkeypatch):
    path = write_budget(project, PROFILE + "max_params = 10\n")
    read_bytes = pathlib.Path.read_bytes

    def refuse(self):  # chmod 0 does not stop root, so the refusal is simulated
        if self == path:
            raise PermissionError(13, "Permission denied")
        return read_bytes(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", refuse)
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_models.toml: cannot be read: Permission denied"])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--modelprof-json", "taken.json"], "*--modelprof-json taken.json: is a file; expected a directory for the JSON artifacts"),
        (
            ["--modelprof-json", "taken.json/out"],
            "*--modelprof-json taken.json/out: *taken.json is a file, so the directory cannot be made",
        ),
        (["--modelprof-device", "tpu"], "*--modelprof-device: unknown device 'tpu': expected cpu, cuda, cuda:N or meta (analytic)"),
        (["--modelprof-device", "cuda:x"], "*--modelprof-device: unknown device 'cuda:x': expected cpu, cuda, cuda:N or meta (analytic)"),
        (["--modelprof-device", "mps"], "*--modelprof-device: unsupported device 'mps': expected cpu, cuda, cuda:N or meta (analytic)"),
    ],
    ids=["json-is-a-file", "json-below-a-file", "unknown-device", "bad-device-index", "unsupported-device"],
)
def test_bad_options_are_usage_errors_before_any_test_runs(project, args, expected):
    (project.path / "taken.json").write_text("{}")
    result = project.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert "test_models.py" not in result.stdout.str()  # nothing ran
    assert (project.path / "taken.json").read_text() == "{}"


def test_json_below_an_unwritable_directory_is_a_usage_error(project, monkeypatch):
    locked = project.path / "locked"
    locked.mkdir()
    real_access = os.access
    # chmod does not stop root: the refusal is simulated where the plugin asks
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == locked else real_access(path, mode))
    result = project.runpytest("--modelprof-json", "locked/artifacts")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--modelprof-json locked/artifacts: *locked is not writable"])
