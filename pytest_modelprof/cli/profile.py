"""``modelprof profile MODEL --input SHAPE``: profile a model from the shell, print its reports,
write JSON, CSV and plots, and hold it against a budget file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

from ..budgets import REGRESSED, BudgetError, check, load_budgets
from ..engine import ProfileError, Timing, profile
from ..engine.targets.catalog import GPUS, gpu_spec
from ..options import DEVICES, OptionError, check_device
from .loading import build_model, load_factory, make_inputs, model_on_meta, parse_keywords, parse_shapes, with_memory_hint, with_shape_hint
from .output import print_reports, progress, write_outputs
from .usage import EXIT_REGRESSED, CliError, check_output, common_options

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
}

AUTOCAST = {"bfloat16": torch.bfloat16, "float16": torch.float16}

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params),
    "adamw": lambda params: torch.optim.AdamW(params),
}

EPILOG = """\
examples:
  modelprof profile torchvision.models:resnet50 --input 1x3x224x224
  modelprof profile torchvision.models:vit_h_14 --input 1x3x518x518 --kw image_size=518 --device meta --train
  modelprof profile torchvision.models:vit_b_16 --input 32x3x224x224 --train --optimizer adamw --autocast bfloat16 --target h100
  modelprof profile my_models.py:build --input 8x128 --dtype int64 --kw vocab=32000 --depth 3 --ops
  modelprof profile torchvision.models:resnet18 --input 1x3x224x224 --budgets budgets --name resnet18

MODEL is package.module:callable, or path/to/file.py:callable (file.py alone calls its
`model` function); the callable returns an nn.Module. Integer inputs (--dtype int64)
are zeros, valid indices for any embedding. Analytic runs (--device meta) build the
model on the meta device when it can be built there: nothing is allocated.
`modelprof MODEL ...`, without the word profile, is the same command.
"""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The ``profile`` subcommand and its options, added to the ``modelprof`` parser's ``commands``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "profile",
        parents=[common_options()],
        help="profile a model: FLOPs and MACs per module and operator, memory, time, a target GPU's step",
        description="Profile a PyTorch model: FLOPs and MACs per module and per operator, parameters, size.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(action=run)
    parser.add_argument("model", help="package.module:callable or path/to/file.py[:callable]")
    parser.add_argument(
        "--input",
        "-i",
        required=True,
        metavar="SHAPE[,SHAPE...]",
        help="input shapes, dimensions joined by x (1x3x224x224); inputs separated by commas",
    )
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype of the inputs (default: float32)")
    parser.add_argument(
        "--kw",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the model's callable (a Python literal), repeatable",
    )
    parser.add_argument("--train", action="store_true", help="profile a training step: forward, sum loss, backward")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), help="with --train: add this optimizer's step (default hyperparameters)")
    parser.add_argument(
        "--autocast",
        choices=sorted(AUTOCAST),
        help="run the forward pass (and the loss) under torch.autocast in this precision, as mixed-precision training does",
    )
    parser.add_argument("--device", default="cpu", help=f"{DEVICES} (default: cpu)")
    parser.add_argument(
        "--target",
        metavar="GPU",
        help=f"profile the step as it runs on this GPU, analytically, with no GPU needed ({', '.join(GPUS)}, or a calibration "
        "file of modelprof calibrate): its memory, whether it fits, and its predicted time",
    )
    parser.add_argument("--depth", type=_count, default=2, metavar="N", help="depth of the module tree (default: 2)")
    parser.add_argument(
        "--top", type=_count, default=10, metavar="K", help="rows of the operator table, module types per depth (default: 10)"
    )
    parser.add_argument("--ops", action="store_true", help="show each module's operators in the module tree")
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="TYPE|PATH",
        help="leave a module type or path (and what it contains) out of the tree, repeatable",
    )
    parser.add_argument("--raw", action="store_true", help="raw numbers instead of k/M/G/T prefixes")
    parser.add_argument("--json", metavar="FILE", help="write the profile as JSON")
    parser.add_argument("--csv", metavar="FILE", help="write the module tree as CSV to FILE, the operator table to FILE's stem + .ops.csv")
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="draw FLOPs per top-level module into a PNG, memory over time into FILE's stem + .memory.png, and with --target "
        "the roofline of the predicted step into FILE's stem + .roofline.png (needs matplotlib)",
    )
    parser.add_argument(
        "--latency", action="store_true", help="time the workload on real tensors too (median, spread, throughput, achieved FLOP/s)"
    )
    parser.add_argument("--layers", action="store_true", help="with --latency: per-module and per-operator times (torch.profiler)")
    parser.add_argument("--time-budget", type=float, default=2.0, metavar="S", help="with --latency: seconds of timed repeats (default: 2)")
    parser.add_argument("--trace", metavar="FILE", help="with --layers: write a Chrome/Perfetto trace (JSON) of the profiled calls")
    parser.add_argument("--budgets", metavar="DIR", help="hold the profile against the budget files in DIR (needs --name)")
    parser.add_argument("--name", help="the profile's name in the budget files")
    return parser


def _count(text: str) -> int:
    """An argument that counts something: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return value


