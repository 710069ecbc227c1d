"""The pipeline problem (ground floor): `Problem`, its parameter table, and their checks.

`Problem` (`zbopt.problem.problem`) is immutable and validated on construction; its parameters are
one table (`zbopt.problem.parameters`) from which the constructor, the config keys, the CLI flags,
`to_dict` and the docs derive. The checks of single values are `checks`, of a mechanism's values
`mechanisms`, of microbatches that differ `microbatches` and `slices`, of the least memory any
schedule needs `memory_floor`; `batch` counts and packs the microbatches, `config` turns a config's
keys into a Problem, `form` writes one as a dict and as one line.

The names below load on first use (PEP 562), so the table can be read, or extended before any
Problem exists (a new mechanism's row, in a test), without building the class first.
"""

from __future__ import annotations

import importlib

_PUBLIC = {"MAX_OPS": "checks", "PARAMETERS": "parameters", "Parameter": "parameters", "PerStage": "problem",
           "Problem": "problem", "problem_from_config": "config"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
