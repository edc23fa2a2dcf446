"""The ``modelprof`` command: profile a model from the shell, print its reports, write
JSON, CSV and plots, and hold it against a budget file."""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import importlib.util
import json
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from . import ci
from .budgets import NEW, REGRESSED, BudgetError, check, load_budgets
from .compare import compare as compare_profiles
from .compare import parse_fail_on
from .engine import ProfileError, Timing, profile
from .engine.targets.gpus import GPUS, gpu_spec
from .engine.workload import DEVICE_KINDS, device_kind
from .report.compare import comparison_markdown, format_comparison
from .report.export import write_modules_csv, write_ops_csv
from .report.tables import format_memory_report, format_op_table, format_op_times, format_predicted, format_top, format_tree_table
from .report.text import format_header
from .session import ArtifactError, Artifacts, merge_sessions, read_artifacts

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
  modelprof torchvision.models:resnet50 --input 1x3x224x224
  modelprof torchvision.models:vit_h_14 --input 1x3x518x518 --device meta --train
  modelprof torchvision.models:vit_b_16 --input 32x3x224x224 --train --optimizer adamw --autocast bfloat16 --target h100
  modelprof my_models.py:build --input 8x128 --dtype int64 --kw vocab=32000 --depth 3 --ops
  modelprof torchvision.models:resnet18 --input 1x3x224x224 --budgets budgets --name resnet18

MODEL is package.module:callable, or path/to/file.py:callable (file.py alone calls its
`model` function); the callable returns an nn.Module. Integer inputs (--dtype int64)
are zeros, valid indices for any embedding. Analytic runs (--device meta) build the
model on the meta device when it can be built there: nothing is allocated.
"""


class CliError(Exception):
    """A one-line reason to stop."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelprof",
        description="Profile a PyTorch model: FLOPs and MACs per module and per operator, parameters, size.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    parser.add_argument("--device", default="cpu", help="cpu, cuda (cuda:N) or meta for analytic mode (default: cpu)")
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
    parser.add_argument("--traceback", action="store_true", help="on an error, print the full traceback, not one line")
    return parser


EXIT_USAGE = 2  # the command, its model or its inputs cannot be used (argparse's status)
EXIT_REGRESSED = 1  # the profile is over its budget
EXIT_INTERNAL = 3  # a fault of modelprof itself


def build_artifacts_parser(command: str) -> argparse.ArgumentParser:
    """``modelprof merge`` and ``modelprof compare``: commands on the JSON artifacts of pytest runs."""
    if command == "merge":
        parser = argparse.ArgumentParser(
            prog="modelprof merge",
            description="Merge the JSON artifacts (--modelprof-json DIR) of several pytest runs, the shards of a CI matrix, "
            "into one session: one summary, one verdict against the budget files, and with --update one write of the baselines.",
        )
        parser.add_argument("directories", nargs="+", metavar="DIR", help="a shard's artifact directory")
        parser.add_argument("-o", "--output", metavar="DIR", help="write the merged session's artifacts into DIR")
        parser.add_argument(
            "--budgets", metavar="DIR", help="the budget directory (default: the one the shards recorded, from the current directory)"
        )
        parser.add_argument("--update", action="store_true", help="write the shards' figures as the new baselines, as one run would")
        parser.add_argument(
            "--prune",
            action="store_true",
            help="with --update: remove stale entries (only if the shards together ran every collected test)",
        )
        parser.add_argument("--strict", action="store_true", help="fail when a profile has no budget entry")
    else:
        parser = argparse.ArgumentParser(
            prog="modelprof compare",
            description="Compare two sets of JSON artifacts (--modelprof-json DIR, or modelprof merge -o DIR), e.g. a pull "
            "request's base and head: each profile's metrics on both, the change, new and removed profiles.",
        )
        parser.add_argument("base", metavar="BASE_DIR", help="the artifacts of the base (the reference)")
        parser.add_argument("head", metavar="HEAD_DIR", help="the artifacts of the head (the change)")
        parser.add_argument(
            "--markdown", metavar="FILE", help="append the comparison as Markdown to FILE (a pull request comment, $GITHUB_STEP_SUMMARY)"
        )
        parser.add_argument(
            "--fail-on",
            action="append",
            default=[],
            metavar="RULE",
            help="exit 1 on such a change: gflops:+1%% (an increase of more than 1%%), peak_memory_mb:+50 (in the metric's unit), "
            "latency_ms:-10%% (a decrease), new, removed; repeatable or comma-separated",
        )
    parser.add_argument("--traceback", action="store_true", help="on an error, print the full traceback, not one line")
    return parser


