"""The house's shape: imports run one way, down the floors, with no cycle; no room over 400 lines.

The graph is read from the source, not from what happens to be imported: module-level and
function-level imports and importlib strings alike. Importing `a.b.c` counts as importing the
package `a.b` (its `__init__` runs first), except for a module inside `a.b`, whose own package is
always loaded before it; the root `zbopt/__init__`, which wires the floors together, is left out.

The folders are the floors, lowest first (a module may import its own floor and those below): a
module's floor is the first folder of its path, so no list of modules is kept here.
core (the problem, ops, schedules as data, the simulator), io (files in and out), schedules (the
generators), solvers (the driver, backends, bounds, building blocks), planning (compare, frontier,
the model and the plan), presentation (display, tables, report, plot), interfaces (the CLI, torch).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zbopt"
MAX_MODULE_LINES = 400
FLOORS = ("core", "io", "schedules", "solvers", "planning", "presentation", "interfaces")
ROOT_MODULES = ("zbopt", "zbopt.__main__")  # the wiring and `python -m zbopt`: above every floor
IMPORTLIB_STRING = re.compile(r"zbopt(\.\w+)+")


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _absolute(importer: str, package: bool, level: int, name: str | None) -> str:
    base = importer.split(".")
    if not package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _named(node: ast.AST, importer: str, package: bool) -> list[str]:
    """The dotted names one AST node imports (or names for importlib)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _absolute(importer, package, node.level, node.module) if node.level else node.module
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and IMPORTLIB_STRING.fullmatch(node.value):
        return [node.value]
    return []


def import_graph() -> nx.DiGraph:
    """Every module of zbopt but the root, an edge for each module (or package) it imports."""
    known = modules()
    graph = nx.DiGraph()
    for name, (path, package) in known.items():
        if name == "zbopt":
            continue
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _named(node, name, package):
                if not target.startswith("zbopt."):
                    continue
                while target not in known and "." in target:  # `from a.b import name` names a.b
                    target = target.rsplit(".", 1)[0]
                while target != "zbopt":  # a.b.c imports a.b's __init__ first
                    if target != name and not name.startswith(target + "."):
                        graph.add_edge(name, target)
                    target = target.rsplit(".", 1)[0]
    return graph


def floor(module: str) -> str:
    """The floor a module stands on: the folder under `zbopt/` it lives in."""
    return "interfaces" if module in ROOT_MODULES else module.split(".")[1]


def test_every_module_lives_in_a_floor():
    """No module is loose in the root: each one's folder names its floor."""
    loose = sorted(name for name in modules() if floor(name) not in FLOORS)
    assert not loose, loose
    assert {floor(name) for name in modules()} == set(FLOORS)


def test_the_graph_sees_function_level_imports_and_importlib_strings(tmp_path):
    """The reader itself: a function-level import, an importlib string and a package counted."""
    source = ("def f():\n    from zbopt.solvers.cpsat import x\n"
              "    return importlib.import_module('zbopt.presentation.plot')\n")
    names = [target for node in ast.walk(ast.parse(source))
             for target in _named(node, "zbopt.core.simulation.engine", False)]
    assert {"zbopt.solvers.cpsat", "zbopt.solvers.cpsat.x", "zbopt.presentation.plot"} <= set(names)
    graph = import_graph()
    assert graph.has_edge("zbopt.interfaces.cli.solve", "zbopt.solvers")  # the package of any solvers module it imports


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    cycles = [sorted(component) for component in nx.strongly_connected_components(graph) if len(component) > 1]
    assert not cycles, f"import cycles: {cycles}; one of them: {nx.find_cycle(graph, cycles[0][0])}"


def test_imports_run_down_the_floors():
    upward = [f"{importer} ({floor(importer)}) imports {target} ({floor(target)})"
              for importer, target in import_graph().edges
              if FLOORS.index(floor(target)) > FLOORS.index(floor(importer))]
    assert not upward, "\n".join(upward)


def test_the_interfaces_use_the_presentation_floor():
    """The floor rule keeps everything below from importing it; the CLI must, to draw and print."""
    graph = import_graph()
    users = {importer for importer, target in graph.edges if floor(target) == "presentation"
             and floor(importer) != "presentation"}
    assert users and all(floor(user) == "interfaces" for user in users), sorted(users)


