"""Calibrating a target GPU's predicted-time model: fitting it to measured kernel and step times
(injected here: made by a known calibration), calibration files, and ``modelprof calibrate``."""

import dataclasses
import json

import pytest
import torch
from torch import nn

from pytest_modelprof import GPUS, profile
from pytest_modelprof.cli import main
from pytest_modelprof.engine.calibrate import _get, errors, fit_kinds, kernel_parameters, kernel_time, key, least_squares, observe
from pytest_modelprof.engine.probes import Probe, calibrate, measure_probe, probe_loss
from pytest_modelprof.engine.targets.catalog import gpu_spec, load_calibration, save_calibration
from pytest_modelprof.engine.targets.cost import StepClock, Work, kernel_seconds
from pytest_modelprof.engine.targets.gpus import Calibration

H100 = GPUS["h100"]


def test_least_squares_finds_a_known_minimum_within_its_bounds():
    # the line through (1, 3), (2, 5), (3, 7): slope 2, intercept 1; with the intercept bounded to [0, 0.5] it
    # ends at 0.5, and the slope at sum(t (y - 0.5)) / sum(t^2) = 31 / 14
    points = [(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]

    def residuals(x):
        return [x[0] * t + x[1] - y for t, y in points]

    assert least_squares(residuals, [0.0, 0.0], [-10, -10], [10, 10]) == pytest.approx([2.0, 1.0], abs=1e-6)
    slope, intercept = least_squares(residuals, [0.0, 0.0], [-10, 0.0], [10, 0.5])
    assert intercept == pytest.approx(0.5) and slope == pytest.approx(31 / 14, abs=1e-6)


def test_fitting_some_kinds_recovers_their_constants_and_keeps_every_other():
    # batch norms in PyTorch's own kernels timed by a known calibration (1.2 elements per SM and cycle)
    start = H100.calibration
    truth = dataclasses.replace(start, efficiency={**start.efficiency, "norm_native_rate": 1.2})
    kernels = []
    for channels, pixels in [(64, 112 * 112), (256, 56 * 56), (1024, 14 * 14), (2048, 7 * 7), (96, 224 * 224)]:
        elements = 64 * channels * pixels
        for work in (
            Work(
                "aten.native_batch_norm",
                "norm_native",
                0,
                2 * elements * 2,
                torch.float16,
                1,
                (),
                1.5,
                channels,
                elements=elements * 3 // 2,
            ),
            Work("aten.native_batch_norm", "norm_native", 0, 2 * elements * 2, torch.float16, 1, (), 1.0, 0, elements=elements),
        ):
            kernels.append((H100, [work], kernel_seconds(H100, truth, work)[0]))
    fitted = fit_kinds(start, kernels, {"norm_native"})
    assert fitted.efficiency["norm_native_rate"] == pytest.approx(1.2, rel=0.01)
    # their bytes and channels are cuDNN's batch norm's, which stand in: nothing of theirs is fitted
    assert "norm_native" not in fitted.efficiency and "norm_native" not in fitted.reduction_bandwidth
    assert {k: v for k, v in fitted.efficiency.items() if k != "norm_native_rate"} == {
        k: v for k, v in start.efficiency.items() if k != "norm_native_rate"
    }
    assert (fitted.kernel_seconds, fitted.host_seconds, fitted.gemm_half) == (start.kernel_seconds, start.host_seconds, start.gemm_half)
    with pytest.raises(ValueError, match="no measured kernel of the kinds"):
        fit_kinds(start, kernels, {"conv"})


def test_the_strided_constants_are_fitted_where_an_elementwise_kernel_takes_the_strided_path():
    vector = Work("aten.mul", "memory", 0, 3 << 20, torch.float16, 1)
    strided = vector._replace(elements=1 << 19)  # a broadcast operand: its elements' index arithmetic
    strided_constants = {("efficiency", "strided_rate"), ("efficiency", "strided_byte_cycles")}
    assert not strided_constants & set(kernel_parameters([(H100, vector)]))
    assert strided_constants <= set(kernel_parameters([(H100, vector), (H100, strided)]))
    # where a calibration lacks them, the fit starts from about what the H100 and H200 probes measured
    assert 1.0 < _get(Calibration(), ("efficiency", "strided_rate")) < 16.0
    assert 0.01 < _get(Calibration(), ("efficiency", "strided_byte_cycles")) < 1.0


def test_operators_match_the_profilers_names_and_shapes():
    # torch.profiler names the kernel of aten.convolution cudnn_convolution, and lists a bias and scalars too
    assert key("aten::cudnn_convolution", [[8, 3, 32, 32], [16, 3, 3, 3], [], [16]]) == (
        "aten.convolution",
        ((8, 3, 32, 32), (16, 3, 3, 3)),
    )
    assert key("aten.addmm", [[64], [32, 128], [128, 64], [], []]) == ("aten.addmm", ((32, 128), (128, 64)))


def _mlp(device):
    with device:
        model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512), nn.LayerNorm(512))
        x = torch.randn(256, 512)
    return model, x, {"train": True, "optimizer": torch.optim.AdamW(model.parameters()), "autocast": None}


