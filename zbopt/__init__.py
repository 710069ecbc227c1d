"""zbopt: optimal and heuristic pipeline-parallel training schedules, on one shared simulator.

The public names load on first use (PEP 562), so `zbopt --help` and a small simulation do not
import OR-Tools or matplotlib. The folders are the floors (`core`, `io`, `schedules`, `solvers`,
`planning`, `presentation`, `interfaces`, lowest first); this file is where they are wired
together: it registers the results' views (`zbopt.presentation.display`) and the schedules built
above the generators (`zbopt.solvers.blocks`), and it keeps the module paths that moved into the
floors importable, with a deprecation warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

from zbopt.core.wiring import defer, lazy_names
from zbopt.presentation import display  # noqa: F401  (registers how results print and show in Jupyter)

defer("zbopt.schedules.registry", lambda: importlib.import_module("zbopt.solvers.blocks.registered"))  # block-NAME

__version__ = "0.1.0"

_PUBLIC = {
    "zbopt.planning.comparison": ("Comparison", "ComparisonRow", "compare"),
    "zbopt.core.errors": ("DeadlockError", "MemoryLimitError", "NotApplicableError", "ProblemError", "ScheduleError",
                     "UnknownScheduleError", "ZboptError"),
    "zbopt.planning.frontier": ("Frontier", "memory_frontier"),
    "zbopt.planning.model": ("Device", "Layer", "Model", "load_model"),
    "zbopt.planning.planner": ("Pipeline", "Plan", "plan"),
    "zbopt.core.ops": ("Op",), "zbopt.core.dag": ("critical_path", "device_work", "op_graph"),
    "zbopt.core.problem": ("Problem",),
    "zbopt.io.export": ("save_schedule",),
    "zbopt.io.read": ("load_problem", "load_schedule"),
    "zbopt.core.schedule": ("Schedule",),
    "zbopt.schedules": ("generate", "registered"),
    "zbopt.core.simulation": ("MemoryViolation", "Simulation", "simulate"),
    "zbopt.interfaces.runtime.layer_profile": ("profile_model",),
    "zbopt.solvers": ("SolveResult", "lower_bounds", "solve"),
}
__getattr__, __dir__, __all__ = lazy_names(__name__, {name: module for module, names in _PUBLIC.items()
                                                      for name in names})

_MOVED = {  # where the modules of the flat layout went when the folders became the floors
    "zbopt.errors": "zbopt.core.errors", "zbopt.kinds": "zbopt.core.kinds",
    "zbopt.placement": "zbopt.core.placement", "zbopt.ops": "zbopt.core.ops",
    "zbopt.schedule": "zbopt.core.schedule", "zbopt.interrupt": "zbopt.core.interrupt",
    "zbopt.tolerance": "zbopt.core.tolerance", "zbopt.shown": "zbopt.core.wiring",
    "zbopt.deferred": "zbopt.core.wiring", "zbopt.timeline": "zbopt.core.timeline",
    "zbopt.ticks": "zbopt.core.ticks", "zbopt.units": "zbopt.core.units",
    "zbopt.paper_tables": "zbopt.core.paper_tables", "zbopt.microbatch_order": "zbopt.core.problem.order",
    "zbopt.problem": "zbopt.core.problem", "zbopt.simulation": "zbopt.core.simulation",
    "zbopt.blocks": "zbopt.solvers.blocks",
    "zbopt.comparison": "zbopt.planning.comparison", "zbopt.frontier": "zbopt.planning.frontier",
    "zbopt.packing": "zbopt.planning.packing", "zbopt.planner": "zbopt.planning.planner",
    "zbopt.model": "zbopt.planning.model",
    "zbopt.display": "zbopt.presentation.display", "zbopt.tables": "zbopt.presentation.tables",
    "zbopt.report": "zbopt.presentation.report", "zbopt.plan_report": "zbopt.presentation.plan_report",
    "zbopt.plot": "zbopt.presentation.plot",
    "zbopt.cli": "zbopt.interfaces.cli", "zbopt.runtime": "zbopt.interfaces.runtime",
    "zbopt.io.config": "zbopt.io.read",  # merged: reading a config is reading a file
    "zbopt.cli.config": "zbopt.interfaces.cli.inputs", "zbopt.plot.svg": "zbopt.presentation.plot.style",
}


def moved_to(name: str) -> str | None:
    """Where the module `name` of the flat layout (or one inside a moved package) lives now."""
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        new = _MOVED.get(".".join(parts[:cut]))
        if new is not None:
            return ".".join([new, *parts[cut:]])
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as the module at its new one (the same object), with a DeprecationWarning.

    First on `sys.meta_path`, so that `zbopt.planner.search` is never loaded a second time from the
    new package's folder under its old name."""

    def find_spec(self, name, path=None, target=None):
        new = moved_to(name)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.machinery.ModuleSpec(name, self, origin=new)

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {spec.origin}; the old path will be removed",
                      DeprecationWarning, stacklevel=_callers_level())
        module = importlib.import_module(spec.origin)
        spec.loader_state = module.__spec__  # the import system sets __spec__ to this one: put it back
        return module

    def exec_module(self, module):
        """The module ran when it was imported at its new path: only its own spec is put back."""
        module.__spec__ = module.__spec__.loader_state


def _callers_level() -> int:
    """The stack level of the first frame outside the import system and zbopt: the user's line
    that named the old path, however it got here (`import`, `from zbopt import planner`)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(("<frozen importlib", _IMPORTLIB))
                                 or frame.f_code.co_filename.startswith(_PACKAGE)):
        frame, level = frame.f_back, level + 1
    return level


_IMPORTLIB = importlib.__file__.rsplit("/", 1)[0]
_PACKAGE = __file__.rsplit("/", 1)[0] + "/"
sys.meta_path.insert(0, _MovedModules())
