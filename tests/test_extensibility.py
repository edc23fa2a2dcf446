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


def test_a_run_s_own_formulas_count_for_that_run_only():
    def three_per_element(x, scale, *, out_val):
        return 3 * out_val.numel()

    own = profile(UsesCustomOp(), torch.randn(3, 4), formulas={OP: three_per_element})
    assert own.uncounted == {}
    assert own.flops == LINEAR + 3 * 12
    assert profile(UsesCustomOp(), torch.randn(3, 4)).uncounted == {"modelprof_test.scaled_tanh": 1}


def test_a_run_s_own_formula_wins_over_a_registered_one(registered):
    result = profile(UsesCustomOp(), torch.randn(3, 4), formulas={OP: lambda x, scale, *, out_val: OpCost(7, 0)})
    assert result.flops == LINEAR + 7


def test_formulas_must_be_keyed_by_ops():
    with pytest.raises(
        TypeError, match=r"formulas= expects an op such as torch.ops.aten.mm \(or a higher-order operator\), got .scaled_tanh."
    ):
        profile(UsesCustomOp(), torch.randn(3, 4), formulas={"scaled_tanh": scaled_tanh_flops})


CONFTEST = """
import torch

def pytest_modelprof_flop_formulas():
    return {{torch.ops.modelprof_test.scaled_tanh: lambda x, scale, *, out_val: {per_element} * out_val.numel()}}
"""

TESTS = """
import torch
from custom_ops import UsesCustomOp

LINEAR = 2 * 3 * 4 * 4

def test_first(model_profile):
    assert model_profile(UsesCustomOp(), torch.randn(3, 4)).flops == LINEAR + {per_element} * 12

def test_own_formula(model_profile):
    result = model_profile(UsesCustomOp(), torch.randn(3, 4), formulas={{torch.ops.modelprof_test.scaled_tanh: lambda *a, out_val: 1}})
    assert result.flops == LINEAR + 1

def test_after(model_profile):
    assert model_profile(UsesCustomOp(), torch.randn(3, 4)).flops == LINEAR + {per_element} * 12
"""


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["serial", "xdist"])
def test_plugin_hook_formulas_count_where_their_conftest_is_seen(pytester, workers):
    pytester.syspathinsert(str(__import__("pathlib").Path(__file__).parent))
    for directory, per_element in (("a", 2), ("b", 5)):
        pytester.mkpydir(directory)
        pytester.path.joinpath(directory, "conftest.py").write_text(CONFTEST.format(per_element=per_element))
        pytester.path.joinpath(directory, f"test_{directory}.py").write_text(TESTS.format(per_element=per_element))
    # a directory without a hook: the op stays uncounted there, whatever ran before it
    pytester.mkpydir("c")
    pytester.path.joinpath("c", "test_c.py").write_text(
        "import torch\n"
        "from custom_ops import UsesCustomOp\n\n"
        "def test_plain(model_profile):\n"
        "    assert model_profile(UsesCustomOp(), torch.randn(3, 4)).uncounted == {'modelprof_test.scaled_tanh': 1}\n"
    )
    pytester.runpytest("-p", "pytester", *workers).assert_outcomes(passed=7)
    # nothing was registered for the process
    assert profile(UsesCustomOp(), torch.randn(3, 4)).uncounted == {"modelprof_test.scaled_tanh": 1}