def _convnet(device):
    with device:
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2))
        x = torch.randn(16, 3, 64, 64)
    return model, x, {"train": False, "optimizer": None, "autocast": None}


def _small(device):  # small kernels, many ops: the host's time per op decides the step
    with device:
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(12)])
        x = torch.randn(8, 64)
    return model, x, {"train": True, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "autocast": None}


PROBES = (Probe("mlp", _mlp), Probe("convnet", _convnet), Probe("small", _small))
TRUE = Calibration(
    efficiency={
        "matmul": 0.6,
        "conv": 0.35,
        "conv_backward": 0.25,
        "conv_narrow": 0.2,
        "norm": 0.55,
        "norm_backward": 0.45,
        "memory": 0.65,
        "cuda_cores": 0.3,
    },
    gemm_half={"m": 200.0, "n": 40.0, "k": 150.0},
    reduction_bandwidth={"norm": 30e9, "norm_backward": 15e9},
    kernel_seconds=4e-6,
    host_seconds=20e-6,
    view_seconds=3e-6,
)


def synthetic(probe):
    """The record a GPU whose kernels and host behave exactly as ``TRUE`` says would give."""
    model, inputs, keywords = probe.build(torch.device("meta"))
    run = observe(H100, model, inputs, {"ops": [], "step_ms_median": 1.0}, loss_fn=probe_loss, **keywords)
    ops, clock = {}, StepClock(H100, TRUE)
    for work, (name, shapes) in run.ops:
        clock.issue(work)
        if work.kind != "none" and work.on_device:
            entry = ops.setdefault((name, shapes), {"op": name, "shapes": [list(s) for s in shapes], "self_device_us": 0.0})
            entry["self_device_us"] += kernel_seconds(H100, TRUE, work)[0] * 1e6
    return {"step_ms_median": clock.seconds * 1e3, "ops": list(ops.values())}


def test_calibrating_recovers_the_figures_behind_the_measurements():
    fitted, observed = calibrate(H100, PROBES, measure=synthetic)
    assert [o.name for o in observed] == ["mlp", "convnet", "small"]
    assert all(abs(e) < 0.01 for e in errors(H100, observed, fitted))
    assert fitted.calibrated and "calibrated on h100" in fitted.source
    # what the probes exercise comes back (from the round defaults the fit starts at): every kernel's time
    # (over three probes' few shapes a kind's efficiency and its shape halves trade off against each
    # other), the memory's bandwidth, the host's time per op
    for run in observed:
        for works, seconds in run.matched.values():
            assert kernel_time(H100, works, fitted) == pytest.approx(seconds, rel=0.02)
    assert fitted.efficiency["memory"] == pytest.approx(0.65, rel=0.1)
    assert fitted.host_seconds == pytest.approx(20e-6, rel=0.1)


def test_calibrating_needs_a_gpu_to_measure_on():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        calibrate(H100, PROBES)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_probe_measured_on_the_gpu_gives_kernel_and_step_times():
    record = measure_probe(Probe("mlp", _mlp), torch.device("cuda"), steps=3)
    assert record["step_ms_median"] > 0 and any(op["op"] == "aten::addmm" for op in record["ops"])
    model, inputs, keywords = _mlp(torch.device("meta"))
    assert observe(H100, model, inputs, record, loss_fn=probe_loss, **keywords).matched  # the analytic run's ops find their kernels


def test_a_calibration_file_is_what_a_target_loads(tmp_path):
    path = tmp_path / "h100.json"
    ours = dataclasses.replace(TRUE, calibrated=True, source="measured in a test", simt_issue=0.2, simt_integer=0.3, power_exponent=1.5)
    save_calibration(path, H100, ours, measured="NVIDIA H100 80GB HBM3, torch 2.11")
    document = json.loads(path.read_text())
    assert document["gpu"] == "h100" and document["host_seconds"] == 20e-6 and document["efficiency"]["matmul"] == 0.6
    spec = gpu_spec(str(path))
    assert spec.name == "h100" and spec.memory_bytes == H100.memory_bytes
    assert spec.calibration.efficiency == ours.efficiency and spec.calibration.host_seconds == ours.host_seconds
    assert spec.calibration.simt_integer == ours.simt_integer and spec.calibration.power_exponent == ours.power_exponent
    assert spec.calibration.simt_issue == ours.simt_issue and document["simt_issue"] == 0.2
    # a file of an earlier modelprof calibrate, without the figures added since, loads with their defaults
    older = {k: v for k, v in document.items() if k not in ("simt_integer", "simt_issue", "power_exponent")}
    (tmp_path / "older.json").write_text(json.dumps(older))
    older_spec = gpu_spec(str(tmp_path / "older.json")).calibration
    assert (older_spec.simt_integer, older_spec.simt_issue) == (Calibration().simt_integer, Calibration().simt_issue)
    model, x, _ = _mlp(torch.device("cpu"))
    loaded = profile(model, x, target=path).predicted
    assert loaded.calibrated and loaded.calibration == "h100.json: measured in a test"
    expected = profile(model, x, target=dataclasses.replace(H100, calibration=ours)).predicted
    assert loaded.seconds == expected.seconds != profile(model, x, target="h100").predicted.seconds


