"""Verdicts: a profile over budget fails the test that made it, with one readable message."""

from conftest import SMALL_GFLOPS, write_budget


def test_over_ceiling_fails_the_test_itself(project):
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    result = project.runpytest()
    result.assert_outcomes(failed=1)  # a failure of the test, not an error in teardown
    result.stdout.fnmatch_lines(
        [
            "*profile 'test_models.py::test_small' is over its budget:",
            "*params: measured 20 params, allowed 10 params (max_params): +100.00% (+10 params) [[]*budgets/test_models.toml:2[]]",
        ]
    )
    result.stdout.fnmatch_lines(["*test_models.py::test_small *regressed"])


def test_a_ceiling_failure_says_to_edit_the_ceiling_not_to_update(project):
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    result = project.runpytest()
    result.stdout.fnmatch_lines(
        [
            "  params: measured 20 params, allowed 10 params (max_params): +100.00% (+10 params) [[]budgets/test_models.toml:2[]]",
            "  max_params is a hand-written ceiling: raise it at budgets/test_models.toml:2 if the increase is intended, or fix the model",
        ]
    )
    assert "record it as the new baseline" not in result.stdout.str()
    assert not [line for line in result.stdout.lines if str(project.path) in line and not line.startswith("rootdir:")]


def test_messages_name_the_budget_file_relative_to_the_rootdir_from_a_subdirectory(project, monkeypatch):
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    (project.path / "sub").mkdir()
    monkeypatch.chdir(project.path / "sub")
    result = project.runpytest("--rootdir", str(project.path), str(project.path / "test_models.py"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*(max_params): +100.00% (+10 params) [[]budgets/test_models.toml:2[]]"])


def test_worse_than_baseline_beyond_tolerance(project):
    baseline = SMALL_GFLOPS / 1.05  # the model now costs 5% more
    write_budget(
        project,
        f'# hand-written\n[profiles."test_models.py::test_small"]\ntolerance = "2%"\n\n'
        f'[profiles."test_models.py::test_small".baseline]\ngflops = {baseline!r}\nparams = 20\n',
    )
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*gflops: measured 0.000000108 GFLOPs, allowed * (baseline * + 2%): +5.00% (+* GFLOPs) vs baseline [[]*test_models.toml:6[]]"]
    )
    result.stdout.fnmatch_lines(["*pytest --modelprof-update*"])


def test_within_tolerance_passes(project):
    write_budget(
        project,
        f'[profiles."test_models.py::test_small"]\ntolerance = "2%"\n[profiles."test_models.py::test_small".baseline]\ngflops = {SMALL_GFLOPS / 1.01!r}\n',
    )
    result = project.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_models.py::test_small * +1.00%  ok"])


def test_absolute_tolerance(project):
    write_budget(
        project,
        '[profiles."test_models.py::test_small"]\ntolerance = { params = "5 params" }\n'
        '[profiles."test_models.py::test_small".baseline]\nparams = 16\n',
    )
    project.runpytest().assert_outcomes(passed=1)
    write_budget(
        project,
        '[profiles."test_models.py::test_small"]\ntolerance = { params = "3 params" }\n'
        '[profiles."test_models.py::test_small".baseline]\nparams = 16\n',
    )
    project.runpytest().assert_outcomes(failed=1)


def test_clearly_better_than_baseline_is_an_improvement(project):
    write_budget(project, f'[profiles."test_models.py::test_small".baseline]\ngflops = {SMALL_GFLOPS * 2!r}\nparams = 20\n')
    result = project.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*test_models.py::test_small * -50.00%  improved", "*to lock in the improvement: pytest --modelprof-update*"]
    )


def test_profile_without_budget_is_new_and_strict_fails_it(project):
    result = project.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_models.py::test_small * new", "*to record budgets for new profiles: pytest --modelprof-update*"])
    strict = project.runpytest("--modelprof-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*has no budget (--modelprof-strict)*"])


def test_a_failing_test_is_not_checked_twice(project):
    project.makepyfile(
        test_models="""
        import torch
        from torch import nn

        def test_small(model_profile):
            model_profile(nn.Linear(4, 4), torch.ones(3, 4))
            assert False, "the test's own failure"
        """
    )
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_params = 10\n')
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the test's own failure*"])
    result.stdout.fnmatch_lines(["*test_models.py::test_small * regressed"])


def test_a_run_without_update_never_changes_budget_files(project):
    path = write_budget(project, f'[profiles."test_models.py::test_small".baseline]\ngflops = {SMALL_GFLOPS / 2!r}\n')
    before = path.read_bytes()
    project.runpytest().assert_outcomes(failed=1)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["test_models.toml"]


def test_a_memory_ceiling_per_target_gpu_gates_a_cuda_step_on_a_cpu_only_runner(pytester):
    pytester.makepyfile(
        test_gpu="""
        import torch

        def test_step(model_profile):
            model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
            result = model_profile(model, torch.randn(64, 512), train=True, target="h100",
                                   optimizer=torch.optim.AdamW(model.parameters()))
            assert result.target == "h100" and result.analytic
        """
    )
    (pytester.path / "budgets").mkdir()
    # the step holds 65 MiB of cuBLAS workspaces on an H100: over a 50 MB ceiling for it, under one for L4
    (pytester.path / "budgets" / "gpu.toml").write_text(
        '[profiles."test_gpu.py::test_step"]\nmax_peak_memory_mb = { h100 = 50.0, l4 = 500.0 }\n'
    )
    result = pytester.runpytest("-p", "pytest_modelprof", "--modelprof-device=cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak_memory_mb: measured *MB, allowed 50 MB (max_peak_memory_mb)*[[]budgets/gpu.toml:2[]]"])


def test_a_predicted_time_ceiling_per_target_gpu(pytester):
    pytester.makepyfile(
        test_gpu="""
        import torch

        def test_step(model_profile):
            model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).to(torch.bfloat16)
            x = torch.randn(8192, 4096, dtype=torch.bfloat16)
            result = model_profile(model, x, train=True, target="h100")
            assert result.predicted.seconds > 0
        """
    )
    (pytester.path / "budgets").mkdir()
    (pytester.path / "budgets" / "gpu.toml").write_text('[profiles."test_gpu.py::test_step"]\nmax_predicted_ms = { h100 = 0.5 }\n')
    result = pytester.runpytest("-p", "pytest_modelprof")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*predicted_ms: measured * ms, allowed 0.5 ms (max_predicted_ms)*[[]budgets/gpu.toml:2[]]"])
    result.stdout.fnmatch_lines(["*predicted ms*"])  # the summary's column