ARTIFACT_COMMANDS = ("merge", "compare")


def build_calibrate_parser() -> argparse.ArgumentParser:
    """``modelprof calibrate``: fit a target's predicted-time model to kernels measured on the GPU at hand."""
    parser = argparse.ArgumentParser(
        prog="modelprof calibrate",
        description="On a machine with the GPU: run a set of probe steps (CNN, ViT, transformer, MLP, LSTM), time them and "
        "each kernel, fit the predicted-time model to them, and write a calibration file that --target FILE (and "
        "profile(..., target=FILE)) loads on any machine after, CPU-only CI runners included.",
    )
    parser.add_argument("--target", required=True, metavar="GPU", help=f"the GPU of the table this one is ({', '.join(GPUS)})")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the calibration file to write (JSON)")
    parser.add_argument("--device", default="cuda", metavar="DEVICE", help="the CUDA device to measure (default: cuda)")
    parser.add_argument("--traceback", action="store_true", help="on an error, print the full traceback, not one line")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The ``modelprof`` command; returns its exit status: 0, 1 over budget, 2 a usage error
    (one line on stderr; ``--traceback`` prints the whole chain), 3 an internal fault.

    ``modelprof merge ...`` and ``modelprof compare ...`` work on the JSON artifacts of pytest runs."""
    out = out or sys.stdout
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = arguments[0] if arguments and arguments[0] in (*ARTIFACT_COMMANDS, "calibrate") else None
    if command == "calibrate":
        options = build_calibrate_parser().parse_args(arguments[1:])
        action: Callable[[argparse.Namespace, TextIO], int] = calibrate
    elif command is not None:
        options = build_artifacts_parser(command).parse_args(arguments[1:])
        action = merge if command == "merge" else compare
    else:
        options = build_parser().parse_args(arguments)
        action = run
    try:
        return action(options, out)
    except CliError as error:
        if options.traceback:
            traceback.print_exception(error, file=sys.stderr)
        print(f"modelprof: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:
        if options.traceback:
            traceback.print_exception(error, file=sys.stderr)
        hint = "" if options.traceback else " (run again with --traceback for the details)"
        print(f"modelprof: internal error: {type(error).__name__}: {_one_line(error)}{hint}", file=sys.stderr)
        return EXIT_INTERNAL


def calibrate(options: argparse.Namespace, out: TextIO) -> int:
    """``modelprof calibrate``: measure the probes on this GPU, fit, write the calibration file."""
    from .engine.calibrate import PROBES, errors
    from .engine.calibrate import calibrate as fit_to_measurements
    from .engine.targets.gpus import save_calibration

    try:
        gpu = gpu_spec(options.target)
    except (TypeError, ValueError) as error:
        raise CliError(str(error)) from None
    _check_output("--output", options.output)
    device = torch.device(options.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise CliError(f"calibrate measures kernels on the GPU to calibrate, and no CUDA device is available here ({options.device})")
    name = torch.cuda.get_device_name(device)
    print(f"calibrating {gpu.name} on {name}: {len(PROBES)} probe steps", file=out)
    calibration, observed = fit_to_measurements(gpu, device=device)
    print(f"{'probe':50s} {'measured ms':>12s} {'predicted ms':>13s} {'error':>7s}", file=out)
    for probe, miss in zip(observed, errors(gpu, observed, calibration)):
        print(f"{probe.name:50s} {probe.step_seconds * 1e3:12.3f} {probe.step_seconds * (1 + miss) * 1e3:13.3f} {miss:+7.1%}", file=out)
    save_calibration(options.output, gpu, calibration, measured=f"{name}, torch {torch.__version__}")
    print(f"wrote {options.output}: profile(..., target={options.output!r}) predicts with it", file=out)
    return 0


def merge(options: argparse.Namespace, out: TextIO) -> int:
    """``modelprof merge``: the shards' artifacts as one session, checked against the budget files."""
    if options.prune and not options.update:
        raise CliError("--prune needs --update: pruning rewrites the budget files")
    shards = _read_artifacts(options.directories)
    recorded = sorted({shard.budgets for shard in shards})
    if options.budgets is None and len(recorded) > 1:
        raise CliError(f"the shards recorded different budget directories ({', '.join(recorded)}): say which with --budgets")
    root = Path.cwd()
    directory = Path(options.budgets) if options.budgets else root / recorded[0]
    try:
        budgets = load_budgets(directory, required=True, root=root)
        state = merge_sessions(shards, budgets, update=options.update, prune=options.prune, strict=options.strict)
    except (BudgetError, ArtifactError) as error:
        raise CliError(str(error)) from None
    state.finish()
    if options.output:
        state.write_json(Path(options.output))
    print(f"model budgets, merged from {len(shards)} runs ({len(state.records)} profiles)", file=out)
    for line in state.summary(root):
        print(line, file=out)
    verdicts = state.verdicts()
    if ci.in_github_actions():
        for line in ci.error_annotations(verdicts, root):
            print(line, file=out)
        if verdicts:
            ci.append_budget_table(state.rows())
    if options.output:
        print(f"wrote {options.output}", file=out)
    failed = state.errors or any(v.status == REGRESSED for v in verdicts) or (options.strict and any(v.status == NEW for v in verdicts))
    return EXIT_REGRESSED if failed else 0


