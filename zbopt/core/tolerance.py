"""The one tolerance: how far apart two times (or memory amounts) may be and still count as equal,
and the range of values within which it holds.

Float costs summed along a schedule drift by a few ulps (a period of 25/3 repeated); every place
that compares times or memory (the simulator, the generators that plan within a limit, the bounds,
the rule for "optimal") uses this one relative tolerance. It stays below the shortest cost only if
every time a schedule reaches is under 1 / RELATIVE_TOLERANCE times that cost: `check_ranges`
refuses a problem whose times (or memory) span more, so nothing downstream defends itself.
"""

from __future__ import annotations

import math

from zbopt.core.errors import ProblemError

__all__ = ["MAX_TOTAL", "MICROBATCH_SPAN", "RELATIVE_TOLERANCE", "Parts", "check_ranges", "latest_start",
           "memory_ceiling"]

RELATIVE_TOLERANCE = 1e-9
# The most all of a problem's ops together may take (in its time unit), and a device's activations
# together may hold: float sums stay exact to the tolerance, and the solvers' integer ticks
# (`zbopt.core.ticks`) stay far inside 64 bits. Nanoseconds for 1.5M ops of 100 ms each are 1.5e14.
MAX_TOTAL = 1e15
# How far one microbatch's ops (through every stage, with the latencies) may outweigh the shortest
# cost. The block-built generators' LP (GLOP, tolerances near 1e-9 relative) lost the shortest cost
# at 1e8 of it (measured: `compare -w 2.5e7`, p = 4, fails; the most that always worked was near 2e7);
# 1e7 keeps a tenfold margin. Real costs differ by a factor of ten or a hundred.
MICROBATCH_SPAN = 1e7


def memory_ceiling(limit: float) -> float:
    """The most a device may hold under `limit`: the one memory tolerance (relative, as for times),
    shared by the simulator, the generators that plan within a limit and the bounds."""
    return limit + RELATIVE_TOLERANCE * max(1.0, limit)


Parts = dict[str, tuple[float, float, float]]  # key -> (smallest, largest, ops it adds, weighted by value / largest)


def _part(values, counts, tells_apart: bool = True) -> tuple[float, float, float]:
    """(smallest, largest, weight) of one key; a key that need not be told apart from the others
    (a latency: one below the tolerance is merely ignorable) has no smallest (inf)."""
    largest = max(values)
    weight = sum(value / largest * count for value, count in zip(values, counts, strict=True))
    return min(values) if tells_apart else math.inf, largest, weight


def _time_parts(problem, one_microbatch: bool = False) -> Parts:
    """Per time key, its smallest and largest value and how many ops of its largest cost it adds:
    in all, or (`one_microbatch`) for one microbatch through every stage."""
    counts = [1 if one_microbatch else len(problem.microbatches_of(stage)) for stage in range(problem.num_stages)]
    per_device = [sum(counts[stage] for stage in stages) for stages in problem.stages_of_device]
    keys = ["forward_times", "backward_times", "weight_times"]
    keys += ["recompute_times"] * (problem.recomputation is not None)
    keys += ["offload_times", "reload_times"] * (problem.offload is not None)
    given = {key: (getattr(problem, key), counts) for key in keys}  # the normalised ones only
    for kind, costs in problem.pairs.costs if problem.pairs else ():  # each pair holds a forward of its device
        given[f"overlap_times.{kind}"] = (costs, per_device)
    if problem.p2p_time > 0:  # at most one latency per op
        given["p2p_time"] = ((problem.p2p_time,), (problem.num_stages * len(problem.kinds) if one_microbatch
                                                   else problem.num_ops,))
    return {key: _part(values, times, key != "p2p_time") for key, (values, times) in given.items()
            if values is not None}


def _device_memory(problem) -> Parts:
    """activation_memory's smallest positive and largest value, and how many of its largest the
    fullest device holds (every activation of every microbatch at once)."""
    activation = problem.activation_memory
    positive = [amount for amount in activation if amount > 0] or [0.0]
    largest = max(activation) or 1.0
    held = max(sum(activation[stage] / largest * len(problem.microbatches_of(stage)) for stage in stages)
               for stages in problem.stages_of_device)
    return {"activation_memory": (min(positive), largest, held)}


