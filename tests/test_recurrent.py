"""cuDNN's recurrent layers on a GPU target (engine/targets/recurrent.py): the algorithm ATen asks for, against the
kernels an H100 ran for 432 layers; the kernels and host of the step-by-step algorithm; the persistent kernels' time;
and the step against LSTM steps measured on three machines."""

import json
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

from pytest_modelprof import GPUS, profile
from pytest_modelprof.engine.meters import Meter
from pytest_modelprof.engine.targets.cost import StepClock, Work
from pytest_modelprof.engine.targets.recurrent import (
    CALL_HOST,
    GATES,
    STEP_HOST,
    Recurrent,
    algorithm,
    host_seconds,
    kernels,
    persistent_cycles,
    recurrent_of,
    reread_seconds,
)

TRUTH = Path(__file__).resolve().parents[1] / "pytest_modelprof" / "data" / "gpu-truth"
H100 = GPUS["h100"]
CELLS = {"LSTM": 2, "GRU": 3, "RNN": 1}  # cuDNN's modes (nn.RNN: tanh)
OTHERS = ("aten.zeros", "aten.sum", "aten.ones_like", "aten.add_", "aten._to_copy")  # the probes' other ops with a kernel


def call(mode=2, hidden=64, inputs=64, batch=1, steps=16, layers=1, directions=1, dtype=torch.float32, backward=False):
    per_step = GATES[mode] * hidden * hidden * dtype.itemsize
    return Recurrent(mode, hidden, inputs, batch, steps, layers, directions, dtype, backward, False, False, per_step * layers * directions)


def cudnn_args(lstm: nn.LSTM, x: torch.Tensor, batch_sizes=()):
    """``aten._cudnn_rnn``'s arguments for ``lstm`` over ``x`` (as ``torch._VF.lstm`` passes them on CUDA)."""
    layers, hidden = lstm.num_layers, lstm.hidden_size
    h = torch.zeros(layers, x.shape[0] if lstm.batch_first else x.shape[1], hidden, device=x.device)
    args = (x, list(lstm._flat_weights), 4, None, h, h, 2, hidden, 0, layers, lstm.batch_first, 0.0, True, False)
    return (*args, list(batch_sizes), None)


def test_the_algorithm_is_the_one_the_h100_ran_for_each_of_432_layers():
    """Every forward layer of h100-rnn-algo.json (LSTM, GRU and tanh RNN; float32, float16, bfloat16; hidden 32 to
    1024; batch 1 to 128; one and two layers): a persistent kernel ran where the model says one does."""
    rows = json.loads((TRUTH / "h100-rnn-algo.json").read_text())["algo"]
    assert len(rows) == 432
    for row in rows:
        names = " ".join(row["kernels"])
        ran = "small" if "blockPersist" in names else "static" if ("RNN_persist_fp" in names or "lstm_tile" in names) else "standard"
        dtype = getattr(torch, row["dtype"])
        one = call(CELLS[row["cell"]], row["hidden"], row["input"], row["batch"], row["seq"], row["layers"], dtype=dtype)
        assert algorithm(one, H100.compute_capability, H100.sm_count) == ran, row


