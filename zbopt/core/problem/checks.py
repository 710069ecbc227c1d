"""Checks of the values a user gives a `Problem`: numbers, positive integers, switches, and lists
with one value per stage or device. Each failure is a ProblemError naming the key."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real

from zbopt.core.errors import ProblemError, clip

__all__ = ["MAX_OPS", "MAX_SLOWDOWN", "boolean", "check_op_count", "is_count", "is_number", "known_parameters",
           "nonnegative_number", "per_device", "per_stage", "plain", "positive_int", "slowdown_factor",
           "unused_without"]


def is_number(value: object) -> bool:
    """A finite real number, not a bool (True is an int to Python, not a count to a user)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def plain(value: object) -> object:
    """`value` with numpy's numbers and arrays as Python's (`tolist`), so that a numpy value is
    accepted wherever a number or a list is, and stored as a plain one (numpy is not imported)."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) and not isinstance(value, str) else value


def is_count(value: object) -> bool:
    """A whole number of at least 1, not a bool (layers, tokens, chunks)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def positive_int(key: str, value: object) -> int:
    if not is_count(value):
        raise ProblemError(key, value, "expected a positive integer")
    return value


def boolean(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ProblemError(key, value, "expected true or false")
    return value


MAX_SLOWDOWN = 10.0  # a factor slowing work: beyond it compute has all but stopped


def slowdown_factor(key: str, value: object) -> float:
    if not is_number(value) or not 1 <= value <= MAX_SLOWDOWN:
        raise ProblemError(key, value, f"expected a number from 1 (no slowdown) to {MAX_SLOWDOWN:g}")
    return float(value)


def nonnegative_number(key: str, value: object) -> float:
    if not is_number(value) or value < 0:
        raise ProblemError(key, value, "expected a number >= 0")
    return float(value)


def _per_item(key: str, value: object, count: int, what: str, minimum: float, strict: bool) -> tuple:
    """Expand a scalar to `count` copies, or check a list has `count` numbers; check their bound."""
    if is_number(value):
        values = (float(value),) * count
    elif isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != count:
            raise ProblemError(key, value, f"expected one value per {what} ({count}), got {len(value)}")
        if not all(is_number(item) for item in value):
            raise ProblemError(key, value, "expected numbers")
        values = tuple(float(item) for item in value)
    else:
        raise ProblemError(key, value, f"expected a number or a list of {count} numbers")
    for index, item in enumerate(values):
        if item < minimum or (strict and item == minimum):
            bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
            where = f" ({what} {index})" if count > 1 else ""
            raise ProblemError(key, value, f"every value must be {bound}{where}")
    return values


def per_stage(key: str, value: object, stages: int, positive: bool = True) -> tuple[float, ...]:
    """One value per virtual stage (a scalar applies to all): a time, > 0, or with
    positive=False a memory amount, >= 0."""
    return _per_item(key, value, stages, "virtual stage", 0, positive)


def per_device(key: str, value: object, devices: int, positive: bool = True) -> tuple[float, ...]:
    """One value per device (a scalar applies to all): > 0, or >= 0 with positive=False."""
    return _per_item(key, value, devices, "device", 0, positive)


def unused_without(switch: str, given: dict[str, object]) -> None:
    """A ProblemError for the first key of `given` whose value is set (not None, not false) while
    `switch` is off."""
    for key, value in given.items():
        if value is not None and value is not False:
            raise ProblemError(key, value, f"needs {switch}: true")


def known_parameters(data: object, parameters) -> None:
    """A ProblemError unless `data` maps parameter names to values: every required parameter (a
    row of `zbopt.core.problem.parameters.PARAMETERS`) and no other name."""
    if not isinstance(data, Mapping):
        raise ProblemError("problem", data, "expected a mapping of problem parameters")
    unknown = sorted(set(data) - {entry.name for entry in parameters}, key=str)
    if unknown:
        raise ProblemError(unknown[0], data[unknown[0]], "unknown problem parameter")
    missing = [entry.name for entry in parameters if entry.required and entry.name not in data]
    if missing:
        raise ProblemError(missing[0], None, "missing: a problem needs it")


# The most ops a problem may have. A simulated op costs about 400 bytes (generator's Op, the
# simulator's arrays: measured on zb-h1, p = 32, m = 4096), so 20M ops fill some 8 GB; larger ones
# would end in a MemoryError (or an OverflowError) instead of a message. The largest documented
# workload (the benchmarks' p = 64, m = 4096, v = 2, split backward: ~1.6M ops) is 12x below it.
MAX_OPS = 20_000_000

def check_op_count(problem) -> None:
    """Refuse a problem of more than MAX_OPS ops before anything is allocated for its stages,
    naming its largest count (the likeliest typo)."""
    if problem.num_ops > MAX_OPS:
        counts = {"num_devices": problem.num_devices, "chunks_per_device": problem.chunks_per_device,
                  "num_microbatches": problem.num_microbatches, "iterations": problem.iterations}
        key = max(counts, key=counts.__getitem__)
        ops = clip(f"{problem.num_ops:,}")
        raise ProblemError(key, counts[key], f"the problem has {ops} ops, more than zbopt holds "
                                             f"(MAX_OPS = {MAX_OPS:,})")
