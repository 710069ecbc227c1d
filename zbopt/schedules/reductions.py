"""Reductions in turn: a schedule whose devices end with a run of weight-gradient ops (W) regrouped so
that the iteration's gradient reductions start as early as they can (issue 44's "W ordered by stage"
variant of any generator).

A stage's reduction starts once its last gradient op has ended (`zbopt.core.simulation.ends`); a
device that ends on W of several stages (two chunks or more per device: ZB-V, interleaved) finishes
them in whatever order its generator left them, often interleaved, so every one of its reductions
waits for the end. The W at the end of a device's order depend on nothing still to run there and
nothing depends on them, so any order of them is valid and ends compute at the same time (its memory
may differ: where gradients are held until their reduction, `gradient_memory`, the order decides
when each stage's are taken and given back). Taken alone, that run is a two-machine flow shop: each
stage a job, its trailing W on compute, then its reduction on the communication stream; Johnson's
rule (Johnson 1954: the jobs whose compute is at most their reduction first, by compute ascending,
then the rest by reduction descending, each job's W together) ends the stream soonest. The stream's
earlier reductions were all ready before the run began, so they act as one more job with no W, which
Johnson's rule puts first anyway: the result is the best order of the run for its device's step (the
other devices keep theirs); where compute slows under a transfer (`comm_slowdown`) that is no longer
certain. `compare` shows it as a "(reductions in turn)" row where it shortens the iteration. With
several iterations each one's run is regrouped: a device's ops of an iteration all come before its
step, so its part of the order ends with that iteration's W.
"""

from __future__ import annotations

from itertools import groupby

from zbopt.core.kinds import WEIGHT
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule

__all__ = ["reductions_in_turn"]


def reductions_in_turn(problem: Problem, schedule: Schedule) -> Schedule | None:
    """`schedule`'s orders with each device's trailing W regrouped by stage in Johnson's order
    (given start times dropped: the simulator times the new orders), or None where that moves
    nothing (no gradient reductions, a fused backward, overlapped pairs, or every device's trailing
    W already in that order)."""
    ends = problem.iteration_ends
    if ends is None or not any(ends.reduce_times) or not problem.split_backward or schedule.pairs:
        return None
    table, m = op_table(problem), problem.num_microbatches
    orders = []
    for order in schedule.orders:
        parts = [list(part) for _, part in groupby(order, key=lambda op: op.microbatch // m)]
        orders.append(tuple(op for part in parts for op in _regrouped(part, table, ends.reduce_times)))
    moved = any(tuple(new) != tuple(old) for new, old in zip(orders, schedule.orders, strict=True))
    return Schedule(tuple(orders), name=schedule.name) if moved else None


def _regrouped(part: list[Op], table, reduce_times: tuple[float, ...]) -> list[Op]:
    """One iteration's part of a device's order with its trailing W in Johnson's order."""
    kept = len(part)
    while kept and part[kept - 1].kind == WEIGHT:
        kept -= 1
    tail = part[kept:]
    return part[:kept] + [op for stage in _johnson(tail, table, reduce_times) for op in tail if op.stage == stage]


def _johnson(tail: tuple[Op, ...], table, reduce_times: tuple[float, ...]) -> list[int]:
    """The stages of `tail` in Johnson's order: compute (their W in the tail) at most their
    reduction first, by compute ascending; then the rest by reduction descending (ties: as they
    first appear)."""
    work: dict[int, float] = {}
    for op in tail:
        work[op.stage] = work.get(op.stage, 0.0) + table.duration[table.index(op)]
    first = sorted((stage for stage in work if work[stage] <= reduce_times[stage]), key=lambda stage: work[stage])
    last = sorted((stage for stage in work if work[stage] > reduce_times[stage]),
                  key=lambda stage: -reduce_times[stage])
    return first + last