def test_no_module_over_400_lines():
    long = {name: count for name, (path, _) in modules().items()
            if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long


@pytest.mark.parametrize("first", ["zbopt.solvers.blocks", "zbopt.solvers", "zbopt.schedules", "zbopt.planning.planner",
                                   "zbopt.presentation.plot", "zbopt.interfaces.cli"])
def test_any_subpackage_imports_first(first):
    """No cycle hides behind import order: each floor's package loads in a fresh interpreter
    before anything else of zbopt has."""
    done = subprocess.run([sys.executable, "-c", f"import {first}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


HEAVY = ("ortools", "matplotlib", "networkx", "pandas", "pulp", "highspy", "torch")
LIGHT_COMMANDS = {  # what each quick command may load of the heavy libraries: none
    "--help": ["--help"],
    "schedules": ["schedules"],
    "simulate": ["simulate", "-s", "4", "-b", "8"],
}


@pytest.mark.parametrize("command", sorted(LIGHT_COMMANDS))
def test_quick_commands_load_no_heavy_library(command):
    """Start-up is what users feel on every call: `zbopt --help`, `zbopt schedules` and a small
    `simulate` import none of the solver, plotting or graph libraries (bench_startup.py times them)."""
    argv = LIGHT_COMMANDS[command]
    code = ("import contextlib, io, sys\nfrom zbopt.interfaces.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main({argv!r})\n"
            f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_threads_asking_the_registry_at_once_all_see_the_block_built_schedules():
    """The block-built schedules load at the registry's first lookup (zbopt.core.wiring): a thread that
    asks while another is loading them waits, rather than see a list without them."""
    code = ("import threading\nfrom zbopt.schedules import registered\nseen = []\n"
            "threads = [threading.Thread(target=lambda: seen.append(len(registered()))) for _ in range(8)]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]\n"
            "print(sorted(set(seen)), sum(s.name.startswith('block-') for s in registered()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    counts, blocks = (done.stdout.strip() or "? ?").rsplit(" ", 1)
    assert done.returncode == 0 and int(blocks) == 6, done.stderr[-2000:]  # one per published block
    assert counts.count(",") == 0, f"threads saw different registries: {counts}"


def test_subpackages_load_as_attributes_of_the_lazy_root():
    """`import zbopt; zbopt.solvers.solve` worked when the root imported everything; it still does."""
    code = "import zbopt\nprint(zbopt.solvers.solve is zbopt.solve, sorted(zbopt.solvers.blocks.PUBLISHED)[0])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "1f1b"], done.stderr[-2000:]


def test_the_flat_layouts_paths_still_import_the_same_modules_with_a_warning():
    """`zbopt.frontier`, `zbopt.planner.search`, `from zbopt.plot import plot_gantt`: the paths the
    README documented before the folders became floors give the module at its new path (the same
    object, its own name and spec kept) and say where it went."""
    code = ("import warnings\nwarnings.simplefilter('error')\nimport zbopt.planning.planner.search as new\n"
            "from importlib.resources import files\n"
            "with warnings.catch_warnings(record=True) as caught:\n    warnings.simplefilter('always')\n"
            "    import zbopt.planner.search as old\n    from zbopt.plot import plot_gantt\n"
            "print(old is new, new.__spec__.name, plot_gantt.__module__, files('zbopt.presentation').name)\n"
            "print(sorted({str(w.message).split(' moved')[0] for w in caught if w.category is DeprecationWarning}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    same, warned = done.stdout.strip().splitlines()
    assert same.split() == ["True", "zbopt.planning.planner.search", "zbopt.presentation.plot.gantt", "presentation"]
    assert warned == str(["zbopt.planner", "zbopt.planner.search", "zbopt.plot"])


def test_every_module_of_a_moved_package_imports_under_its_old_path():
    """Each entry of the root's table of moved paths, and every module inside a moved package,
    imports under the old name as the module at the new one; a name that never existed does not."""
    code = ("import importlib, pkgutil, warnings\nwarnings.simplefilter('ignore')\nimport zbopt\nbad = []\n"
            "for old, new in zbopt._MOVED.items():\n"
            "    target = importlib.import_module(new)\n"
            "    names = [(old, new)] + [(old + m.name[len(new):], m.name) for m in\n"
            "             pkgutil.walk_packages(getattr(target, '__path__', []), new + '.')]\n"
            "    bad += [o for o, n in names if importlib.import_module(o) is not importlib.import_module(n)]\n"
            "print(len(zbopt._MOVED), bad, importlib.util.find_spec('zbopt.plot.nothing_here'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    count, rest = done.stdout.split(" ", 1)
    assert int(count) >= 30 and rest.strip() == "[] None"
