"""``modelprof compare BASE HEAD``: two sets of JSON artifacts side by side (a pull request's
base and head), and ``--fail-on`` rules that turn chosen changes into exit status 1."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..compare import compare as compare_profiles
from ..compare import parse_fail_on
from ..report.compare import comparison_markdown, format_comparison
from .usage import EXIT_REGRESSED, CliError, check_output, common_options, read_artifact_directories


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The ``compare`` subcommand and its options, added to the ``modelprof`` parser's ``commands``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "compare",
        parents=[common_options()],
        help="compare two sets of JSON artifacts (base and head): each profile's change, new and removed profiles",
        description="Compare two sets of JSON artifacts (--modelprof-json DIR, or modelprof merge -o DIR), e.g. a pull "
        "request's base and head: each profile's metrics on both, the change, new and removed profiles.",
    )
    parser.set_defaults(action=compare)
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
    return parser


def compare(options: argparse.Namespace, out: TextIO) -> int:
    """``modelprof compare``: each profile's metrics on base and head; ``--fail-on`` rules decide the exit status."""
    try:
        rules = [parse_fail_on(text) for item in options.fail_on for text in item.split(",") if text.strip()]
    except ValueError as error:
        raise CliError(str(error)) from None
    if options.markdown:
        check_output("--markdown", options.markdown)
    base, head = read_artifact_directories([options.base, options.head])
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