def test_atens_rules_by_hand():
    fp16 = dict(hidden=512, inputs=512, batch=64, dtype=torch.float16)
    assert algorithm(call(**fp16), (9, 0), 132) == "static"
    assert algorithm(call(**{**fp16, "batch": 60}), (9, 0), 132) == "standard"  # not a multiple of 8
    assert algorithm(call(**fp16, layers=2), (9, 0), 132) == "standard"  # one layer only
    assert algorithm(call(**fp16), (7, 5), 40) == "standard"  # not on Turing
    assert algorithm(call(**fp16), (8, 6), 80) == "standard"  # nor on sm_86, nor under 98 SMs
    assert algorithm(call(**fp16), (8, 9), 58) == "standard"
    assert algorithm(call(mode=3, **fp16), (9, 0), 132) == "standard"  # nor for a GRU
    assert algorithm(call(mode=1, **{**fp16, "batch": 96, "hidden": 1024, "inputs": 1024}), (9, 0), 132) == "standard"
    assert algorithm(call(**{**fp16, "batch": 32}), (7, 0), 80) == "static"  # Volta's rules: batch 32, 16 steps
    assert algorithm(call(**{**fp16, "batch": 48}), (7, 0), 80) == "standard"  # 48 > 32 needs 20 steps
    # small hidden sizes: forward up to 192 (LSTM, GRU) and 384 (RNN), backward 128 and 256; not bfloat16, not packed
    assert algorithm(call(hidden=192), (9, 0), 132) == "small"
    assert algorithm(call(hidden=192, backward=True), (9, 0), 132) == "standard"
    assert algorithm(call(mode=1, hidden=384), (9, 0), 132) == "small"
    assert algorithm(call(hidden=64, dtype=torch.bfloat16), (9, 0), 132) == "standard"
    assert algorithm(call(hidden=64)._replace(packed=True), (9, 0), 132) == "standard"


def test_the_calls_shape_is_read_from_atens_arguments():
    lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True, device="meta")
    x = torch.empty(4, 10, 32, device="meta")  # a batch of 4, 10 steps
    one = recurrent_of("aten._cudnn_rnn", cudnn_args(lstm, x))
    assert one is not None
    assert (one.mode, one.hidden, one.inputs, one.batch, one.steps, one.layers, one.directions) == (2, 64, 32, 4, 10, 2, 1)
    assert one.weight_bytes == 2 * 4 * 64 * 64 * 4  # each layer's w_hh, 256 x 64 in float32
    # the standard algorithm: the product and the cell's kernel per step and layer; the weights read again 9 times
    assert kernels(one, "standard") == (2 * 10 + 1) * 2 and kernels(one, "small") == 2 * 2  # (the input's product)
    assert reread_seconds(one, "standard", 1e12, 0) == pytest.approx(one.weight_bytes * 9 / 1e12)
    assert reread_seconds(one, "small", 1e12, 0) == 0.0
    lstm = nn.LSTM(8, 16, device="meta")
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 8), [5, 3, 2])
    one = recurrent_of("aten._cudnn_rnn", cudnn_args(lstm, packed.data.to("meta"), packed.batch_sizes.tolist()))
    assert one is not None and (one.steps, one.batch, one.packed) == (5, 3, True)  # one step per batch size
    assert recurrent_of("aten.mm", ()) is None


def test_the_standard_algorithms_kernels_are_those_the_h200_ran():
    """Two kernels a step, layer and direction forward (three for a GRU and a plain RNN in float32), three backward (a
    memset beside the product and the cell's), against the kernels profiled on an H200 (h200-launch.json): within 6%
    over 256 steps, 15% over 32 (where cuDNN's products with the input, in chunks of steps, weigh more)"""
    rows = json.loads((TRUTH / "h200-launch.json").read_text())["rnn"]
    checked = 0
    for row in rows:
        forward = call(CELLS[row["cell"]], row["hidden"], row["input"], row["batch"], row["seq"], row["layers"])
        forward = forward._replace(directions=2 if row["bidirectional"] else 1, dtype=getattr(torch, row["dtype"]))
        if algorithm(forward, H100.compute_capability, H100.sm_count) != "standard":
            continue
        predicted = kernels(forward, "standard") + (kernels(forward._replace(backward=True), "standard") if row["train"] else 0)
        predicted += sum(row["ops"].get(op, 0) for op in OTHERS)  # one kernel each: the initial states, the loss...
        assert predicted == pytest.approx(row["kernel_count"], rel=0.06 if row["seq"] >= 256 else 0.15), row
        checked += 1
    assert checked == 36  # every layer of hidden 1024 but the one-layer float16 LSTMs (persistent)


