"""The one rule for "optimal" and the gap, wherever a value meets a lower bound: the driver, the
frontier, the comparison tables and the live line all read it here."""

from __future__ import annotations

from zbopt.core.tolerance import RELATIVE_TOLERANCE

__all__ = ["gap_text", "meets", "optimality_tolerance", "relative_gap", "settle"]


def relative_gap(value: float | None, lower_bound: float) -> float | None:
    """The one gap formula: (value - lower_bound) / value; None without a positive value; 0 where
    the value is within `optimality_tolerance` of the bound (either side), so float noise in a sum
    never shows as a gap. Negative only for a schedule the bound does not hold for (one over the memory
    limit).

    >>> relative_gap(424.9289999999999, 424.929), relative_gap(5.0, 4.0)
    (0.0, 0.2)
    """
    if value is None or value <= 0:
        return None
    if abs(value - lower_bound) <= optimality_tolerance(lower_bound):
        return 0.0
    return (value - lower_bound) / value


def gap_text(gap: float | None) -> str:
    """A gap for people: "n/a" without one, else percent with two decimals, and more digits where a
    gap that is not zero would print as 0.00% (so "feasible" never shows a zero gap).

    >>> gap_text(0.0123), gap_text(2.5e-7), gap_text(0.0), gap_text(None)
    ('1.23%', '2.5e-05%', '0.00%', 'n/a')
    """
    if gap is None:
        return "n/a"
    text = f"{gap:.2%}"
    return f"{gap * 100:.1e}%" if gap != 0 and text.lstrip("-") == "0.00%" else text


def optimality_tolerance(bound: float) -> float:
    """How close a value must come to a lower bound to count as meeting it: the simulator's own
    relative tolerance, so that "optimal" means the same wherever it is decided."""
    return RELATIVE_TOLERANCE * max(1.0, abs(bound))


def meets(value: float, lower_bound: float, tolerance: float | None = None) -> bool:
    """The one rule for "optimal": a schedule's value meets a lower bound on every schedule."""
    return value <= lower_bound + (optimality_tolerance(lower_bound) if tolerance is None else tolerance)


def settle(value: float, lower_bound: float, tolerance: float | None = None) -> tuple[str, float]:
    """(status, lower bound) of a schedule's value against a bound: "optimal" with the value as its
    own bound when they meet, else "feasible" with the bound, never above the value (rounding)."""
    if meets(value, lower_bound, tolerance):
        return "optimal", value
    return "feasible", min(lower_bound, value)
