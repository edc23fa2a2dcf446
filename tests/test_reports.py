"""Reports: each row holds its module's true figures; alignment holds for long names and deep trees."""

import csv
import io

import torch
from torch import nn

from pytest_modelprof import profile
from pytest_modelprof.report import (
    format_count,
    format_memory_report,
    format_model_graph,
    format_op_table,
    format_top,
    format_tree_table,
    top_module_types,
    write_modules_csv,
    write_ops_csv,
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 16, bias=False))
        self.head = nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return self.head(self.encoder(x))


X = torch.randn(2, 8)
# by hand, batch 2: 2*8*16 + 2*16*16 + 2*16*4 MACs; the ReLU adds 2*16 FLOPs
MACS = {"encoder.0": 256, "encoder.2": 512, "head": 128}


def names(table):
    """The module column: everything before the type column."""
    lines = table.splitlines()
    width = lines[0].index("type")
    return [line[:width].rstrip() for line in lines[1:]]


def test_tree_rows_hold_each_modules_figures():
    result = profile(Net(), X)
    table = format_tree_table(result, human=False)
    lines = table.splitlines()
    assert lines[0].split() == ["module", "type", "params", "MACs", "fwd", "FLOPs", "peak", "memory", "share"]
    head = next(line for line in lines if line.startswith("└── head"))
    # 64 of 448 parameters, 128 of 896 MACs, 256 of 1824 FLOPs; while it runs, the
    # weights (1792 B), the input (64 B), the encoder's output (128 B) and its own (32 B)
    assert head.split()[2:10] == ["Linear", "64", "(14.3%)", "128", "(14.3%)", "256", "2016", "14.0%"]
    encoder = next(line for line in lines if line.startswith("├── encoder"))
    assert encoder.split()[5] == str(MACS["encoder.0"] + MACS["encoder.2"])
    assert encoder.split()[7] == str(2 * (256 + 512) + 32)


def test_tree_guides_and_alignment():
    table = format_tree_table(profile(Net(), X))
    assert names(table) == ["Net", "├── encoder", "│   ├── 0", "│   ├── 1", "│   └── 2", "└── head"]
    # numbers are right-aligned: every row ends its figure columns at the same place
    assert len({len(line) for line in table.splitlines()}) == 1


def test_operator_rows_under_their_module():
    result = profile(Net(), X, train=True)
    lines = format_tree_table(result, ops=True, human=False).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("└── head"))
    below = lines[at + 1 : at + 3]
    assert any("· aten.mm x1" in line and "forward" in line and str(2 * 128) in line for line in below)
    assert any("· aten.mm x2" in line and "backward" in line and str(2 * 2 * 128) in line for line in below)


def test_long_names_and_deep_trees_do_not_overflow():
    class Deep(nn.Module):
        def __init__(self, depth):
            super().__init__()
            self.a_rather_long_module_name_that_keeps_going_and_going = nn.Linear(4, 4) if depth == 0 else Deep(depth - 1)

        def forward(self, x):
            return self.a_rather_long_module_name_that_keeps_going_and_going(x)

    table = format_tree_table(profile(Deep(12), torch.randn(1, 4)), name_width=40)
    lines = table.splitlines()
    assert len(lines) == 1 + 14
    assert len({len(line) for line in lines}) == 1
    shown = names(table)
    assert all(len(name) <= 40 for name in shown)
    # thirteen levels of guides do not fit: they give way, the name keeps half the column
    assert shown[-1] == "…" + " " * 15 + "└── a_rather_long_modul…"
    assert lines[-1].split()[3:11] == ["Linear", "20", "(100.0%)", "16", "(100.0%)", "36", "112", "B"]  # 80 B weights, 16 B in, 16 B out


def test_depth_limit_and_ignore():
    result = profile(Net(), X)
    assert names(format_tree_table(result, depth=1)) == ["Net", "├── encoder", "└── head"]
    assert "encoder" not in format_tree_table(result, ignore=["Sequential"])
    assert "head" not in format_model_graph(result, ignore=["head"])


def test_model_graph_is_nested_like_the_module():
    graph = format_model_graph(profile(Net(), X), human=False)
    assert graph.count("(") - graph.count(")") == 0
    assert "  (head): Linear(64 (14.3%) params, 128 (14.3%) MACs, 256 fwd FLOPs, 2016 peak memory, 14.0% of FLOPs)" in graph
    assert graph.splitlines()[2] == "  (encoder): Sequential("


def test_top_module_types_by_depth():
    result = profile(Net(), X)
    assert top_module_types(result, "macs", depth=2, k=3) == [("Linear", 768, 2), ("ReLU", 0, 1)]
    assert top_module_types(result, "params", depth=1, k=1) == [("Sequential", 8 * 16 + 16 * 16, 1)]
    assert "top 3 by macs: Linear 768 (85.7%, 2 modules)" in format_top(result, depths=[2])


