"""The model_profile fixture: names, options from marker, ini and command line."""

import pytest


def test_fixture_returns_the_profile_and_names_it_after_the_test(pytester):
    pytester.makepyfile(
        test_named="""
        import pytest, torch
        from torch import nn

        @pytest.mark.parametrize("width", [4, 8])
        def test_named(model_profile, width):
            first = model_profile(nn.Linear(width, width), torch.ones(1, width))
            second = model_profile(nn.Linear(width, 1), torch.ones(1, width))
            chosen = model_profile(nn.Linear(width, 2), torch.ones(1, width), name=f"chosen-{width}")
            assert first.name == f"test_named.py::test_named[{width}]"
            assert second.name == f"test_named.py::test_named[{width}]#2"
            assert chosen.name == f"chosen-{width}"
            assert first.params == width * width + width
        """
    )
    result = pytester.runpytest("-W", "error", "--strict-markers")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*model budgets*", "test_named.py::test_named?4?#2 *new"])


def test_marker_options_apply_and_calls_override_them(pytester):
    pytester.makepyfile(
        """
        import pytest, torch
        from torch import nn

        @pytest.mark.modelprof(train=True, device="meta")
        def test_marked(model_profile):
            step = model_profile(nn.Linear(4, 4, bias=False), torch.ones(3, 4, requires_grad=True))
            assert step.train and step.analytic
            assert step.backward_flops == 2 * step.forward_flops
            inference = model_profile(nn.Linear(4, 4), torch.ones(3, 4), train=False)
            assert not inference.train and inference.analytic
        """
    )
    pytester.runpytest("--strict-markers", "-W", "error").assert_outcomes(passed=1)


@pytest.mark.parametrize("args, analytic", [((), True), (("--modelprof-device", "cpu"), False)], ids=["ini", "command line wins"])
def test_device_from_ini_and_command_line(pytester, args, analytic):
    pytester.makeini("[pytest]\nmodelprof_device = meta\n")
    pytester.makepyfile(
        test_device=f"""
        import torch
        from torch import nn

        def test_where(model_profile):
            assert model_profile(nn.Linear(2, 2), torch.ones(1, 2)).analytic is {analytic}
        """
    )
    pytester.runpytest(*args).assert_outcomes(passed=1)


def test_unknown_option_is_a_clear_error(pytester):
    pytester.makepyfile(
        """
        import torch
        from torch import nn

        def test_typo(model_profile):
            model_profile(nn.Linear(2, 2), torch.ones(1, 2), trian=True)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*unknown model_profile option 'trian'; expected name= or one of: train, loss_fn, device, optimizer, memory, no_grad, set_to_none, autocast*"
        ]
    )


def test_two_tests_cannot_share_a_profile_name(pytester):
    pytester.makepyfile(
        test_shared="""
        import torch
        from torch import nn

        def test_a(model_profile):
            model_profile(nn.Linear(2, 2), torch.ones(1, 2), name="same")

        def test_b(model_profile):
            model_profile(nn.Linear(2, 2), torch.ones(1, 2), name="same")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*a profile named 'same' was already made by test_shared.py::test_a; give each profile a unique name= (in test_shared.py::test_b)"]
    )


def test_one_test_cannot_make_two_profiles_of_one_name(pytester):
    pytester.makepyfile(
        test_twice="""
        import torch
        from torch import nn

        def test_twice(model_profile):
            model_profile(nn.Linear(2, 2), torch.ones(1, 2), name="same")
            model_profile(nn.Linear(3, 3), torch.ones(1, 3), name="same")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a profile named 'same' was already made earlier in this test; give each profile a unique name=*"])


def test_an_error_in_the_model_shows_the_users_line_and_one_message(pytester):
    pytester.makepyfile(
        test_broken="""
        import torch
        from torch import nn

        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                return self.fc(x) @ torch.ones(3, 3)

        def test_broken(model_profile):
            model_profile(Broken(), torch.ones(2, 4), train=True)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            ">       model_profile(Broken(), torch.ones(2, 4), train=True)",
            ">       return self.fc(x) @ torch.ones(3, 3)",
            "E       pytest_modelprof.engine.errors.ProfileError: module '<root>' (Broken) raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 3x3)",
        ]
    )
    assert "site-packages/torch" not in text and "pytest_modelprof/engine" not in text and "direct cause" not in text
    failure = text[text.index("_ test_broken _") : text.index("short test summary")]
    assert len(failure.splitlines()) < 40
    full = pytester.runpytest("--full-trace")
    assert "pytest_modelprof/engine/run.py" in full.stdout.str()  # everything, when asked


def test_inert_for_tests_that_do_not_profile(pytester):
    pytester.makepyfile("def test_plain():\n    assert True\n")
    result = pytester.runpytest("-W", "error", "--strict-markers")
    result.assert_outcomes(passed=1)
    assert "model budgets" not in result.stdout.str()
    assert not (pytester.path / "budgets").exists()


def test_disabled_with_no_modelprof(pytester):
    pytester.makepyfile(
        """
        def test_without_fixture(request):
            assert not request.config.pluginmanager.hasplugin("modelprof")
        """
    )
    result = pytester.runpytest("-p", "no:modelprof", "-W", "error")
    result.assert_outcomes(passed=1)
    result = pytester.runpytest("-p", "no:modelprof", "--help")
    assert "--modelprof-update" not in result.stdout.str()


def test_module_trees_in_the_summary(project):
    result = project.runpytest("--modelprof-tree", "1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "test_models.py::test_small: inference (cpu)",
            "  FLOPs        108 FLOPs   forward 108",
            "",
            "module  type         params         MACs  fwd FLOPs  peak memory   share",
            "Linear  Linear  20 (100.0%)  48 (100.0%)        108        176 B  100.0%",
        ]
    )
    refused = project.runpytest("--modelprof-tree", "deep")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--modelprof-tree expects a depth (0, 1, 2, ...), got 'deep'"])
