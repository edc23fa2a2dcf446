"""What the README and the documentation show is what the project ships, runs and checks.

Every ```python block of README.md and docs/*.md runs: a pytest test file (one that asks for
the ``model_profile`` fixture) under pytester, any other block as a script in a fresh
interpreter. A block that cannot run by itself is marked on the line above it with
``<!-- not-run: why -->``; there is no third way, so a new block is run unless its author
says why not. Every ```toml block is a budget file, read by the project's budget loader.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_modelprof.budgets import load_budgets

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    found = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        fence = re.fullmatch(r"```(\w*)", lines[index])
        if fence is None:
            index += 1
            continue
        end = lines.index("```", index + 1)
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = NOT_RUN.fullmatch(previous.strip())
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(page, index + 1, fence.group(1), code, marker.group("reason") if marker else None))
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
    assert set(budgets.profiles) == set(re.findall(r'^\[profiles\."([^"]+)"\]$', block.code, re.MULTILINE))
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
