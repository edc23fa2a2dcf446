"""The training-loop memory monitor, in real loops on the CPU: figures derived by hand, a planted leak."""

import csv
import json
import warnings

import pytest
import torch
from torch import nn

from models import TinyTransformer
from pytest_modelprof import MemoryGrowthWarning, MemoryMonitor
from pytest_modelprof.report import plot_monitor

BATCH = 8


def mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)
    )


def train(model, monitor, optimizer, make_batch, epochs=3, steps=5, leak=False):
    kept = []
    for _ in range(epochs):
        for _ in range(steps):
            x, y = make_batch()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if leak:  # a metric accumulated with grad enabled: its graph and saved activations stay alive
                kept.append(model(x).mean())
            monitor.record()
        monitor.epoch_end()
    return kept


def images():
    return torch.randn(BATCH, 3, 16, 16), torch.randint(0, 10, (BATCH,))


def vectors():
    return torch.randn(BATCH, 64), torch.randint(0, 10, (BATCH,))


def test_figures_of_a_linear_stack_by_hand(tmp_path):
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    with MemoryMonitor(model, optimizer, csv_dir=tmp_path) as monitor:
        train(model, monitor, optimizer, vectors, epochs=2, steps=3)
    weights = 4 * (64 * 128 + 128 + 128 * 10 + 10)
    for row in monitor.rows:
        assert row.weights == weights
        assert row.gradients == 0  # zero_grad() frees them (set_to_none)
        assert row.optimizer_state == 2 * weights + 4 * 4  # exp_avg, exp_avg_sq, and a float32 step per parameter
        # saved for backward: the ReLU's output (which the second linear saves too, one storage);
        # the input, the weights and what the loss saves outside the model are not activations
        assert row.activations_peak == BATCH * 128 * 4
        assert row.activations_alive == 0
        assert row.intermediate_gradients_peak is None  # measured in printed iterations only
        assert row.cuda_allocated is None
    assert [(r.epoch, r.iteration) for r in monitor.rows] == [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (2, 6)]
    assert monitor.growth == []
    assert monitor.parameters()[0] == ("0.weight", 4 * 64 * 128, 0)


def test_printed_iterations_report_intermediate_gradients(capsys):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryMonitor(model, optimizer, print_period=2) as monitor:
        train(model, monitor, optimizer, vectors, epochs=1, steps=4)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[memory]")]
    assert [line.split(":")[0] for line in printed] == ["[memory] epoch 1 iteration 2", "[memory] epoch 1 iteration 4"]
    assert "activations peak 0.00 MB" in printed[0] and "largest parameters 0.weight 0.03 MB" in printed[0]
    sampled = [r.intermediate_gradients_peak for r in monitor.rows]
    assert sampled[0] is None and sampled[2] is None
    # the gradients of the module outputs: at least one (8 x 128) float32 gradient, at most all three outputs' at once
    assert BATCH * 128 * 4 <= sampled[1] <= BATCH * (128 + 128 + 10) * 4
    assert sampled[1] == sampled[3]
    with MemoryMonitor(model, optimizer, print_period=1, report_parameters=-1) as monitor:
        train(model, monitor, optimizer, vectors, epochs=1, steps=1)
    line = capsys.readouterr().out.splitlines()[0]
    assert "; parameters 0.weight 0.03 MB (grad 0.00 MB), 2.weight 0.01 MB (grad 0.00 MB), 0.bias" in line and "2.bias" in line