def check_ranges(problem, least=None) -> None:
    """Refuse, naming the key and the value allowed, a problem whose one microbatch's work exceeds
    MICROBATCH_SPAN times its shortest cost, whose total work exceeds 1 / RELATIVE_TOLERANCE times
    it, or whose device memory, under a limit, exceeds 1 / RELATIVE_TOLERANCE times its smallest
    activation; or whose work or device memory exceeds MAX_TOTAL. `least`: where microbatches
    differ, `problem` at every microbatch's largest costs and `least` at their least: the total
    work is told apart from the least microbatch's shortest cost."""
    _within(_time_parts(problem, one_microbatch=True), "one microbatch's ops take", "the shortest cost",
            MICROBATCH_SPAN)
    parts = _time_parts(problem)
    if least is not None:
        shortest = _time_parts(least)
        parts = {key: (min(low, shortest[key][0]), high, weight) for key, (low, high, weight) in parts.items()}
    _within(parts, "all ops together take", "the shortest cost", 1 / RELATIVE_TOLERANCE)
    for limit in problem.memory_limit or ():
        if limit > MAX_TOTAL:
            raise ProblemError("memory_limit", limit, f"at most {_short(MAX_TOTAL)} allowed")
    ends = problem.iteration_ends
    for key in ("unshard_memory", "gradient_memory") if ends is not None else ():  # FSDP's, beside the activations
        values = getattr(ends, key)
        if any(sum(values[stage] for stage in stages) > MAX_TOTAL for stages in problem.stages_of_device):
            raise ProblemError(key, max(values), f"a device's together at most {_short(MAX_TOTAL)} allowed")
    _within(_device_memory(problem), "a device holds", "the smallest activation",
            None if problem.memory_limit is None else 1 / RELATIVE_TOLERANCE)


def latest_start(problem) -> float:
    """The latest a given start time may be (and the earliest, negated): every end a schedule of
    `problem` reaches from it stays within the range `check_ranges` keeps its work in."""
    parts = _time_parts(problem)
    shortest = min(low for low, _, _ in parts.values())
    total = sum(largest * weight for _, largest, weight in parts.values())
    return min(MAX_TOTAL, shortest / RELATIVE_TOLERANCE) - total


def _within(parts: Parts, total_is: str, smallest_is: str, span: float | None) -> None:
    """A ProblemError when the parts' total exceeds MAX_TOTAL or `span` times the smallest value,
    for the key adding most: the most it may be, or the least the smallest value may be; or when
    the smallest value is below the tolerance itself."""
    total = sum(largest * weight for _, largest, weight in parts.values())
    smallest, smallest_key = min((low, key) for key, (low, _, _) in parts.items())
    span = None if smallest == 0 else span  # nothing held: no amount to tell apart
    allowed = MAX_TOTAL if span is None else min(MAX_TOTAL, smallest * span)
    if total <= allowed:
        if span is not None and smallest < RELATIVE_TOLERANCE:
            raise ProblemError(smallest_key, smallest, f"{smallest_is} must be at least {RELATIVE_TOLERANCE:g} "
                                                       "(the tolerance of zbopt's comparisons); use a smaller unit")
        return
    key = max(parts, key=lambda name: parts[name][1] * parts[name][2])
    _, largest, weight = parts[key]
    room = allowed - sum(high * count for name, (_, high, count) in parts.items() if name != key)
    ratio = allowed < MAX_TOTAL
    bound = f"{_short(span)} x {smallest_is} ({smallest_key} {smallest:g})" if ratio else _short(MAX_TOTAL)
    remedy = [f"at most {_rounded(room / weight, math.floor)} allowed here"] if room > 0 else []
    if ratio and total < math.inf:
        remedy.append(f"{smallest_is} at least {_rounded(total / span, math.ceil)}")
    raise ProblemError(key, largest, f"{total_is} {total:.3g}, more than {bound}; "
                                     f"{' or '.join(remedy) or 'give smaller values'}")


def _short(power: float) -> str:
    """A power of ten as "1e9"."""
    return f"{power:.0e}".replace("e+0", "e").replace("e+", "e")


def _rounded(value: float, direction) -> str:
    """`value` to three significant digits, rounded `direction` (math.floor or math.ceil), so that
    the value shown is itself allowed."""
    unit = 10.0 ** (math.floor(math.log10(value)) - 2)
    return f"{direction(value / unit) * unit:.3g}"
