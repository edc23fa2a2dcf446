"""Users count their own ops: a Python registration, or a pytest plugin hook."""

import pytest
import torch

from custom_ops import UsesCustomOp, scaled_tanh_flops
from pytest_modelprof import FormulaError, OpCost, profile, register_flop_formula, unregister_flop_formula

OP = torch.ops.modelprof_test.scaled_tanh
LINEAR = 2 * 3 * 4 * 4


@pytest.fixture
def registered():
    yield register_flop_formula(OP, scaled_tanh_flops)
    unregister_flop_formula(OP)


def test_an_op_without_formula_is_listed_never_silently_zero():
    result = profile(UsesCustomOp(), torch.randn(3, 4))
    assert result.uncounted == {"modelprof_test.scaled_tanh": 1}
    assert result.flops == LINEAR


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_registered_formula_counts_the_op(registered, device):
    result = profile(UsesCustomOp(), torch.randn(3, 4), device=device)
    assert result.uncounted == {}
    assert result.flops == LINEAR + 2 * 12
    assert result.op("modelprof_test.scaled_tanh").modules == [""]


def test_decorator_form_and_macs():
    @register_flop_formula(OP)
    def as_matmul(x, scale, *, out_val):
        return OpCost(flops=10, macs=5)

    try:
        result = profile(UsesCustomOp(), torch.randn(3, 4))
        assert result.macs == LINEAR // 2 + 5
    finally:
        unregister_flop_formula(OP)


def test_user_formula_overrides_builtin():
    register_flop_formula(torch.ops.aten.mm, lambda a, b, *, out_val: 1)
    try:
        assert profile(torch.nn.Linear(4, 4, bias=False), torch.randn(3, 4)).flops == 1
    finally:
        unregister_flop_formula(torch.ops.aten.mm)
    assert profile(torch.nn.Linear(4, 4, bias=False), torch.randn(3, 4)).flops == LINEAR


def test_formula_returning_nonsense_is_an_error(registered):
    register_flop_formula(OP, lambda x, scale, *, out_val: "many")
    with pytest.raises(FormulaError, match="returned 'many'"):
        profile(UsesCustomOp(), torch.randn(3, 4))


def test_formula_that_raises_names_the_op(registered):
    register_flop_formula(OP, lambda x, scale, *, out_val: 1 // 0)
    with pytest.raises(FormulaError, match=r"formula for modelprof_test\.scaled_tanh\.default raised ZeroDivisionError") as info:
        profile(UsesCustomOp(), torch.randn(3, 4))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_registering_something_that_is_not_an_op():
    with pytest.raises(TypeError, match="expects an op"):
        register_flop_formula("aten.mm", lambda *a, out_val: 0)


def test_plugin_hook_contributes_formulas(pytester):
    pytester.syspathinsert(str(__import__("pathlib").Path(__file__).parent))
    pytester.makeconftest(
        """
        import torch
        from custom_ops import scaled_tanh_flops

        def pytest_modelprof_flop_formulas():
            return {torch.ops.modelprof_test.scaled_tanh: scaled_tanh_flops}
        """
    )
    pytester.makepyfile(
        """
        import torch
        from custom_ops import UsesCustomOp
        from pytest_modelprof import profile

        def test_counted():
            result = profile(UsesCustomOp(), torch.randn(3, 4))
            assert result.uncounted == {}
            assert result.flops == 2 * 3 * 4 * 4 + 2 * 12
        """
    )
    pytester.runpytest("-p", "pytester").assert_outcomes(passed=1)
    # the formula lived only as long as that session
    assert profile(UsesCustomOp(), torch.randn(3, 4)).uncounted == {"modelprof_test.scaled_tanh": 1}
