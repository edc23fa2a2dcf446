"""What the README and the documentation show is what the project ships, runs and checks.

Every ```python block of README.md and docs/*.md runs: a pytest test file (one that asks for
the ``model_profile`` fixture) under pytester, any other block as a script in a fresh
interpreter. A block that cannot run by itself is marked on the line above it with
``<!-- not-run: why -->``; there is no third way, so a new block is run unless its author
says why not. Every ```toml block is a budget file, read by the project's budget loader, and
every ``modelprof`` line of a ```bash block is parsed as the command parses it. A fence of any
form counts (backticks or tildes, indented in a list), and a block of a language the checks do
not know fails, so no block escapes them by its spelling.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_modelprof.budgets import load_budgets
from pytest_modelprof.cli import COMMANDS, HELP, build_parser

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_RUN = re.compile(r"<!-- not-run: (?P<reason>\S.*?) -->")
# a script that takes longer has outgrown the documentation: show a smaller model
SCRIPT_SECONDS = 120


@dataclass
class Block:
    """One fenced code block of a page, with the reason it is not run if it is marked so."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


FENCE = re.compile(r"(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)")
# what a block's info string may say: anything else (```py, ```python3, ```sh) would escape the
# checks below, so it fails test_every_block_says_a_language_the_checks_know
LANGUAGES = {"", "python", "toml", "yaml", "bash", "text"}


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order: backtick or tilde fences of any length,
    indented too (inside a list or an admonition), their code dedented."""
    found = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        fence = FENCE.fullmatch(lines[index])
        if fence is None:
            index += 1
            continue
        mark = fence.group("fence")
        closing = re.compile(rf"\s*{re.escape(mark[0])}{{{len(mark)},}}\s*")
        end = next(i for i in range(index + 1, len(lines)) if closing.fullmatch(lines[i]))
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = NOT_RUN.fullmatch(previous.strip())
        code = textwrap.dedent("\n".join(lines[index + 1 : end]) + "\n")
        language = fence.group("info").split()[0].strip("{}.") if fence.group("info").strip() else ""
        found.append(Block(page, index + 1, language, code, marker.group("reason") if marker else None))
        index = end + 1
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
PYTHON = [block for block in ALL_BLOCKS if block.language == "python" and block.not_run is None]
TOML = [block for block in ALL_BLOCKS if block.language == "toml"]


def section(page: Path, heading: str) -> str:
    """The text of ``page`` from ``heading`` (a whole line) to the next heading of the same level."""
    text = page.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    rest = text[start + len(heading) + 2 :]
    end = re.search(rf"^{level} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def first_yaml_block(text: str) -> str:
    return text.split("```yaml\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("block", [block for block in PYTHON if "model_profile" not in block.code], ids=lambda block: block.id)
def test_a_python_example_runs_as_a_script(block, tmp_path):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", block.code],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=SCRIPT_SECONDS,
    )
    assert run.returncode == 0, f"{block.id} failed:\n{run.stderr}"


@pytest.mark.parametrize("block", [block for block in PYTHON if "model_profile" in block.code], ids=lambda block: block.id)
def test_a_test_file_example_passes_under_pytest(block, pytester):
    pytester.makepyfile(test_example=block.code)
    result = pytester.runpytest("-W", "error", "--strict-markers")
    result.assert_outcomes(passed=block.code.count("\ndef test_") + block.code.startswith("def test_"))


@pytest.mark.parametrize("block", TOML, ids=lambda block: block.id)
def test_a_budget_file_example_loads(block, tmp_path):
    directory = tmp_path / "budgets"
    directory.mkdir()
    (directory / "example.toml").write_text(block.code)
    budgets = load_budgets(directory)
    assert set(budgets.profiles) == set(re.findall(r'^\[profiles\."([^"]+)"(?:\.baseline)?\]$', block.code, re.MULTILINE))
    assert budgets.profiles


def test_a_block_is_marked_not_run_only_with_a_reason_and_only_where_it_runs_otherwise():
    for page in PAGES:
        marked = {block.line for block in blocks(page) if block.not_run is not None}
        assert all(block.language == "python" for block in blocks(page) if block.line in marked)
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if "not-run" in line:
                assert NOT_RUN.fullmatch(line.strip()), f"{page.name}:{number}: write the marker as <!-- not-run: why -->"
                following = next(index for index in range(number, len(lines)) if lines[index].strip())
                assert lines[following] == "```python", f"{page.name}:{number}: the marker is not above a python block"


def test_the_ci_page_shows_the_sharded_workflow_that_ci_lints():
    block = first_yaml_block(section(ROOT / "docs" / "ci.md", "## Many models"))
    assert block == (ROOT / "examples" / "workflows" / "model-zoo.yml").read_text()
    assert "examples/workflows/*.yml" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_gates_pull_requests_with_the_workflow_of_the_ci_page():
    readme = first_yaml_block((ROOT / "README.md").read_text().split("**4. Gate pull requests.**", 1)[1])
    assert readme == first_yaml_block(section(ROOT / "docs" / "ci.md", "## Gating a pull request"))


def test_the_readme_fits_on_a_screen_and_keeps_its_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400
    commands = section(ROOT / "README.md", "## Two commands")
    assert "python -m pip install -e '.[examples]' && python -m pytest examples\n" in commands
    assert "python -m pip install -e '.[test]' && python -m pytest\n" in commands


def test_every_page_is_in_the_site_and_every_link_of_the_readme_resolves():
    site = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}\n" in site, f"{page.name} is not in mkdocs.yml's nav"
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)", (ROOT / "README.md").read_text()):
        assert (ROOT / target).is_file(), f"README.md links to {target}, which does not exist"


def test_the_documentation_speaks_of_the_readers_machine_not_ours():
    for page in PAGES:
        text = page.read_text()
        assert "../shared" not in text, page.name
        assert "this project's" not in text, page.name


def test_every_block_says_a_language_the_checks_know():
    assert {block.id: block.language for block in ALL_BLOCKS if block.language not in LANGUAGES} == {}


def commands(block: Block) -> list[list[str]]:
    """The ``modelprof`` command lines of a shell block (``$ `` prompts and ``\\`` continuations
    taken as a shell takes them), as argument lists after ``modelprof``."""
    text = block.code.replace("\\\n", " ")
    lines = [line.strip().removeprefix("$ ") for line in text.splitlines()]
    return [shlex.split(line, comments=True)[1:] for line in lines if line.split()[:1] == ["modelprof"]]


SHELL_COMMANDS = [(block, arguments) for block in ALL_BLOCKS if block.language == "bash" for arguments in commands(block)]


def test_the_pages_show_modelprof_commands():
    assert len(SHELL_COMMANDS) >= 5


@pytest.mark.parametrize(("block", "arguments"), SHELL_COMMANDS, ids=lambda value: value.id if isinstance(value, Block) else "")
def test_a_modelprof_command_on_a_page_is_one_the_command_takes(block, arguments):
    # parsed as the command parses it (the shorthand without "profile" included), not run
    if arguments and arguments[0] not in (*COMMANDS, *HELP):
        arguments = ["profile", *arguments]
    build_parser().parse_args(arguments)
