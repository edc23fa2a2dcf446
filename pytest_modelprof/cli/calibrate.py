"""``modelprof calibrate --target GPU -o FILE``: on a machine with the GPU, fit a target's
predicted-time model to the kernels measured there, into a file any machine can load."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

import torch

from ..engine.calibrate import errors
from ..engine.probes import PROBES
from ..engine.probes import calibrate as fit_to_measurements
from ..engine.targets.catalog import GPUS, gpu_spec, save_calibration
from .usage import CliError, check_output, common_options


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The ``calibrate`` subcommand and its options, added to the ``modelprof`` parser's ``commands``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "calibrate",
        parents=[common_options()],
        help="fit a target GPU's predicted-time model to kernels measured on that GPU, into a calibration file",
        description="On a machine with the GPU: run a set of probe steps (CNN, ViT, transformer, MLP, LSTM), time them and "
        "each kernel, fit the predicted-time model to them, and write a calibration file that --target FILE (and "
        "profile(..., target=FILE)) loads on any machine after, CPU-only CI runners included.",
    )
    parser.set_defaults(action=calibrate)
    parser.add_argument("--target", required=True, metavar="GPU", help=f"the GPU of the table this one is ({', '.join(GPUS)})")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="the calibration file to write (JSON)")
    parser.add_argument("--device", default="cuda", metavar="DEVICE", help="the CUDA device to measure (default: cuda)")
    return parser


def calibrate(options: argparse.Namespace, out: TextIO) -> int:
    """``modelprof calibrate``: measure the probes on this GPU, fit, write the calibration file."""
    try:
        gpu = gpu_spec(options.target)
    except (TypeError, ValueError) as error:
        raise CliError(str(error)) from None
    check_output("--output", options.output)
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
