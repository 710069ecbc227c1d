"""From a block to a schedule: repeat it for m microbatches, then squeeze without raising the peak.

"Pipeline Parallelism with Controllable Memory" (section 3): the block repeated every T is a valid
schedule; *squeezing* then starts every op as early as its device and its input allow, which removes
the idle warm-up and cool-down. Squeezing alone may raise the memory (forwards move earlier than
the backwards that free it), so a forward here also waits until its device has room under the
repeated schedule's own peak: the squeezed schedule is never later, op by op, nor higher.
"""

from __future__ import annotations

import heapq
import itertools
import math

from zbopt.core import interrupt
from zbopt.core.errors import NotApplicableError
from zbopt.core.kinds import FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem.mechanisms import unshard_windows
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import simulate
from zbopt.core.timeline import PendingFrees, Timeline, compact
from zbopt.core.tolerance import memory_ceiling
from zbopt.solvers.blocks.model import Block

__all__ = ["block_schedule", "repeat"]


def repeat(block: Block, microbatches: int | None = None) -> dict[Op, float]:
    """Every op's start when the block repeats for `microbatches` (default: the problem's m):
    microbatch g·group + i runs the block's op (kind, stage, i) at its offset + g·period."""
    m = block.problem.num_microbatches if microbatches is None else microbatches
    return {Op(op.kind, op.stage, g * block.group + op.microbatch): block.offsets[op] + g * block.period
            for g in range(math.ceil(m / block.group)) for op in block.ops if g * block.group + op.microbatch < m}


def block_schedule(block: Block) -> Schedule:
    """The block repeated for the problem's m microbatches and squeezed (see the module doc): each
    device runs its ops in the repeated schedule's order, each as early as its device, its input
    and its device's memory (at most the repeated schedule's peak) allow. One iteration."""
    problem = block.problem
    if problem.iterations != 1:
        raise NotApplicableError(f"a block schedule needs iterations = 1 (got {problem.iterations})")
    unshards = problem.iteration_ends.unshard_times if problem.iteration_ends else ()
    lead = max(end for _, end in unshard_windows(problem)) if any(unshards) else 0.0  # the block waits for them
    starts = {op: start + lead for op, start in repeat(block).items()}
    in_time_order = sorted(starts, key=lambda op: (starts[op], op.stage, op.microbatch))
    orders: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    for op in in_time_order:
        orders[problem.device_of(op.stage)].append(op)
    repeated = Schedule(orders, [[starts[op] for op in order] for order in orders])
    peaks = simulate(problem.replace(memory_limit=None), repeated).peak_memory
    candidates = (compact(problem, in_time_order, peaks), _fill_gaps(block, orders, peaks))
    return min(candidates, key=lambda schedule: simulate(problem, schedule).makespan)


def _fill_gaps(block: Block, orders: list[list[Op]], peaks) -> Schedule:
    """List scheduling by the repeated schedule's order: whenever a device is free it runs, of
    the ops it could start now, the first F or B in that order, else the first W (B's first, W's
    fill the gaps: the Zero Bubble idea, and the paper's reordering of warm-up and cool-down);
    when none can start it waits for the first that can. It looks as far ahead as one block's
    length of its order. A forward passes only W's (so it never takes memory that a B before it
    would free: no deadlock) and waits for room under the device's peak."""
    problem = block.problem
    ahead = math.ceil(block.length / block.period + 1) * len(block.ops) // problem.num_devices + 1
    timeline = Timeline(problem)
    pending = [PendingFrees() for _ in range(problem.num_devices)]
    unplaced = [[timeline.table.index(op) for op in order] for order in orders]  # op numbers: the scan is hot
    waited: dict[int, int] = {}
    placed, turns = 0, itertools.count()
    decide = [(0.0, next(turns), device) for device in range(problem.num_devices) if orders[device]]
    while decide:
        interrupt.check()
        now, _, device = heapq.heappop(decide)
        index, earliest = _first_startable(timeline, unplaced[device][:ahead], now, pending[device],
                                           memory_ceiling(peaks[device]))
        if earliest > now:  # nothing can start now: wait; other devices may place what it needs
            if earliest == math.inf:  # after the others' turns now, or their next turn if none moved
                later = [when for when, _, _ in decide if when > now]
                if waited.get(device) == placed and not later:  # nobody can move: cannot happen (see above)
                    raise RuntimeError(f"block schedule of {block.name}: no op can start on any device")
                earliest = now if waited.get(device) != placed else min(later)
                waited[device] = placed
            heapq.heappush(decide, (earliest, next(turns), device))
            continue
        start = timeline.append(timeline.table.op(index), now)
        placed += 1
        unplaced[device].remove(index)
        change = timeline.table.memory_delta[index]
        if change < 0:
            pending[device].add(start + timeline.table.duration[index], -change)
        if unplaced[device]:
            heapq.heappush(decide, (timeline.free[device], next(turns), device))
    return Schedule(timeline.orders, [[timeline.start_of(op) for op in order] for order in timeline.orders])


def _first_startable(timeline: Timeline, candidates: list[int], now: float, pending: PendingFrees,
                     ceiling: float) -> tuple[int | None, float]:
    """(op number, when) for `_fill_gaps`: the first F or B of `candidates` (op numbers in
    `timeline.table`) that can start at `now`, else the first such W, else the op that can start
    first (infinity: none can until others move)."""
    table = timeline.table
    weight, soonest, passed_backward = None, (math.inf, None), False
    for index in candidates:
        kind = table.kind[index]
        if kind == FORWARD and passed_backward:
            continue
        passed_backward |= kind != WEIGHT
        ready = timeline.ready_at(index)
        if ready <= now and kind == FORWARD:
            room = ceiling - table.memory_delta[index] - timeline.held[table.device[index]]
            ready = pending.time_when_at_most(room, now)
        if ready <= now:
            if kind != WEIGHT:
                return index, now
            weight = index if weight is None else weight
        elif ready < soonest[0]:
            soonest = (ready, index)
    return (weight, now) if weight is not None else (soonest[1], soonest[0])
