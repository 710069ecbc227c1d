"""Exact solvers and the lower bounds that certify them."""

from zbopt.solvers.api import SOLVERS, solve
from zbopt.solvers.bounds import LowerBounds, lower_bounds
from zbopt.solvers.result import SolveResult

__all__ = ["SOLVERS", "LowerBounds", "SolveResult", "lower_bounds", "solve"]
