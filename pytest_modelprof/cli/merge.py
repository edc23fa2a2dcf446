"""``modelprof merge DIR...``: the JSON artifacts of several pytest runs (the shards of a CI
matrix) as one session: one summary, one verdict against the budget files, one update."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from .. import ci
from ..artifacts import ArtifactError
from ..budgets import NEW, REGRESSED, BudgetError, load_budgets
from ..session import merge_sessions
from .usage import EXIT_REGRESSED, CliError, common_options, read_artifact_directories


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The ``merge`` subcommand and its options, added to the ``modelprof`` parser's ``commands``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "merge",
        parents=[common_options()],
        help="merge the JSON artifacts of several pytest runs (CI shards) into one session and verdict",
        description="Merge the JSON artifacts (--modelprof-json DIR) of several pytest runs, the shards of a CI matrix, "
        "into one session: one summary, one verdict against the budget files, and with --update one write of the baselines.",
    )
    parser.set_defaults(action=merge)
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
    return parser


def merge(options: argparse.Namespace, out: TextIO) -> int:
    """``modelprof merge``: the shards' artifacts as one session, checked against the budget files."""
    if options.prune and not options.update:
        raise CliError("--prune needs --update: pruning rewrites the budget files")
    shards = read_artifact_directories(options.directories)
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