def test_operator_table():
    result = profile(Net(), X)
    lines = format_op_table(result, human=False).splitlines()
    mm = next(line for line in lines if line.startswith("aten.mm"))
    assert mm.split()[:5] == ["aten.mm", "forward", "3", str(2 * 896), "896"]
    assert mm.endswith("encoder.0, encoder.2, head")


def test_csv_exports_hold_the_raw_figures():
    result = profile(Net(), X, train=True)
    modules, ops = io.StringIO(), io.StringIO()
    write_modules_csv(result, modules)
    write_ops_csv(result, ops)
    rows = {row["path"]: row for row in csv.DictReader(io.StringIO(modules.getvalue()))}
    assert int(rows["head"]["forward_macs"]) == MACS["head"]
    assert int(rows[""]["forward_flops"]) == result.forward_flops
    op_rows = list(csv.DictReader(io.StringIO(ops.getvalue())))
    assert sum(int(r["flops"]) for r in op_rows) == result.flops
    assert {r["phase"] for r in op_rows} >= {"forward", "backward", "loss"}


def test_flops_plot(tmp_path):
    from pytest_modelprof.report.plots import plot_module_flops

    path = tmp_path / "flops.png"
    plot_module_flops(profile(Net(), X, train=True), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_report_of_a_training_step():
    net = Net()
    result = profile(net, X, train=True, optimizer=torch.optim.Adam(net.parameters()))
    text = format_memory_report(result, top_parameters=2)
    lines = text.splitlines()
    assert lines[1].startswith(f"  peak {format_count(result.peak_memory_bytes, 'B')} in ")
    rows = {line.split()[0]: line.split() for line in lines[3:10]}
    # Adam keeps two moments per weight: 2 * 448 * 4 bytes, plus a 4-byte step per tensor
    assert rows["optimizer_state"][-2:] == [format_count(2 * 448 * 4 + 3 * 4, "B").split()[0], "kB"]
    assert rows["parameters"][-2:] == [format_count(448 * 4, "B").split()[0], "kB"]
    biggest = lines[11].split()
    assert biggest[0] == "encoder.2.weight" and biggest[1:] == ["1.02", "kB", "1.02", "kB"]  # 16 x 16 float32
    assert lines[-1] == "  ... 1 more parameters"


def test_module_tree_and_operator_table_show_memory():
    result = profile(Net(), X, train=True)
    tree = format_tree_table(result, human=False).splitlines()
    assert tree[0].split()[-4:] == ["activations", "peak", "memory", "share"]
    relu = next(line for line in tree if "ReLU" in line)
    assert relu.split()[-3] == str(4 * 2 * 16)  # the ReLU output is saved for backward
    ops = format_op_table(result, human=False).splitlines()
    assert "allocated" in ops[0]


def test_memory_timeline_plot(tmp_path):
    from pytest_modelprof.report.plots import plot_memory_timeline

    path = tmp_path / "memory.png"
    plot_memory_timeline(profile(Net(), X, train=True), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_top_types_by_activation_memory_and_memory_in_csv():
    result = profile(Net(), X, train=True)
    # at depth 2 only the ReLU saves a tensor of its own: its 2 x 16 float32 output
    assert top_module_types(result, "activation_bytes", depth=2, k=1) == [("ReLU", 4 * 2 * 16, 1)]
    assert "top 3 by activation_bytes: ReLU 128 B" in format_top(result, depths=[2])
    modules = io.StringIO()
    write_modules_csv(result, modules)
    rows = {row["path"]: row for row in csv.DictReader(io.StringIO(modules.getvalue()))}
    assert int(rows["encoder.1"]["activation_bytes"]) == 4 * 2 * 16
    assert max(int(rows[""]["forward_peak_bytes"]), int(rows[""]["backward_peak_bytes"])) == result.peak_memory_bytes


def test_a_timed_profile_reports_its_latency_and_layer_times():
    from torch import nn

    from pytest_modelprof import Timing
    from pytest_modelprof.report.tables import format_op_times
    from pytest_modelprof.report.text import format_header

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    result = profile(model, torch.randn(16, 64), train=True, latency=Timing(budget=0.2, layers=True))
    header = format_header(result)
    assert f"median of {result.latency.runs} repeats" in header
    assert f"on {result.machine}: " in header and "samples/s" in header
    tree = format_tree_table(result)
    assert all(column in tree.splitlines()[0] for column in ("calls", "fwd time", "self fwd", "bwd time", "self bwd"))
    table = format_op_times(result).splitlines()
    assert table[0].split()[:6] == ["operator", "phase", "module", "calls", "self", "CPU"]
    assert any(line.startswith("aten::addmm") and " forward " in line and " 0 " in line for line in table)
    assert any(line.startswith("aten::mm") and " backward " in line for line in table)
    assert "time share" in tree.splitlines()[0] and "100.0%" in tree.splitlines()[1]
    only_first = format_op_times(result, paths=["0"]).splitlines()[1:]
    assert only_first and all(" 0 " in line for line in only_first)
    assert result.profiler_events is not None and "profiler_events" not in result.to_dict()
    assert any(e.name == "modelprof::0" for e in result.profiler_events)
