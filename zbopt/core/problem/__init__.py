"""The pipeline problem (ground floor): `Problem`, its parameter table, and their checks.

`Problem` (`zbopt.core.problem.problem`) is immutable and validated on construction; its parameters are
one table (`zbopt.core.problem.parameters`) from which the constructor, the config keys, the CLI flags,
`to_dict` and the docs derive. The checks of single values are `checks`, of a mechanism's values
`mechanisms`, of microbatches that differ `microbatches` and `slices`, of the least memory any
schedule needs `memory_floor`; `batch` counts and packs the microbatches, `config` turns a config's
keys into a Problem, `form` writes one as a dict and as one line.

The names below load on first use (PEP 562), so the table can be read, or extended before any
Problem exists (a new mechanism's row, in a test), without building the class first.
"""

from __future__ import annotations

from zbopt.core.wiring import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "MAX_OPS": "zbopt.core.problem.checks", "PARAMETERS": "zbopt.core.problem.parameters",
    "Parameter": "zbopt.core.problem.parameters", "PerStage": "zbopt.core.problem.problem",
    "Problem": "zbopt.core.problem.problem", "problem_from_config": "zbopt.core.problem.config"})