def test_a_persistent_kernel_starts_once_and_steps_by_its_weights():
    """The shape of a persistent kernel's time: a start, then a time per step that grows with the recurrent weights and
    not with the batch (an LSTM of hidden 64 took 1.02 and 1.03 us a step at batch 1 and 128 on the H100); layers and
    directions one after another; a backward pass's steps slower than the forward's, its start shorter (the launch
    files: an LSTM's steps 1.55 times, its start 0.1 to 0.25 times)."""
    one = call(hidden=64, steps=100)
    per_step = persistent_cycles(one._replace(steps=200), "small") - persistent_cycles(one, "small")
    start = persistent_cycles(one, "small") - 100 * per_step / 100
    assert per_step > 0 and start > 0
    assert persistent_cycles(one._replace(batch=128), "small") == persistent_cycles(one, "small")  # on CUDA cores, float32
    assert persistent_cycles(call(hidden=128, steps=100), "small") > 2 * persistent_cycles(one, "small")
    assert persistent_cycles(one._replace(layers=2, directions=2), "small") == pytest.approx(4 * persistent_cycles(one, "small"))
    backward = one._replace(backward=True)
    backward_step = persistent_cycles(backward._replace(steps=200), "small") - persistent_cycles(backward, "small")
    assert 1.2 < backward_step / per_step < 1.6
    assert persistent_cycles(backward._replace(steps=0), "small") < persistent_cycles(one._replace(steps=0), "small")
    assert persistent_cycles(one, "standard") == 0.0


def test_persistent_kernels_against_the_h100s_and_the_h200s():
    """Each persistent forward kernel the two GPUs ran (h100-rnn-algo.json, both launch files), against its cycles at
    the boost clock: median |error| within 10%, every one within 50%."""
    rows = []
    algo = json.loads((TRUTH / "h100-rnn-algo.json").read_text())["algo"]
    launch = [r for f in ("h100-launch.json", "h200-launch.json") for r in json.loads((TRUTH / f).read_text())["rnn"]]
    for row in [*algo, *(r for r in launch if not r["train"])]:
        measured = sum(us for name, (_, us) in row["kernels"].items() if "ersist_fp" in name or "lstm_tile" in name)
        if not measured:
            continue
        dtype = getattr(torch, row["dtype"])
        one = call(CELLS[row["cell"]], row["hidden"], row["input"], row["batch"], row["seq"], row["layers"], dtype=dtype)
        one = one._replace(directions=2 if row.get("bidirectional") else 1)
        chosen = algorithm(one, H100.compute_capability, H100.sm_count)
        rows.append(persistent_cycles(one, chosen) / H100.boost_clock / (measured * 1e-6) - 1)
    assert len(rows) > 200
    assert statistics.median(abs(e) for e in rows) < 0.10 and max(abs(e) for e in rows) < 0.5


def test_the_host_issues_the_standard_algorithms_steps_and_the_gpu_runs_them_meanwhile():
    one = call(hidden=1024, inputs=512, batch=32, steps=256, layers=2)
    fixed, steps = host_seconds(one, "standard")
    assert fixed == CALL_HOST[False][0] and steps == pytest.approx(STEP_HOST * 256 * 2)
    work = Work("aten._cudnn_rnn", "rnn", 10**9, 10**6, torch.float32, recurrent=one, issuer="plain")
    clock = StepClock(H100)
    clock.issue(work)
    # the host takes longer than the kernels: the step is the host's time, not the two one after the other
    assert clock.host == pytest.approx(H100.calibration.host("plain") + fixed + steps)
    assert clock.busy < clock.host and clock.seconds == pytest.approx(clock.host)
    # 1000 times the FLOPs: the GPU's time from the first launch (after the call's fixed host time), not from the last
    heavy = work._replace(flops=10**12)
    clock = StepClock(H100)
    clock.issue(heavy)
    assert clock.busy > clock.host and clock.seconds == pytest.approx(H100.calibration.host("plain") + fixed + clock.busy)
    # an op without the call's shape is as before: its kernel from when the host has issued it
    plain = Work("aten.mm", "matmul", 10**9, 10**6, torch.float32, issuer="plain")
    clock = StepClock(H100)
    clock.issue(plain)
    assert clock.seconds == pytest.approx(clock.host + clock.busy)


