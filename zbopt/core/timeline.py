"""The incremental timeline generators build their orders on.

A generator that decides op by op (the Zero Bubble greedy, the building-block slot plans) needs the
times and memory of what it has placed so far. It reads them here, from the same rules the
simulator uses: dependencies, latencies and durations from `OpTable`, memory from
`Problem.memory_delta`. A new op kind is added there and every
generator times it the same way. `simulate` stays the one judge of the finished schedule.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from zbopt.core import interrupt
from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.core.simulation.ends import gathered_memory, held_throughout
from zbopt.core.tolerance import memory_ceiling

__all__ = ["PendingFrees", "Timeline", "compact"]


class Timeline:
    """Ops placed one at a time on their devices (one iteration: no weight-update barriers).

    `append(op)` runs an op next on its device, as early as the device and its dependency allow,
    as `simulate` does for an order; `put(op, start)` records an op at a chosen start, for plans
    that fill gaps. `ready(op)` is when an op's input arrives, `held[d]` the memory device d holds
    after the ops appended to it (with FSDP, its stages' gathered parameters throughout and each
    one's unsharded gradients from its first gradient op on: every forward of a route leads to
    each of its stages' last gradient op, so none follows a reduction; or, `gradients_throughout`,
    from the start, for a plan that caps only its forwards, since a first W takes them at its
    start, which the end-of-op count here does not see), `orders` the appended ops per device.

    >>> from zbopt import Problem
    >>> timeline = Timeline(Problem(num_devices=2, num_microbatches=1, forward_times=1, backward_times=2,
    ...                             p2p_time=0.5))
    >>> timeline.append(Op("F", 0, 0)), timeline.ready(Op("F", 1, 0)), timeline.held
    (0.0, 1.5, [1.0, 0.0])
    """

    def __init__(self, problem: Problem, gradients_throughout: bool = False):
        self.problem = problem
        self.table = op_table(problem)
        self.start: list[float | None] = [None] * self.table.size
        self.free = [0.0] * problem.num_devices
        self.held = list((held_throughout if gradients_throughout else gathered_memory)(problem))
        ends = problem.iteration_ends
        self.gradients = None if ends is None or gradients_throughout or not any(ends.gradient_memory) \
            else list(ends.gradient_memory)
        self.orders: list[list[Op]] = [[] for _ in range(problem.num_devices)]

    def start_of(self, op: Op) -> float | None:
        """When a placed op starts; None while it is not placed."""
        return self.start[self.table.index(op)]

    def end(self, op: Op) -> float | None:
        """When a placed op ends; None while it is not placed."""
        index = self.table.index(op)
        start = self.start[index]
        return None if start is None else start + self.table.duration[index]

    def ready(self, op: Op) -> float:
        """The earliest start its dependency allows: its predecessor's end plus latency (0 without
        a predecessor; infinity while the predecessor is not placed), and for a forward its stage's
        unshard's end."""
        return self.ready_at(self.table.index(op))

    def ready_at(self, index: int) -> float:
        """`ready` of the op numbered `index` in `self.table` (for planners' inner loops)."""
        source = self.table.predecessor[index]
        release = self.table.release[index]
        if source < 0:
            return release
        began = self.start[source]
        return math.inf if began is None else max(release, began + self.table.duration[source] +
                                                  self.table.latency[index])

    def append(self, op: Op, not_before: float = 0.0) -> float:
        """Run `op` next on its device as early as possible, and not before `not_before` (a
        planner's own reason to wait, e.g. memory); its start time."""
        index = self.table.index(op)
        device = self.table.device[index]
        start = max(self.free[device], self.ready_at(index), not_before)
        self.start[index] = start
        self.free[device] = start + self.table.duration[index]
        self.held[device] += self.table.memory_delta[index]
        if self.gradients is not None and op.kind == self.problem.gradient_kind:
            self.held[device] += self.gradients[op.stage]  # taken at the stage's first gradient op
            self.gradients[op.stage] = 0.0
        self.orders[device].append(op)
        return start

    def put(self, op: Op, start: float) -> None:
        """Record `op` at `start` (or move it there), outside any device order."""
        self.start[self.table.index(op)] = start

    def schedule(self) -> Schedule:
        """The appended ops as per-device orders."""
        return Schedule(self.orders)


class PendingFrees:
    """A device's frees still to come, (end, amount) in end order (a device runs one op at a
    time). `Timeline.held` already subtracts them, so the memory held at a moment is `held` plus
    what is still pending then."""

    def __init__(self):
        self.queue: deque[tuple[float, float]] = deque()
        self.total = 0.0

    def add(self, end: float, amount: float) -> None:
        self.queue.append((end, amount))
        self.total += amount

    def time_when_at_most(self, room: float, earliest: float) -> float:
        """The first moment from `earliest` on when at most `room` is still pending; infinity when
        the frees so far never get there."""
        while self.queue and self.queue[0][0] <= earliest:
            self.total -= self.queue.popleft()[1]
        left = self.total
        if left <= room:
            return earliest
        for end, amount in self.queue:
            left -= amount
            if left <= room:
                return end
        return math.inf


def compact(problem: Problem, in_time_order: Sequence[Op], caps: Sequence[float]) -> Schedule:
    """Every op, taken in `in_time_order` (a valid schedule's ops by start time), as early as its
    device, its input and its device's memory cap allow: a forward waits until its device holds
    at most cap - its activation. When the schedule the order came from stays within `caps`, each
    op starts no later than there (by induction over the order), so compacting never lengthens it
    nor breaks the caps. Returns the timed schedule."""
    timeline = Timeline(problem)
    pending = [PendingFrees() for _ in range(problem.num_devices)]
    for op in in_time_order:
        interrupt.check()
        index = timeline.table.index(op)
        device = timeline.table.device[index]
        change = timeline.table.memory_delta[index]
        not_before = 0.0
        if op.kind == FORWARD:
            room = memory_ceiling(caps[device]) - change - timeline.held[device]
            not_before = pending[device].time_when_at_most(room, timeline.free[device])
            if not_before == math.inf:
                raise ValueError(f"{op} can never fit under device {device}'s cap {caps[device]:g} in this order")
        start = timeline.append(op, not_before)
        if change < 0:
            pending[device].add(start + timeline.table.duration[index], -change)
    return Schedule(timeline.orders, [[timeline.start_of(op) for op in order] for order in timeline.orders])
