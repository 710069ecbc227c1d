"""Exact solvers and the lower bounds that certify them; `blocks/`, the building blocks.

The names below load on first use (PEP 562): the building blocks, which the schedule registry
loads to list `block-NAME`, do not bring in the driver and OR-Tools with them.
"""

from __future__ import annotations

from zbopt.core.wiring import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "SOLVERS": "zbopt.solvers.api", "solve": "zbopt.solvers.api", "LowerBounds": "zbopt.solvers.bounds",
    "lower_bounds": "zbopt.solvers.bounds", "SolveResult": "zbopt.solvers.result"})
