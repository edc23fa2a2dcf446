"""The modelprof command, called as a user would."""

import argparse
import csv
import io
import json
import subprocess
import sys
import time
from importlib import resources

import jsonschema
import pytest
import torch
from torch import nn

from pytest_modelprof import profile
from pytest_modelprof.cli import COMMANDS, build_parser, main
from pytest_modelprof.cli.output import progress

SMALL = ["torchvision.models:resnet18", "--input", "1x3x64x64", "--kw", "num_classes=10"]


def run(*args):
    out = io.StringIO()
    return main(list(args), out=out), out.getvalue()


def test_prints_header_tree_top_types_and_operators():
    status, text = run(*SMALL, "--depth", "1")
    assert status == 0
    assert text.startswith("torchvision.models:resnet18: inference (cpu)\n")
    assert "├── layer1   Sequential" in text
    assert "top 5 by macs: Sequential" in text
    assert "aten.convolution" in text


def test_the_installed_command_and_its_exit_codes(tmp_path):
    command = [sys.executable, "-m", "pytest_modelprof.cli"]
    ok = subprocess.run([*command, *SMALL, "--raw", "--top", "3"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "aten.convolution" in ok.stdout
    unknown = subprocess.run([*command, "torchvision.models:resnet5", "--input", "1x3x8x8"], capture_output=True, text=True)
    assert unknown.returncode == 2
    assert (
        unknown.stderr
        == "modelprof: error: unknown model 'torchvision.models:resnet5': torchvision.models has no 'resnet5'; did you mean 'resnet50'?\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["torchvision.models:resnet18", "--input", "1x3xa"],
            "bad shape '1x3xa': expected positive integers joined by x, e.g. 1x3x224x224",
        ),
        (["no.such.package:model", "--input", "1"], "unknown model 'no.such.package:model': No module named 'no'"),
        (["torchvision.models", "--input", "1"], "unknown model 'torchvision.models': expected package.module:callable"),
        (["torchvision.models:resnet18", "--input", "1x3x8x8", "--device", "tpu"], "unknown device 'tpu'"),
        (["torchvision.models:resnet18", "--input", "1x3x8x8", "--kw", "oops"], "bad --kw 'oops': expected KEY=VALUE"),
        (["torchvision.models:resnet18", "--input", "1x3", "--kw", "num_classes=3"], "raised RuntimeError"),
        (["torchvision.models:resnet18", "--input", "1x3x8x8", "--budgets", "b"], "--budgets needs --name"),
        (["torchvision.models:resnet18", "--input", "1x3x8x8", "--optimizer", "adam"], "--optimizer needs --train"),
    ],
    ids=[
        "bad-shape",
        "unknown-package",
        "no-callable",
        "unknown-device",
        "bad-keyword",
        "model-raises",
        "budgets-without-name",
        "optimizer-without-train",
    ],
)
def test_errors_are_one_line(args, message, capsys):
    assert main(args, out=io.StringIO()) == 2
    error = capsys.readouterr().err
    assert error.startswith("modelprof: error: ") and message in error
    assert error.count("\n") == 1


def _files(tmp_path):
    (tmp_path / "raising.py").write_text("def model():\n    raise ValueError('no weights here')\n")
    (tmp_path / "broken_import.py").write_text("raise RuntimeError('boom at import')\n")


@pytest.mark.parametrize(
    "args, message",
    [
        (["{tmp}/raising.py", "--input", "1x3"], "building the model: model() raised ValueError: no weights here"),
        (["{tmp}/broken_import.py", "--input", "1x3"], "importing {tmp}/broken_import.py raised RuntimeError: boom at import"),
        (["broken_import:model", "--input", "1x3"], "importing broken_import raised RuntimeError: boom at import"),
        (["torchvision.models:resnet18", "--input", "1x\u00b2"], "bad shape '1x\u00b2': expected positive integers joined by x"),
        (
            ["torchvision.models:resnet18", "--input", "1x3x8x8", "--kw", "num_classes=ten"],
            "building the model: resnet18(num_classes='ten') raised TypeError",
        ),
        (
            ["torchvision.models:resnet18", "--input", "100000x100000x100"],
            "cannot allocate an input of shape 100000x100000x100 (4,000.0 GB of float32): an analytic run allocates nothing: --device meta",
        ),
        (
            ["torchvision.models:resnet18", "--input", "1x3x8x8", "--json", "{tmp}/no/dir/p.json"],
            "--json {tmp}/no/dir/p.json: the directory {tmp}/no/dir does not exist",
        ),
        (
            ["torchvision.models:resnet18", "--input", "1x3x8x8", "--csv", "{tmp}/no/p.csv"],
            "--csv {tmp}/no/p.csv: the directory {tmp}/no does not exist",
        ),
        (["torchvision.models:resnet18", "--input", "1x3x8x8", "--json", "{tmp}"], "--json {tmp}: is a directory; expected a file name"),
    ],
    ids=[
        "factory-raises",
        "file-fails-at-import",
        "module-fails-at-import",
        "unicode-digit",
        "bad-keyword-value",
        "too-large",
        "json-dir",
        "csv-dir",
        "json-is-dir",
    ],
)
def test_bad_input_is_one_line_with_status_2(tmp_path, monkeypatch, capsys, args, message):
    _files(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = [a.format(tmp=tmp_path) for a in args]
    assert main(args, out=io.StringIO()) == 2
    error = capsys.readouterr().err
    assert error == f"modelprof: error: {message.format(tmp=tmp_path)}\n" or (
        error.startswith(f"modelprof: error: {message.format(tmp=tmp_path)}") and error.count("\n") == 1
    )
    assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob("*.csv"))


