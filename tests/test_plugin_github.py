"""In GitHub Actions: a Markdown step summary and annotations at the budget lines."""

from conftest import SMALL_MODEL_TESTS, write_budget

from pytest_modelprof.budgets import REGRESSED, Finding, Verdict
from pytest_modelprof.ci import MAX_ANNOTATIONS, error_annotations, escape_data, escape_property


def test_step_summary_and_annotation(project, monkeypatch):
    summary = project.path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    write_budget(project, '# limits\n[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "::error file=budgets/test_models.toml,line=3,title=test_models.py%3A%3Atest_small%3A params over budget::params: measured 20 params*"
        ]
    )
    text = summary.read_text()
    assert "## Model budgets" in text
    assert "| test_models.py::test_small | 0.000000108 | 20 |" in text
    assert "regressed |" in text


def test_annotations_in_a_monorepo_are_relative_to_the_workspace(pytester, monkeypatch):
    # the checkout (GITHUB_WORKSPACE) holds the project two levels down: GitHub resolves
    # annotation paths against the workspace, not pytest's rootdir
    project = pytester.mkdir("services") / "vision"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (project / "test_models.py").write_text(SMALL_MODEL_TESTS)
    (project / "budgets").mkdir()
    (project / "budgets" / "test_models.toml").write_text('[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(project)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["::error file=services/vision/budgets/test_models.toml,line=2,title=*"])


def test_no_github_output_outside_actions(project, monkeypatch):
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    assert "::error" not in project.runpytest().stdout.str()


def test_escaping():
    assert escape_data("50%\nnext\r") == "50%25%0Anext%0D"
    assert escape_property("a:b,c") == "a%3Ab%2Cc"


def test_annotations_are_capped(tmp_path):
    finding = Finding("params", "max_params", 2, 1, 1, tmp_path / "b.toml", 3, REGRESSED)
    verdicts = [Verdict(f"p{i}", REGRESSED, [finding]) for i in range(MAX_ANNOTATIONS + 5)]
    lines = error_annotations(verdicts, tmp_path)
    assert len(lines) == MAX_ANNOTATIONS + 1
    assert lines[-1] == "::warning::5 more budget regressions; see the job summary"