def compare(options: argparse.Namespace, out: TextIO) -> int:
    """``modelprof compare``: each profile's metrics on base and head; ``--fail-on`` rules decide the exit status."""
    try:
        rules = [parse_fail_on(text) for item in options.fail_on for text in item.split(",") if text.strip()]
    except ValueError as error:
        raise CliError(str(error)) from None
    if options.markdown:
        _check_output("--markdown", options.markdown)
    base, head = _read_artifacts([options.base, options.head])
    rows = compare_profiles({n: p for n, _, p in base.records}, {n: p for n, _, p in head.records})
    print(f"model budgets: {options.base} (base) vs {options.head} (head)", file=out)
    for line in format_comparison(rows):
        print(line, file=out)
    if options.markdown:
        with open(options.markdown, "a", encoding="utf-8") as handle:
            handle.write(comparison_markdown(rows))
        print(f"appended the comparison to {options.markdown}", file=out)
    failures = [failure for rule in rules for row in rows if (failure := rule.failure(row)) is not None]
    for failure in failures:
        print(f"FAILED --fail-on {failure}", file=out)
    return EXIT_REGRESSED if failures else 0


def _read_artifacts(directories: list[str]) -> list[Artifacts]:
    try:
        return [read_artifacts(Path(directory)) for directory in directories]
    except ArtifactError as error:
        raise CliError(str(error)) from None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def run(options: argparse.Namespace, out: TextIO) -> int:
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
    device = _check_device(options.device)
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
        _check_output(flag, path)
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
            raise CliError(_with_memory_hint(str(error), device)) from error
    result.name = options.name or options.model
    _print_reports(result, options, out)
    _write_outputs(result, options, out)
    if budgets is not None:
        return _check_budget(result, options.name, budgets, out)
    return 0