def test_traceback_shows_the_whole_chain(tmp_path, capsys):
    _files(tmp_path)
    assert main([str(tmp_path / "raising.py"), "--input", "1x3", "--traceback"], out=io.StringIO()) == 2
    error = capsys.readouterr().err
    assert "Traceback (most recent call last)" in error and "raise ValueError('no weights here')" in error
    assert error.rstrip().endswith("modelprof: error: building the model: model() raised ValueError: no weights here")


def test_a_budget_regression_exits_1_and_an_internal_fault_3(tmp_path, monkeypatch, capsys):
    budgets = tmp_path / "budgets"
    budgets.mkdir()
    (budgets / "b.toml").write_text('[profiles."r18"]\nmax_params = 10\n')
    assert main([*SMALL, "--budgets", str(budgets), "--name", "r18"], out=io.StringIO()) == 1

    def fault(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr("pytest_modelprof.cli.output.format_header", fault)
    assert main(SMALL, out=io.StringIO()) == 3
    # the last line: on a busy machine the progress line of a slow profile may come first
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "modelprof: internal error: KeyError: 'a bug' (run again with --traceback for the details)"
    )


def test_unavailable_device(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["torchvision.models:resnet18", "--input", "1x3x8x8", "--device", "cuda"], out=io.StringIO()) == 2
    assert capsys.readouterr().err == "modelprof: error: device 'cuda' is not available on this machine (no CUDA GPU)\n"


def test_model_from_a_file_and_integer_inputs(tmp_path):
    (tmp_path / "tiny.py").write_text(
        "import torch.nn as nn\n\ndef model(vocab=100):\n    return nn.Sequential(nn.Embedding(vocab, 8), nn.Linear(8, 2))\n"
        "\ndef other():\n    return nn.Linear(3, 3)\n"
    )
    status, text = run(str(tmp_path / "tiny.py"), "--input", "2x5", "--dtype", "int64", "--kw", "vocab=50", "--raw")
    assert status == 0
    lines = text.splitlines()
    embedding = next(line for line in lines if line.startswith("├── 0"))
    assert embedding.split()[2:4] == ["Embedding", "400"]  # 50 x 8 weights
    status, text = run(f"{tmp_path / 'tiny.py'}:other", "--input", "4x3", "--raw")
    assert status == 0 and "Linear" in text


def test_analytic_run_builds_on_meta(tmp_path):
    status, text = run("torchvision.models:vit_b_16", "--input", "1x3x224x224", "--device", "meta", "--depth", "1", "--top", "3")
    assert status == 0
    assert "inference (analytic, as on cpu)" in text
    assert "17.56 GMACs" in text  # as torchvision publishes


def test_json_csv_and_plot(tmp_path):
    files = {"json": tmp_path / "p.json", "csv": tmp_path / "p.csv", "plot": tmp_path / "p.png"}
    status, _ = run(*SMALL, "--train", "--json", str(files["json"]), "--csv", str(files["csv"]), "--plot", str(files["plot"]))
    assert status == 0
    data = json.loads(files["json"].read_text())
    schema = json.loads(resources.files("pytest_modelprof").joinpath("schema", "profile.schema.json").read_text())
    jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/profile"}).validate(data)
    assert data["train"] is True
    rows = list(csv.DictReader(io.StringIO(files["csv"].read_text())))
    assert rows[0]["path"] == "" and int(rows[0]["forward_flops"]) == data["forward_flops"]
    ops = list(csv.DictReader(io.StringIO((tmp_path / "p.ops.csv").read_text())))
    assert sum(int(r["flops"]) for r in ops) == data["flops"]
    assert files["plot"].read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "p.memory.png").read_bytes()[:4] == b"\x89PNG"


