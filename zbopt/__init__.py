"""zbopt: optimal and heuristic pipeline-parallel training schedules, on one shared simulator.

The public names load on first use (PEP 562), so `zbopt --help` and a small simulation do not
import OR-Tools or matplotlib. This file is where the floors are wired together: it registers the
results' views (`zbopt.display`) and the schedules built above the generators (`zbopt.blocks`).
"""

from __future__ import annotations

import importlib
import importlib.util

from zbopt import display  # noqa: F401  (registers how results print and show in Jupyter)
from zbopt.deferred import defer

defer("zbopt.schedules.registry", lambda: importlib.import_module("zbopt.blocks.registered"))  # block-NAME

__version__ = "0.1.0"

_PUBLIC = {
    "zbopt.comparison": ("Comparison", "ComparisonRow", "compare"),
    "zbopt.errors": ("DeadlockError", "MemoryLimitError", "NotApplicableError", "ProblemError", "ScheduleError",
                     "UnknownScheduleError", "ZboptError"),
    "zbopt.frontier": ("Frontier", "memory_frontier"),
    "zbopt.model": ("Device", "Layer", "Model", "load_model"),
    "zbopt.planner": ("Pipeline", "Plan", "plan"),
    "zbopt.ops": ("Op", "critical_path", "device_work", "op_graph"),
    "zbopt.problem": ("Problem",),
    "zbopt.io.config": ("load_problem",),
    "zbopt.io.export": ("save_schedule",),
    "zbopt.io.read": ("load_schedule",),
    "zbopt.schedule": ("Schedule",),
    "zbopt.schedules": ("generate", "registered"),
    "zbopt.simulation": ("MemoryViolation", "Simulation", "simulate"),
    "zbopt.solvers": ("SolveResult", "lower_bounds", "solve"),
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    """Load a public name's module the first time the name is asked for; `zbopt.solvers` and the
    other subpackages load on first use too, as they did when this file imported them all."""
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'zbopt' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