def _check_output(flag: str, path: str | None) -> None:
    """An output file must be writable where it is asked for, before any work is done."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise CliError(f"{flag} {path}: is a directory; expected a file name")
    if not target.parent.is_dir():
        raise CliError(f"{flag} {path}: the directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise CliError(f"{flag} {path}: the directory {target.parent} is not writable")


def _with_memory_hint(message: str, device: str) -> str:
    if device != "meta" and ("allocate" in message or "out of memory" in message.lower()):
        return message + "; an analytic run allocates nothing: --device meta"
    return message


def make_inputs(shapes: list[tuple[int, ...]], dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    """Random floats, or zeros for integer inputs (valid indices for any embedding)."""
    make = torch.randn if dtype.is_floating_point else torch.zeros
    inputs = []
    for shape in shapes:
        try:
            inputs.append(make(shape, dtype=dtype, device=device))
        except (RuntimeError, MemoryError) as error:
            size = math.prod(shape) * dtype.itemsize / 1e9
            kind = str(dtype).removeprefix("torch.")
            raise CliError(
                f"cannot allocate an input of shape {'x'.join(map(str, shape))} ({size:,.1f} GB of {kind}): "
                "an analytic run allocates nothing: --device meta"
            ) from error
    return tuple(inputs)


def _count(text: str) -> int:
    """An argument that counts something: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return value


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    shapes = []
    for part in text.split(","):
        dims = part.strip().lower().split("x")
        if not all(d.isascii() and d.isdigit() and int(d) > 0 for d in dims):
            raise CliError(f"bad shape {part.strip()!r}: expected positive integers joined by x, e.g. 1x3x224x224")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def parse_keywords(items: list[str]) -> dict[str, Any]:
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise CliError(f"bad --kw {item!r}: expected KEY=VALUE, e.g. num_classes=10")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # not a literal: a string
            kwargs[key] = value
    return kwargs


def _check_device(device: str) -> str:
    kind = device_kind(device)
    if kind is None:
        raise CliError(f"unknown device {device!r}: expected cpu, cuda, cuda:N or meta")
    if kind == "cuda" and not torch.cuda.is_available():
        raise CliError(f"device {device!r} is not available on this machine (no CUDA GPU)")
    if kind not in DEVICE_KINDS:
        raise CliError(f"unsupported device {device!r}: expected cpu, cuda, cuda:N or meta")
    return device


def load_factory(spec: str) -> Any:
    """The callable that ``spec`` names: ``package.module:callable`` or ``file.py[:callable]``."""
    target, separator, attribute = spec.rpartition(":")
    if not separator or spec.endswith(".py"):
        target, attribute = spec, ""
    if target.endswith(".py"):
        module = _import_file(spec, Path(target))
        attribute = attribute or "model"
    else:
        if not attribute:
            raise CliError(f"unknown model {spec!r}: expected package.module:callable, e.g. torchvision.models:resnet50")
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise CliError(f"unknown model {spec!r}: {error}") from error
        except Exception as error:  # the module itself failed while it was imported
            raise CliError(f"importing {target} raised {type(error).__name__}: {_one_line(error)}") from error
    factory = getattr(module, attribute, None)
    if factory is None:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attribute, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise CliError(f"unknown model {spec!r}: {module.__name__} has no {attribute!r}{hint}")
    if not callable(factory):
        raise CliError(f"unknown model {spec!r}: {attribute!r} is not callable")
    return factory


def _import_file(spec: str, path: Path) -> Any:
    if not path.is_file():
        raise CliError(f"unknown model {spec!r}: no file {path}")
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"unknown model {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise CliError(f"importing {path} raised {type(error).__name__}: {_one_line(error)}") from error
    finally:
        sys.path.pop(0)
    return module


def build_model(factory: Any, kwargs: dict[str, Any], analytic: bool) -> nn.Module:
    try:
        if analytic:
            try:
                with torch.device("meta"):
                    model = factory(**kwargs)
            except NotImplementedError:  # needs real values while it builds (e.g. torchvision's RegNet)
                model = factory(**kwargs)
        else:
            model = factory(**kwargs)
    except Exception as error:
        name = getattr(factory, "__qualname__", repr(factory))
        message = f"building the model: {name}({_arguments(kwargs)}) raised {type(error).__name__}: {_one_line(error)}"
        raise CliError(_with_memory_hint(message, "meta" if analytic else "cpu")) from error
    if not isinstance(model, nn.Module):
        raise CliError(f"the model's callable returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _arguments(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in kwargs.items())


def model_on_meta(model: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))


