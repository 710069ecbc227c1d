"""Re-gathered: a schedule with FSDP's reshard after forward added where its order leaves room (issue
44's generators that know the iteration's ends; `Problem.allow_reshard`).

A stage's parameters can be freed after its last forward of an iteration and gathered again (a G,
`zbopt.core.ops`) before its first input gradient or recompute of that iteration, only where every
forward of the stage comes before them in its device's order: breadth-first orders (GPipe, looped
BFS, interleaved 1F1B's warm-up on the first chunks), never 1F1B on one chunk. Where the G is
listed decides when the program issues it: right before the stage's first backward it frees the
parameters longest (the least memory) but the backward waits for the whole gather; listed earlier,
behind compute ops that take at least the gather's time, the gather hides behind them and the
memory comes back that much sooner. `regathered` lists every G one way or the other; `compare`
shows each variant that fits a memory limit the schedule breaks, or shortens the iteration.
"""

from __future__ import annotations

from itertools import groupby

from zbopt.core.kinds import COPY_KINDS, FORWARD, RECOMPUTE, REGATHER, SIDE_KINDS
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule

__all__ = ["PLACES", "regathered"]

PLACES = ("latest", "hidden")  # right before the stage's first backward; behind compute that covers the gather


def regathered(problem: Problem, schedule: Schedule, place: str) -> Schedule | None:
    """`schedule`'s orders with a G for every stage and iteration whose forwards all come before its
    first input gradient (or recompute) on its device, with compute between them to free the
    parameters over, listed as `place` says (PLACES; the simulator times the new orders). None
    where that adds none (re-gathers not allowed, no gathered parameters, no memory limit to pay
    for them, no such stage, or G's listed already), for overlapped pairs (a pair's backward would
    wait on a G listed inside it), for a schedule with start times (they are part of it: a wait
    for memory, which copy goes first on a shared host link; a G would move them) and for copies
    on a shared host link (the order alone does not say which goes first: moved, two may clash)."""
    if place not in PLACES:
        raise ValueError(f"place {place!r}: expected one of {PLACES}")
    shared = problem.offload is not None and problem.offload.shared_host_link
    if not problem.reshard_matters or schedule.pairs or schedule.start_times is not None or \
            any(op.kind == REGATHER or (shared and op.kind in COPY_KINDS) for order in schedule.orders for op in order):
        return None
    m = problem.num_microbatches
    orders = []
    for order in schedule.orders:
        parts = [list(part) for _, part in groupby(order, key=lambda op: op.microbatch // m)]
        orders.append(tuple(op for part in parts for op in _with_regathers(problem, part, place)))
    added = any(len(new) != len(old) for new, old in zip(orders, schedule.orders, strict=True))
    return Schedule(tuple(orders), name=schedule.name) if added else None


def _with_regathers(problem: Problem, part: list[Op], place: str) -> list[Op]:
    """One iteration's part of a device's order with its stages' G's inserted (`regathered`)."""
    held = problem.iteration_ends.unshard_memory
    backward = (problem.input_gradient_kind, RECOMPUTE)
    first_microbatch = part[0].microbatch // problem.num_microbatches * problem.num_microbatches
    inserts = []  # (position, G)
    for stage in sorted({op.stage for op in part if held[op.stage]}):
        last_forward = max(i for i, op in enumerate(part) if op.stage == stage and op.kind == FORWARD)
        first_backward = min(i for i, op in enumerate(part) if op.stage == stage and op.kind in backward)
        if first_backward - last_forward < 2:  # nothing runs while the parameters would be away
            continue
        position = first_backward
        if place == "hidden":
            covered, gather = 0.0, problem.cost(REGATHER, stage)
            while covered < gather and position - 1 > last_forward:
                position -= 1
                op = part[position]
                covered += 0.0 if op.kind in SIDE_KINDS else problem.cost(op.kind, op.stage, op.microbatch)
        inserts.append((position, Op(REGATHER, stage, first_microbatch)))
    placed = list(part)
    for position, regather in sorted(inserts, key=lambda item: -item[0]):
        placed.insert(position, regather)
    return placed