@pytest.mark.parametrize(
    ("factory", "make_batch"),
    [(cnn, images), (TinyTransformer, lambda: (torch.randint(0, 50, (BATCH, 12)), torch.randint(0, 10, (BATCH,))))],
    ids=["cnn", "transformer"],
)
def test_a_clean_loop_is_not_flagged_and_a_planted_leak_is(factory, make_batch, tmp_path):
    if factory is TinyTransformer:
        base = make_batch

        def make_batch():
            tokens, _ = base()
            return tokens, torch.randint(0, 50, (BATCH * 12,))

        model = _Flat(TinyTransformer())
    else:
        model = factory()
    optimizer = torch.optim.AdamW(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with MemoryMonitor(model, optimizer) as clean:
            train(model, clean, optimizer, make_batch)
    assert clean.growth == [] and all(r.activations_alive == 0 for r in clean.rows)
    with pytest.warns(MemoryGrowthWarning, match="activations_alive grew in epoch [23]"):
        with MemoryMonitor(model, optimizer, csv_dir=tmp_path) as leaky:
            kept = train(model, leaky, optimizer, make_batch, leak=True)
    assert {g.category for g in leaky.growth} == {"activations_alive"}
    assert [g.epoch for g in leaky.growth] == [2, 3]
    alive = [r.activations_alive for r in leaky.rows]
    assert alive == sorted(alive) and alive[-1] >= 15 * alive[0] > 0  # one forward's worth per iteration
    assert json.loads((tmp_path / "memory.json").read_text())["growth"][0]["category"] == "activations_alive"
    del kept


class _Flat(nn.Module):
    """The transformer's logits flattened for a token-level cross-entropy."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(tokens).flatten(0, 1)


def test_csv_per_epoch_and_json(tmp_path):
    model = cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with MemoryMonitor(model, optimizer, csv_dir=tmp_path) as monitor:
        train(model, monitor, optimizer, images, epochs=2, steps=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_1.csv", "epoch_2.csv", "memory.json"]
    with (tmp_path / "epoch_2.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == [
        "epoch",
        "iteration",
        "weights",
        "gradients",
        "optimizer_state",
        "activations_peak",
        "activations_alive",
        "intermediate_gradients_peak",
        "cuda_allocated",
        "cuda_max_allocated",
        "cuda_reserved",
        "cuda_max_reserved",
    ]
    assert [r["iteration"] for r in rows] == ["4", "5", "6"] and rows[0]["cuda_allocated"] == ""
    document = json.loads((tmp_path / "memory.json").read_text())
    assert len(document["rows"]) == 6 and document["rows"][5]["weights"] == int(rows[2]["weights"])
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert int(rows[0]["optimizer_state"]) == weights  # momentum buffers only


def test_the_plot(tmp_path):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with MemoryMonitor(model, optimizer) as monitor:
        train(model, monitor, optimizer, vectors, epochs=2, steps=2)
    path = plot_monitor(monitor, tmp_path / "memory.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_maxima_as_a_profile_for_budgets():
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    with MemoryMonitor(model, optimizer) as monitor:
        train(model, monitor, optimizer, vectors, epochs=1, steps=2)
    result = monitor.profile("mlp loop")
    weights = 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert result.name == "mlp loop" and result.train
    assert result.peak_activation_bytes == BATCH * 128 * 4
    assert result.peak_memory_bytes == weights + (2 * weights + 16) + BATCH * 128 * 4  # no gradients left at the records
    assert result.params == weights // 4


def test_close_removes_every_hook_and_bad_input():
    model = mlp()
    monitor = MemoryMonitor(model, print_period=1)
    monitor.close()
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(not m._forward_hooks for m in model.modules())
    with pytest.raises(RuntimeError, match="closed"):
        monitor.record()
    with pytest.raises(ValueError, match="print_period"):
        MemoryMonitor(model, print_period=-1)
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        MemoryMonitor(lambda x: x)
    with pytest.raises(RuntimeError, match="no iteration recorded"):
        MemoryMonitor(model).profile()


def test_a_forward_that_raises_leaves_no_saved_tensors_hook_behind():
    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    model = Fails()
    with MemoryMonitor(model) as monitor:
        with pytest.raises(ValueError):
            model(torch.ones(1, requires_grad=True))
    assert monitor._contexts == []
    y = (torch.ones(2, requires_grad=True) * 2).sum()  # no hook of ours sees this
    y.backward()


def test_a_test_holds_a_loop_against_its_budget(pytester):
    pytester.makepyfile(
        test_loop="""
        import torch
        from torch import nn
        from pytest_modelprof import MemoryMonitor

        def test_loop(model_profile):
            model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            with MemoryMonitor(model, optimizer) as monitor:
                for _ in range(3):
                    model(torch.randn(8, 64)).sum().backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    monitor.record()
            model_profile.record(monitor.profile(), name="mlp loop")
        """
    )
    pytester.mkdir("budgets")
    # 8 x 128 float32 activations = 4096 bytes = 0.004096 MB
    (pytester.path / "budgets" / "loop.toml").write_text('[profiles."mlp loop"]\nmax_peak_activation_mb = 0.004\n')
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak_activation_mb: measured 0.004096 MB, allowed 0.004 MB (max_peak_activation_mb)*"])
    (pytester.path / "budgets" / "loop.toml").write_text('[profiles."mlp loop"]\nmax_peak_activation_mb = 0.005\n')
    pytester.runpytest().assert_outcomes(passed=1)
