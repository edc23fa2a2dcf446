"""The package's shape: rooms that show the architecture, each layer importing only those beneath it.

Read from the source, not imported: every ``import`` statement counts, those under
``TYPE_CHECKING`` and inside functions included, since each is a dependency a reader has to
follow (and a cycle one of them can close at run time).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_modelprof"
ENGINE = "pytest_modelprof.engine"
LONGEST = 500  # lines: past it a module holds more than one subject


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[1:2] == ["data"]:  # measurements and the script that captured them, not the package's code
            continue
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports (a ``from package import submodule`` names the submodule)."""
    path, is_package = MODULES[name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    found.add(submodule)
                elif source in MODULES:
                    found.add(source)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
    found.discard(name)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(GRAPH[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_module_imports_itself_back():
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle():
    # the check above passes only because there is no cycle, not because it cannot see one
    GRAPH["pytest_modelprof.results"].add("pytest_modelprof.metrics")
    try:
        assert ["pytest_modelprof.metrics", "pytest_modelprof.results"] in _cycles()
    finally:
        GRAPH["pytest_modelprof.results"].discard("pytest_modelprof.metrics")


def test_no_room_of_the_engine_imports_one_that_imports_it():
    # rooms, not only modules: observe/ feeds meters/, so meters/ may import observe/ and not the
    # reverse (each room a node; the engine's top modules each a node of their own)
    def room(name):
        return ".".join(name.split(".")[:3]) if name.startswith(f"{ENGINE}.") else name

    rooms: dict[str, set[str]] = {}
    for name, imports in GRAPH.items():
        rooms.setdefault(room(name), set()).update(room(imported) for imported in imports if room(imported) != room(name))

    def reaches(start):
        seen, todo = set(), [start]
        while todo:
            for following in rooms.get(todo.pop(), ()):
                if following not in seen:
                    seen.add(following)
                    todo.append(following)
        return seen

    assert sorted(name for name in rooms if name in reaches(name)) == []


@pytest.mark.parametrize(
    ("layer", "allowed"),
    [
        # the op registry is the floor: torch and the standard library only
        (f"{ENGINE}.ops", ()),
        # what a step runs on, modelled: GPUs, allocator, cost model, cuDNN, kernel scratch
        (f"{ENGINE}.targets", (f"{ENGINE}.ops", "pytest_modelprof._files")),
        # the FLOP formulas know ops, nothing of how a run is observed or measured
        (f"{ENGINE}.formulas", (f"{ENGINE}.ops", f"{ENGINE}.errors")),
    ],
)
def test_a_lower_layer_imports_nothing_above_it(layer, allowed):
    reaching_up = {
        (name, imported)
        for name, imports in GRAPH.items()
        if name == layer or name.startswith(layer + ".")
        for imported in imports
        if not (imported == layer or imported.startswith(layer + "."))
        and not any(imported == a or imported.startswith(a + ".") for a in allowed)
    }
    assert reaching_up == set()


def test_meters_are_peers():
    meters = [name for name in GRAPH if name.startswith(f"{ENGINE}.meters.")]
    assert {(name, imported) for name in meters for imported in GRAPH[name] if imported in meters} == set()


def test_no_module_is_longer_than_one_subject():
    lengths = {name: len(path.read_text().splitlines()) for name, (path, _) in MODULES.items()}
    assert {name: n for name, n in lengths.items() if n > LONGEST} == {}


def test_the_engine_shows_its_rooms_at_the_top():
    top = sorted(path.stem for path in (PACKAGE / "engine").glob("*.py") if path.stem != "__init__")
    rooms = sorted(path.name for path in (PACKAGE / "engine").iterdir() if (path / "__init__.py").exists())
    assert len(top) <= 8, top
    assert {"analytic", "formulas", "meters", "observe", "ops", "targets", "timing"} <= set(rooms)


REFERENCE = re.compile(r":(?:mod|class|func|meth|data|attr|exc):`~?(?P<target>\.*pytest_modelprof[\w.]*|\.+[\w.]+)`")


def _resolves(dotted: str) -> bool:
    pieces = dotted.split(".")
    for split in range(len(pieces), 0, -1):
        try:
            found = importlib.import_module(".".join(pieces[:split]))
        except ImportError:
            continue
        for attribute in pieces[split:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_cross_reference_in_a_docstring_names_something_that_exists():
    # :mod:`.analytic.fake`, :func:`~..meters.Meter.op`: relative to the module, as the docs render them
    broken = []
    for name, (path, is_package) in MODULES.items():
        base = name.split(".") if is_package else name.split(".")[:-1]
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in REFERENCE.finditer(line):
                target = match.group("target")
                dots = len(target) - len(target.lstrip("."))
                if dots:
                    target = ".".join([*base[: len(base) - (dots - 1)], target.lstrip(".")])
                if not _resolves(target):
                    broken.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {match.group(0)}")
    assert broken == []