def cudnn_calls(model: nn.Module, x: torch.Tensor, **keywords) -> list[Recurrent | None]:
    """The shape of each cuDNN recurrent call (forward and backward) of ``model`` over ``x`` profiled on target h100."""
    calls = []

    class Calls(Meter):
        def op(self, op):
            if op.name.startswith("aten._cudnn_rnn"):
                calls.append(recurrent_of(op.name, op.args))

    profile(model, x, target="h100", meters=[Calls()], flops=False, memory=False, **keywords)
    return calls


def test_a_training_steps_calls_are_read_forward_and_backward():
    """A bidirectional two-layer GRU (sequence first) in a training step on target h100: both cuDNN calls, with the
    shape ATen's arguments give (the backward's at other positions)."""
    with torch.device("meta"):
        gru = nn.GRU(24, 48, num_layers=2, bidirectional=True)
    x = torch.empty(7, 5, 24, device="meta")  # 7 steps of a batch of 5
    calls = cudnn_calls(gru, x, train=True, loss_fn=lambda out: out[0].sum())
    assert [c.backward for c in calls] == [False, True]
    for one in calls:
        assert (one.mode, one.hidden, one.inputs, one.batch, one.steps, one.layers, one.directions) == (3, 48, 24, 5, 7, 2, 2)
        assert one.weight_bytes == 2 * 2 * 3 * 48 * 48 * 4 and not one.packed and not one.projected


def test_an_lstm_with_a_projection_runs_step_by_step():
    """ATen asks for the standard algorithm whenever an LSTM projects its hidden state (proj_size), however small."""
    with torch.device("meta"):
        lstm = nn.LSTM(16, 64, proj_size=32, batch_first=True)
    (one,) = cudnn_calls(lstm, torch.empty(4, 9, 16, device="meta"))  # inference: the forward call alone
    assert one.projected and (one.hidden, one.steps, one.batch) == (64, 9, 4)
    assert algorithm(one, H100.compute_capability, H100.sm_count) == "standard"
    assert algorithm(one._replace(projected=False), H100.compute_capability, H100.sm_count) == "small"


LSTM_STEPS = {  # every capture of the two LSTM workloads: file, workload (step ms)
    "eval": [f"{f}.json" for f in ("h100-heldout", "h200", "h200-b", "h200-b-repeat", "h200-tf32", "h200-lstm", "h200-lstm-b")],
    "train": [f"{f}.json" for f in ("h100", "h100-shared-b", "h200", "h200-repeat", "h200-b", "h200-tf32", "h200-lstm", "h200-lstm-b")],
}


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_an_lstms_step_against_every_capture(mode):
    """A two-layer LSTM over 256 steps: in inference the host issues 1,043 kernels in 10-14 ms where the GPU runs them in
    5.5-5.9 ms; a training step adds the backward pass, bound by the GPU. Measured 7.9-11.6 ms (inference) and 20.9-27.0
    ms (training) over seven and eight captures on H100 and H200 machines: predicted on target h100 (the same SMs and
    clock) within 10% of their median and within 35% of each. None of the inference captures, and one of the training
    ones (h100.json's), went into the constants."""
    name = f"lstm2x1024-s256-b32-{mode}-fp32" + ("-adam" if mode == "train" else "")
    measured = [
        next(r for r in json.loads((TRUTH / f).read_text()) if r["name"] == name)["step_ms_median"] * 1e-3 for f in LSTM_STEPS[mode]
    ]
    with torch.device("meta"):  # the capture's LSTMHead: the last step's output through a linear head
        lstm, head = nn.LSTM(512, 1024, 2, batch_first=True), nn.Linear(1024, 10)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.head = lstm, head

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])

    model = Head()
    x = torch.empty(32, 256, 512, device="meta")
    keywords = {"train": True, "optimizer": torch.optim.Adam(model.parameters())} if mode == "train" else {}
    predicted = profile(model, x, target="h100", flops=False, memory=False, **keywords).predicted
    assert predicted is not None
    errors = [predicted.seconds / seconds - 1 for seconds in measured]
    assert abs(predicted.seconds / statistics.median(measured) - 1) < 0.10 and max(map(abs, errors)) < 0.35, errors