def _load_budgets(directory: str) -> Any:
    try:
        return load_budgets(Path(directory), required=True, root=Path.cwd())
    except BudgetError as error:
        raise CliError(str(error)) from None


def _print_reports(result: Any, options: argparse.Namespace, out: TextIO) -> None:
    human = not options.raw
    print(format_header(result), file=out)
    print(file=out)
    print(format_tree_table(result, depth=options.depth, ignore=options.ignore, human=human, ops=options.ops), file=out)
    print(file=out)
    if options.depth >= 1:
        print(format_top(result, k=min(options.top, 5), depths=range(1, options.depth + 1)), file=out)
        print(file=out)
    print(format_op_table(result, top=options.top, human=human), file=out)
    if result.op_times:
        print(file=out)
        print(format_op_times(result, top=options.top, human=human), file=out)
    if result.memory is not None:
        print(file=out)
        print(format_memory_report(result, top_parameters=options.top), file=out)
    if result.predicted is not None:
        print(file=out)
        print(format_predicted(result, top=options.top), file=out)


def _write_outputs(result: Any, options: argparse.Namespace, out: TextIO) -> None:
    if options.trace:
        print(f"wrote {options.trace}", file=out)
    if options.json:
        Path(options.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {options.json}", file=out)
    if options.csv:
        modules = Path(options.csv)
        ops = modules.with_name(modules.stem + ".ops.csv")
        with modules.open("w", encoding="utf-8", newline="") as handle:
            write_modules_csv(result, handle)
        with ops.open("w", encoding="utf-8", newline="") as handle:
            write_ops_csv(result, handle)
        print(f"wrote {modules} and {ops}", file=out)
    if options.plot:
        from .report.plots import plot_memory_timeline, plot_module_flops, plot_roofline

        flops_plot = Path(options.plot)
        written = [flops_plot]
        try:
            plot_module_flops(result, flops_plot, depth=1)
            if result.memory is not None:
                written.append(flops_plot.with_name(flops_plot.stem + ".memory.png"))
                plot_memory_timeline(result, written[-1])
            if result.predicted is not None:  # a --target GPU: the roofline of its predicted step
                written.append(flops_plot.with_name(flops_plot.stem + ".roofline.png"))
                plot_roofline(result, written[-1])
        except ImportError as error:
            raise CliError(str(error)) from None
        print("wrote " + ", ".join(str(path) for path in written), file=out)


def _check_budget(result: Any, name: str, budgets: Any, out: TextIO) -> int:
    budget = budgets.profiles.get(name)
    if budget is None:
        print(f"\nno budget for {name!r} in {budgets.directory}", file=out)
        return 0
    verdict = check(result, name, budget)
    print(f"\nbudget of {name!r} ({budget.shown}:{budget.line}): {verdict.status}", file=out)
    for finding in verdict.findings:
        print(f"  {finding.status:9} {finding.message()}", file=out)
    return 1 if verdict.status == REGRESSED else 0


@contextmanager
def progress(stage: str, after: float = 1.5, stream: TextIO | None = None) -> Iterator[None]:
    """Say on stderr what is going on, once the work has taken longer than ``after`` seconds."""
    stream = stream or sys.stderr
    done = threading.Event()
    start = time.perf_counter()
    interactive = stream.isatty()

    def report() -> None:
        if done.wait(after):
            return
        while True:
            elapsed = time.perf_counter() - start
            if interactive:
                stream.write(f"\rmodelprof: {stage}... {elapsed:.0f} s")
            else:
                stream.write(f"modelprof: {stage}...\n")
            stream.flush()
            if not interactive or done.wait(0.5):
                return

    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if interactive and time.perf_counter() - start > after:
            stream.write("\r\033[K")
            stream.flush()


if __name__ == "__main__":
    sys.exit(main())
