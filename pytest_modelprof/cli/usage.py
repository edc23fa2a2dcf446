"""How the command stops: the exit statuses, the one-line usage error, and the checks of its
arguments that every subcommand shares (output files, artifact directories), made before any
work is done."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..artifacts import ArtifactError, Artifacts, read_artifacts

EXIT_USAGE = 2  # the command, its model or its inputs cannot be used (argparse's status)
EXIT_REGRESSED = 1  # the profile is over its budget
EXIT_INTERNAL = 3  # a fault of modelprof itself


class CliError(Exception):
    """A one-line reason to stop."""


def common_options() -> argparse.ArgumentParser:
    """The options of every subcommand, as a parent parser."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--traceback", action="store_true", help="on an error, print the full traceback, not one line")
    return parser


def one_line(error: BaseException) -> str:
    """``error``'s message on one line, cut at 300 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def check_output(flag: str, path: str | None) -> None:
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


def read_artifact_directories(directories: list[str]) -> list[Artifacts]:
    """The artifacts in each of ``directories``; a usage error naming the first file that cannot be read."""
    try:
        return [read_artifacts(Path(directory)) for directory in directories]
    except ArtifactError as error:
        raise CliError(str(error)) from None