def run(options: argparse.Namespace, out: TextIO) -> int:
    """``modelprof profile``: build the model and its inputs, profile, print and write; 1 when over its budget."""
    if options.budgets and not options.name:
        raise CliError("--budgets needs --name: the profile's name in the budget files")
    if options.optimizer and not options.train:
        raise CliError("--optimizer needs --train: an optimizer step follows a backward pass")
    if (options.layers or options.trace) and not options.latency:
        raise CliError("--layers and --trace need --latency: they come from timed calls")
    if options.trace:
        options.layers = True
    try:
        timing = Timing(budget=options.time_budget, layers=options.layers, trace=options.trace) if options.latency else None
    except ValueError as error:
        raise CliError(str(error)) from None
    shapes = parse_shapes(options.input)
    try:
        device = check_device(options.device, available=True)
    except OptionError as error:
        raise CliError(str(error)) from None
    if options.target is not None:
        try:
            gpu_spec(options.target)
        except ValueError as error:
            if options.target.strip().lower().endswith(".json"):
                raise CliError(f"--target {error}") from None  # a calibration file: what is wrong in it
            raise CliError(f"unknown --target {options.target!r}: expected one of {', '.join(GPUS)} or a calibration file") from None
        if options.latency:
            raise CliError("--latency measures this machine; a --target GPU's time is predicted (shown without --latency)")
        device = "meta"
    for flag, path in (("--json", options.json), ("--csv", options.csv), ("--plot", options.plot), ("--trace", options.trace)):
        check_output(flag, path)
    factory = load_factory(options.model)
    kwargs = parse_keywords(options.kw)
    budgets = _load_budgets(options.budgets) if options.budgets else None
    with progress("building the model"):
        model = build_model(factory, kwargs, analytic=device == "meta")
    dtype = DTYPES[options.dtype]
    inputs = make_inputs(shapes, dtype, "meta" if model_on_meta(model) else "cpu")
    if dtype.is_floating_point and dtype != torch.float32:
        model = model.to(dtype)
    optimizer = OPTIMIZERS[options.optimizer](model.parameters()) if options.optimizer else None
    with progress("profiling"):
        try:
            result = profile(
                model,
                inputs,
                train=options.train,
                device=device,
                optimizer=optimizer,
                autocast=AUTOCAST[options.autocast] if options.autocast else None,
                latency=timing or False,
                target=options.target,
            )
        except ProfileError as error:
            raise CliError(with_shape_hint(with_memory_hint(str(error), device), model, shapes)) from error
    result.name = options.name or options.model
    print_reports(result, options, out)
    write_outputs(result, options, out)
    if budgets is not None:
        return _check_budget(result, options.name, budgets, out)
    return 0


def _load_budgets(directory: str) -> Any:
    try:
        return load_budgets(Path(directory), required=True, root=Path.cwd())
    except BudgetError as error:
        raise CliError(str(error)) from None


def _check_budget(result: Any, name: str, budgets: Any, out: TextIO) -> int:
    budget = budgets.profiles.get(name)
    if budget is None:
        print(f"\nno budget for {name!r} in {budgets.directory}", file=out)
        return 0
    verdict = check(result, name, budget)
    print(f"\nbudget of {name!r} ({budget.shown}:{budget.line}): {verdict.status}", file=out)
    for finding in verdict.findings:
        print(f"  {finding.status:9} {finding.message()}", file=out)
    return EXIT_REGRESSED if verdict.status == REGRESSED else 0
