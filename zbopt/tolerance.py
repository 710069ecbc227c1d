"""The one tolerance: how far apart two times (or memory amounts) may be and still count as equal.

Float costs summed along a schedule drift by a few ulps (a period of 25/3 repeated); every place
that compares times or memory (the simulator, the generators that plan within a limit, the bounds,
the rule for "optimal") uses this one relative tolerance.
"""

from __future__ import annotations

RELATIVE_TOLERANCE = 1e-9


def memory_ceiling(limit: float) -> float:
    """The most a device may hold under `limit`: the one memory tolerance (relative, as for times),
    shared by the simulator, the generators that plan within a limit and the bounds."""
    return limit + RELATIVE_TOLERANCE * max(1.0, limit)
