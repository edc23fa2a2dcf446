"""--modelprof-json: one file per profile and a session summary, valid against the shipped schema."""

import json
from importlib import resources

import jsonschema
from conftest import write_budget

from pytest_modelprof.artifacts import artifact_name


def schema(name):
    return json.loads(resources.files("pytest_modelprof").joinpath("schema", name).read_text())


def validate(document, name):
    validator = jsonschema.Draft202012Validator(schema(name))
    validator.check_schema(validator.schema)
    validator.validate(document)


def test_artifacts_match_the_schema(pytester):
    pytester.makepyfile(
        test_models="""
        import pytest, torch
        from torch import nn

        @pytest.mark.parametrize("case", ["a/b", "a_b", "../../etc/passwd"])
        def test_named(model_profile, case):
            model_profile(nn.Linear(4, 4), torch.ones(3, 4))
            model_profile(nn.LSTM(4, 4), torch.ones(2, 1, 4), train=True)
        """
    )
    pytester.mkdir("budgets")
    write_budget(
        pytester, '[profiles."test_models.py::test_named[a_b]"]\nmax_params = 1\n\n[profiles."test_models.py::test_gone"]\nmax_params = 1\n'
    )
    result = pytester.runpytest("--modelprof-json", "artifacts")
    result.assert_outcomes(passed=2, failed=1)
    out = pytester.path / "artifacts"
    session = json.loads((out / "session.json").read_text())
    validate(session, "session.schema.json")
    assert session["counts"] == {"new": 5, "regressed": 1, "stale": 1}
    assert session["stale"] == ["test_models.py::test_gone"]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 7  # six profiles, one summary: no collisions
    for entry in session["profiles"]:
        document = json.loads((out / entry["file"]).read_text())
        validate(document, "profile.schema.json")
        assert document["name"] == entry["name"]
    regressed = next(e for e in session["profiles"] if e["status"] == "regressed")
    document = json.loads((out / regressed["file"]).read_text())
    assert document["findings"][0]["metric"] == "params"
    assert document["budget"]["line"] == 1


def test_artifact_names_are_safe_and_distinct():
    names = ["t.py::test[a/b]", "t.py::test[a_b]", "t.py::test[a?b]", "../../x", "t.py::" + "x" * 300, "C:\\evil"]
    files = [artifact_name(n) for n in names]
    assert len(set(files)) == len(files)
    for file in files:
        assert "/" not in file and "\\" not in file and not file.startswith(".")
        assert len(file) < 120