GOOD = {
    "format": 3,
    "gpu": "a100-80gb",
    "source": "s",
    "efficiency": {"matmul": 0.7, "memory": 0.8},
    "gemm_half": {},
    "reduction_bandwidth": {},
    "kernel_seconds": 3e-6,
    "host_seconds": 1e-5,
    "view_seconds": 2e-6,
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpu": "a200"}, r":3: 'gpu': expected a GPU of the table \(h100, "),
        ({"efficiency": {"matmul": -1}}, r":5: 'efficiency': expected an object of positive numbers"),
        ({"efficiency": {"matmul": 0.7}}, r":5: 'efficiency': expected an object of positive numbers with 'memory'"),
        ({"host_seconds": "fast"}, r":12: 'host_seconds': expected a positive number of seconds"),
        ({"simt_issue": -0.1}, r":14: 'simt_issue': expected zero or a positive number"),
        ({"power_exponent": 0}, r":14: 'power_exponent': expected a positive number"),
        ({"format": 4}, r":2: 'format': expected 3 \(a calibration file written by modelprof calibrate\)"),
        ({"format": 1}, r":2: 'format': expected 3: this file is an older modelprof calibrate's, .* calibrate again"),
        ({"speed": 1}, r":14: 'speed': expected one of efficiency, format, "),
    ],
)
def test_a_bad_calibration_file_names_its_line_and_what_was_expected(tmp_path, change, message):
    path = tmp_path / "a100.json"
    path.write_text(json.dumps({**GOOD, **change}, indent=2))
    with pytest.raises(ValueError, match=f"{path.name}{message}"):
        load_calibration(path)
    good = load_calibration(_write(tmp_path / "good.json", GOOD)).calibration
    assert good.efficiency["matmul"] == 0.7
    # a file without simt_issue (written before it) prices its products' FMAs without issue slots lost, as it was fitted;
    # zero is a figure too (no loss), as is any positive one
    assert good.simt_issue == 0.0
    assert load_calibration(_write(tmp_path / "zero.json", {**GOOD, "simt_issue": 0})).calibration.simt_issue == 0.0
    assert load_calibration(_write(tmp_path / "some.json", {**GOOD, "simt_issue": 0.2})).calibration.simt_issue == 0.2


def test_a_calibration_file_of_the_format_before_still_loads_and_prices_pooling_by_its_bytes(tmp_path):
    """Format 2 had no pooling rates and no layer norm's cycles a row: such a file loads, and its model prices a
    max pool and a layer norm over short rows by their bytes, as when it was fitted; one written now has both."""
    older = load_calibration(_write(tmp_path / "older.json", {**GOOD, "format": 2}))
    assert "pool" not in older.calibration.efficiency and not older.calibration.reduction_cycles

    class Stem(nn.Module):
        def forward(self, x):
            return torch.nn.functional.layer_norm(torch.nn.functional.max_pool2d(x, 3, 2, 1), [56])

    x = torch.randn(8, 64, 112, 112)
    by_bytes = profile(Stem(), x, target=older).predicted
    now = tmp_path / "now.json"
    save_calibration(now, GPUS["a100-80gb"], GPUS["a100-80gb"].calibration, measured="a test")
    assert json.loads(now.read_text())["format"] == 3
    loaded = profile(Stem(), x, target=now).predicted
    assert {row.op: row.bound for row in by_bytes.ops} == {"aten.max_pool2d_with_indices": "memory", "aten.native_layer_norm": "memory"}
    assert {row.op: row.bound for row in loaded.ops} == {"aten.max_pool2d_with_indices": "compute", "aten.native_layer_norm": "compute"}


def _write(path, document):
    path.write_text(json.dumps(document, indent=2))
    return path


def test_a_calibration_file_that_is_not_json_says_where(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "format": 1,\n  "gpu": h100\n}\n')
    with pytest.raises(ValueError, match=r"broken.json:3: not JSON"):
        load_calibration(path)
    with pytest.raises(ValueError, match="cannot read the calibration file"):
        load_calibration(tmp_path / "missing.json")


def test_the_calibrate_command_says_what_it_needs(tmp_path, capsys):
    assert main(["calibrate", "--target", "h1000", "-o", str(tmp_path / "c.json")]) == 2
    assert "unknown target GPU 'h1000'" in capsys.readouterr().err
    assert main(["calibrate", "--target", "h100", "-o", str(tmp_path / "nowhere" / "c.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["calibrate", "--target", "h100", "-o", str(tmp_path / "c.json")]) == 2
        assert "no CUDA device is available here" in capsys.readouterr().err
        assert not (tmp_path / "c.json").exists()