def test_budget_check(tmp_path):
    budgets = tmp_path / "budgets"
    budgets.mkdir()
    (budgets / "cli.toml").write_text('[profiles."resnet18"]\nmax_params = 1_000_000\n')
    status, text = run(*SMALL, "--budgets", str(budgets), "--name", "resnet18")
    assert status == 1
    assert "regressed params: measured 11,181,642 params, allowed 1,000,000 params (max_params)" in text
    (budgets / "cli.toml").write_text('[profiles."resnet18"]\nmax_params = 12_000_000\n')
    assert run(*SMALL, "--budgets", str(budgets), "--name", "resnet18")[0] == 0


def _subcommands(parser):
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert set(_subcommands(build_parser())) == set(COMMANDS)
    for command in COMMANDS:
        assert f"    {command}" in text
    assert "without the word profile, is `modelprof profile MODEL" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_a_subcommand_s_help_lists_every_option(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: modelprof {command} ")
    for action in _subcommands(build_parser())[command]._actions:
        for flag in action.option_strings:
            assert flag in text
    if command == "profile":
        assert "examples:" in text and "package.module:callable" in text


def test_a_model_without_a_subcommand_is_profiled(capsys):
    shorthand, full = run(*SMALL, "--raw", "--top", "3"), run("profile", *SMALL, "--raw", "--top", "3")
    assert shorthand[0] == full[0] == 0
    assert shorthand[1] == full[1]


def test_progress_is_shown_only_for_slow_work():
    stream = io.StringIO()
    with progress("quick", after=60, stream=stream):
        pass
    assert stream.getvalue() == ""
    with progress("slow", after=0.05, stream=stream):
        deadline = time.monotonic() + 30  # however busy the machine: the line comes once the work outlasts 0.05 s
        while not stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert stream.getvalue() == "modelprof: slow...\n"


def test_training_step_with_an_optimizer(tmp_path):
    path = tmp_path / "step.json"
    status, text = run(*SMALL, "--train", "--optimizer", "adamw", "--device", "meta", "--json", str(path))
    assert status == 0
    data = json.loads(path.read_text())
    # AdamW: 14 FLOPs per parameter element, plus one step-counter increment per tensor
    assert data["optimizer_flops"] == 14 * data["params"] + 62
    assert "optimizer 156.54 M" in text


def test_a_mixed_precision_step(tmp_path):
    # torch.autocast casts a linear layer's input, weight and bias to bfloat16 in the forward pass
    path = tmp_path / "step.json"
    linear = ["torch.nn:Linear", "--kw", "in_features=8", "--kw", "out_features=4", "--input", "2x8", "--device", "meta"]
    status, _ = run(*linear, "--train", "--autocast", "bfloat16", "--json", str(path))
    assert status == 0
    casts = [row for row in json.loads(path.read_text())["ops"] if row["op"] == "aten._to_copy" and row["phase"] == "forward"]
    assert sum(row["calls"] for row in casts) == 3
    status, _ = run(*linear, "--train", "--json", str(path))
    assert not [row for row in json.loads(path.read_text())["ops"] if row["op"] == "aten._to_copy" and row["phase"] == "forward"]


def test_latency_with_layer_times_and_a_trace(tmp_path):
    trace = tmp_path / "trace.json"
    status, text = run(*SMALL, "--latency", "--time-budget", "0.3", "--trace", str(trace), "--top", "5")
    assert status == 0
    header = text.split("\n\n")[0]
    assert "  latency " in header and "median of" in header and "samples/s" in header and "FLOP/s achieved" in header
    assert "fwd time" in text and "self fwd" in text  # time columns in the module tree
    table = text[text.index("operator  ", text.index("self CPU") - 200) :].splitlines()
    assert "self CPU" in table[0] and len(table) > 5 and all(line.startswith("aten::") for line in table[1:6])
    assert f"wrote {trace}" in text
    assert any(e.get("name") == "modelprof::layer1" for e in json.loads(trace.read_text())["traceEvents"])


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--layers"], "--layers and --trace need --latency"), (["--latency", "--time-budget", "0"], "positive number of seconds")],
)
def test_latency_option_errors(args, message, capsys):
    assert main([*SMALL, *args], out=io.StringIO()) == 2
    assert message in capsys.readouterr().err


def test_a_target_gpu_prints_its_memory_and_predicted_step(capsys):
    out = io.StringIO()
    assert main([*SMALL, "--train", "--optimizer", "adamw", "--target", "h100", "--top", "3"], out=out) == 0
    text = out.getvalue()
    assert "predicted step on h100: " in text and "fitted on 9 H100 steps" in text
    assert "memory: fits in its 85.52 GB" in text
    assert "h100 time" in text.splitlines()[5]  # the module tree's column of predicted kernel time
    table = text[text.index("predicted step on h100") :].splitlines()
    assert table[2].split()[:1] == ["operator"] and len(table) == 3 + 3  # the header, memory, columns and 3 rows
    assert main([*SMALL, "--target", "h1000"], out=io.StringIO()) == 2
    assert "unknown --target 'h1000': expected one of h100, h100-pcie" in capsys.readouterr().err


