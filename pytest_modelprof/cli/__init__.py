"""The ``modelprof`` command: one parser with a subcommand per task, each in its own module.

``modelprof profile MODEL --input SHAPE`` profiles a model (``modelprof MODEL --input SHAPE``,
without the word ``profile``, is the same); ``merge`` and ``compare`` work on the JSON
artifacts of pytest runs; ``calibrate`` fits a target GPU's predicted time on that GPU."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import TextIO

from . import calibrate, compare, merge, profile
from .usage import EXIT_INTERNAL, EXIT_USAGE, CliError, one_line

COMMANDS = ("profile", "merge", "compare", "calibrate")
HELP = ("-h", "--help")

EPILOG = """\
`modelprof MODEL --input SHAPE ...`, without the word profile, is `modelprof profile MODEL --input SHAPE ...`.
`modelprof COMMAND --help` shows a command's options.

exit status: 0, 1 a profile over its budget (or a --fail-on change), 2 a usage error, 3 an internal fault.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``modelprof`` parser, with a subparser for each of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="modelprof",
        description="Profile PyTorch models (FLOPs, memory, time, a target GPU's step) and work on the JSON artifacts of pytest runs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    for command in (profile, merge, compare, calibrate):
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """The ``modelprof`` command; returns its exit status: 0, 1 over budget, 2 a usage error
    (one line on stderr; ``--traceback`` prints the whole chain), 3 an internal fault.

    Arguments that do not start with a command (nor ask for help) are ``profile``'s."""
    out = out or sys.stdout
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] not in (*COMMANDS, *HELP):
        arguments.insert(0, "profile")
    options = build_parser().parse_args(arguments)
    try:
        return int(options.action(options, out))
    except CliError as error:
        if options.traceback:
            traceback.print_exception(error, file=sys.stderr)
        print(f"modelprof: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:
        if options.traceback:
            traceback.print_exception(error, file=sys.stderr)
        hint = "" if options.traceback else " (run again with --traceback for the details)"
        print(f"modelprof: internal error: {type(error).__name__}: {one_line(error)}{hint}", file=sys.stderr)
        return EXIT_INTERNAL
