"""Exact solvers and the lower bounds that certify them."""

from zbopt.solvers.bounds import LowerBounds, lower_bounds

__all__ = ["LowerBounds", "lower_bounds"]