def test_a_target_gpu_s_roofline_plot(tmp_path):
    out = io.StringIO()
    plot = tmp_path / "p.png"
    assert main([*SMALL, "--train", "--target", "h100", "--plot", str(plot)], out=out) == 0
    roofline = tmp_path / "p.roofline.png"
    assert roofline.read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {plot}, {tmp_path / 'p.memory.png'}, {roofline}" in out.getvalue()


def test_a_roofline_needs_a_predicted_step(tmp_path):
    from pytest_modelprof.report.plots import plot_roofline

    with pytest.raises(ValueError, match="no predicted time"):
        plot_roofline(profile(nn.Linear(4, 4), torch.ones(1, 4)), tmp_path / "r.png")


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--top", "-1", "argument --top: expected a whole number, 0 or more, got '-1'"),
        ("--depth", "two", "argument --depth: expected a whole number, 0 or more, got 'two'"),
    ],
)
def test_counts_out_of_range_are_usage_errors(flag, value, message, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["torchvision.models:resnet18", "--input", "1x3x8x8", flag, value], out=io.StringIO())
    assert exit.value.code == 2
    assert capsys.readouterr().err.endswith(f"modelprof profile: error: {message}\n")


def test_a_dimension_over_torch_s_limit_is_a_usage_error(capsys):
    assert main(["torchvision.models:resnet18", "--input", "99999999999999999999x4"], out=io.StringIO()) == 2
    assert capsys.readouterr().err == (
        "modelprof: error: bad shape '99999999999999999999x4': dimension 0 is 99999999999999999999, "
        "over torch's limit of 9223372036854775807 (2**63 - 1)\n"
    )


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_shape_of_more_bytes_than_torch_holds_is_a_usage_error_on_any_device(capsys, device):
    # each size fits, their product does not: 2**62 x 4 float32 elements are 2**66 bytes
    arguments = ["torch.nn:Linear", "--kw", "in_features=4", "--kw", "out_features=2", "--input", f"{2**62}x4", "--device", device]
    assert main(arguments, out=io.StringIO()) == 2
    assert capsys.readouterr().err == (
        f"modelprof: error: bad shape '{2**62}x4': {2**64:,} elements of 4 bytes, over torch's limit of 2**63 - 1 bytes\n"
    )


def test_sizes_separated_by_commas_get_a_hint_that_x_joins_them(capsys):
    assert main(["torchvision.models:resnet18", "--input", "1,3,8,8", "--device", "meta"], out=io.StringIO()) == 2
    assert capsys.readouterr().err == (
        "modelprof: error: module '<root>' (ResNet) raised TypeError: ResNet.forward() takes 2 positional arguments but 5 were given; "
        "x joins one input's sizes (--input 1x3x8x8), commas separate inputs\n"
    )


def test_inputs_a_model_takes_get_no_comma_hint(tmp_path, capsys):
    # two one-dimensional inputs a forward of two arguments takes: whatever fails, the commas were meant
    (tmp_path / "pair.py").write_text(
        "import torch.nn as nn\n\nclass Pair(nn.Module):\n    def forward(self, a, b):\n        raise ValueError('no pairs today')\n"
        "\ndef model():\n    return Pair()\n"
    )
    assert main([str(tmp_path / "pair.py"), "--input", "3,4"], out=io.StringIO()) == 2
    error = capsys.readouterr().err
    assert "no pairs today" in error and "x joins" not in error


def test_did_you_mean_prefers_the_same_name_in_another_case(capsys):
    assert main(["torchvision.models:ResNet18", "--input", "1x3x8x8"], out=io.StringIO()) == 2
    assert capsys.readouterr().err == (
        "modelprof: error: unknown model 'torchvision.models:ResNet18': torchvision.models has no 'ResNet18'; did you mean 'resnet18'?\n"
    )


def test_the_help_s_examples_are_commands_the_command_takes():
    import shlex

    from pytest_modelprof.cli import build_parser
    from pytest_modelprof.cli.profile import EPILOG

    examples = [shlex.split(line)[1:] for line in EPILOG.splitlines() if line.strip().startswith("modelprof ")]
    assert len(examples) >= 3
    for arguments in examples:
        build_parser().parse_args(arguments)


def test_the_help_s_largest_example_profiles_analytically(capsys):
    # ViT-H/14 at 518 pixels, a training step on the meta device: the model takes that image size
    assert (
        main(
            ["torchvision.models:vit_h_14", "--input", "1x3x518x518", "--kw", "image_size=518", "--device", "meta", "--train"],
            out=io.StringIO(),
        )
        == 0
    )
