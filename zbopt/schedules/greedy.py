"""A memory-capped list schedule for any placement, chunk count and memory limit.

The published heuristics each fix a memory level (1F1B's, V-Min's, ...); below it none applies,
and the optimizer then starts from nothing. This one fits any limit at or above the floor (one
microbatch's activations on every stage of a device that its route visits), so every problem has
a warm start:

- whenever a device is free it runs, of the ops whose input has arrived, a B (the lowest
  microbatch, the later stage on a tie), else an F of a microbatch it has already taken in, else
  it takes in a new microbatch (the F on its route's first stage on the device) if there is room,
  else a W: B's first and W's in the gaps, as the Zero Bubble schedules do;
- a device takes a microbatch in only when its memory can hold all of the microbatch's
  activations on the device at once, which it then reserves; and, unless it is the lowest
  microbatch the device has still to take in, only when room for one more microbatch (the most
  any needs there) stays free besides. So an F of a taken-in microbatch always fits. The lowest
  unfinished microbatch is never stuck: a device that has not taken it in holds only higher
  microbatches, each taken in with that spare room, which nothing has used since. With one
  route (every placement but bidirectional) a device takes microbatches in in microbatch order,
  always the lowest, and the spare room is never asked for.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
from operator import attrgetter

from zbopt.core import interrupt
from zbopt.core.errors import NotApplicableError
from zbopt.core.kinds import FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import simulate
from zbopt.core.timeline import Timeline
from zbopt.core.tolerance import memory_ceiling
from zbopt.schedules.common import gradient_modes
from zbopt.schedules.registry import register, require

__all__ = ["greedy"]

_BACKWARD, _CONTINUE, _TAKE_IN, _WEIGHT = range(4)  # priorities, first wins


@register("greedy", "zbopt's memory-capped list schedule: any placement and chunk count, within the memory "
                    "limit (B first, F when the whole microbatch fits, W in the gaps)", attrgetter("memory_caps"),
          bidirectional=True)
def greedy(problem: Problem) -> Schedule:
    """The list schedule of the module docstring, timed as the simulator times it; with FSDP's
    gradients held under a limit, the shorter of its two ways to count them that fits
    (`gradient_modes`). One iteration."""
    require(problem.iterations == 1, "greedy", "iterations = 1 (it plans one iteration)")
    require(all(need <= memory_ceiling(cap) for need, cap in zip(problem.one_microbatch_memory, problem.memory_caps,
                                                                    strict=True)),
            "greedy", "a memory limit of at least one microbatch's activations on each device's stages "
                      "(it keeps every activation)")
    modes = gradient_modes(problem)
    if len(modes) == 1:
        return _ListSchedule(problem, *modes).run()
    fitting = []  # (makespan, mode, schedule) of each way that fits
    for mode in modes:
        with contextlib.suppress(NotApplicableError):
            schedule = _ListSchedule(problem, mode).run()
            if (result := simulate(problem, schedule)).valid:
                fitting.append((result.makespan, mode, schedule))
    if not fitting:
        raise NotApplicableError("greedy: no op fits under the memory limit with the gradients its W's take")
    return min(fitting)[2]


class _ListSchedule:
    """The list schedule under way: the ops placed (a `Timeline`), per (kind, stage) how many ran,
    per device the memory reserved for the microbatches it took in, and the devices' wake-ups."""

    def __init__(self, problem: Problem, gradients_throughout: bool):
        self.problem = problem
        self.timeline = Timeline(problem, gradients_throughout)
        self.table = table = self.timeline.table
        self.stages = [sorted(device_stages) for device_stages in problem.stages_of_device]
        self.microbatches = {stage: problem.microbatches_of(stage) for stage in range(problem.num_stages)}
        self.footprint = _footprints(problem, self.stages)
        self.spare = problem.one_microbatch_memory
        self.ceiling = [memory_ceiling(limit) for limit in problem.memory_caps]
        self.reserved = [0.0] * problem.num_devices
        self.done = {(kind, stage): 0 for kind in problem.kinds for stage in range(problem.num_stages)}
        self.first_index = {(kind, stage): table.index(Op(kind, stage, self.microbatches[stage][0]))
                            for kind, stage in self.done}
        self.followers: list[list[int]] = [[] for _ in range(table.size)]
        for index, source in enumerate(table.predecessor):
            if source >= 0:
                self.followers[source].append(index)
        self.turns = itertools.count()
        self.wake = [(0.0, next(self.turns), device) for device in range(problem.num_devices)]

    def run(self) -> Schedule:
        """Wake devices in time order; each free one runs the op the module docstring's rule picks."""
        left = self.table.size
        while left:
            interrupt.check()
            if not self.wake:
                # only where the limit is below what the problem's memory floor can see (FSDP's gathered
                # parameters of another route)
                raise NotApplicableError("greedy: no op fits under the memory limit on any device")
            now, _, device = heapq.heappop(self.wake)
            if now < self.timeline.free[device]:
                continue  # busy: it woke itself for when it is free
            op = self.choose(device, now)
            if op is not None:
                self.place(device, op, now)
                left -= 1
        timeline = self.timeline
        return Schedule(timeline.orders, [[timeline.start_of(op) for op in order] for order in timeline.orders])

    def choose(self, device: int, now: float) -> Op | None:
        """The op the device runs at `now`, or None: then it wakes when its soonest op is ready
        (if none, another device's op, or its own, wakes it)."""
        options = list(self.candidates(device))
        startable = [option[1:] for option in options if option[0] <= now]
        if not startable:
            soonest = min((option[0] for option in options), default=math.inf)
            if soonest < math.inf:
                self.wake_at(soonest, device)
            return None
        _, microbatch, negative_stage, kind = min(startable)
        return Op(kind, -negative_stage, microbatch)

    def candidates(self, device: int):
        """(ready time, priority, microbatch, -stage, kind) of each op the device could run next (it
        is free: every op it ran has ended and freed what it frees); a new microbatch only if it fits."""
        for stage in self.stages[device]:
            microbatches = self.microbatches[stage]
            for kind in self.problem.kinds:
                count = self.done[kind, stage]
                if count >= len(microbatches):
                    continue
                ready = self.timeline.ready_at(self.first_index[kind, stage] + count)
                microbatch = microbatches[count]
                if kind == WEIGHT:
                    yield ready, _WEIGHT, microbatch, -stage, kind
                elif kind != FORWARD:
                    yield ready, _BACKWARD, microbatch, -stage, kind
                elif stage not in self.footprint[device]:
                    yield ready, _CONTINUE, microbatch, -stage, kind
                elif self.fits(device, stage):
                    yield ready, _TAKE_IN, microbatch, -stage, kind

    def fits(self, device: int, stage: int) -> bool:
        """Whether the device may take in the next microbatch of its route's first stage `stage`
        there (see the module docstring)."""
        footprint, done, microbatches = self.footprint[device], self.done, self.microbatches
        taken = microbatches[stage][done[FORWARD, stage]]
        room = self.ceiling[device] - self.timeline.held[device] - self.reserved[device] - \
            footprint[stage][taken % self.problem.num_microbatches]
        pending = [microbatches[entry][done[FORWARD, entry]] for entry in footprint
                   if done[FORWARD, entry] < len(microbatches[entry])]
        lowest = taken == min(pending)
        return room >= 0 and (lowest or room >= self.spare[device])

    def place(self, device: int, op: Op, now: float) -> None:
        """Run `op` at `now`: a forward moves its activation from the device's reservation to what
        it holds; the device wakes when free, each op waiting on this one when it is ready."""
        index = self.first_index[op.kind, op.stage] + self.done[op.kind, op.stage]
        if op.kind == FORWARD:
            if op.stage in self.footprint[device]:
                self.reserved[device] += self.footprint[device][op.stage][op.microbatch % self.problem.num_microbatches]
            self.reserved[device] -= self.table.memory_delta[index]
        self.timeline.append(op, now)
        self.done[op.kind, op.stage] += 1
        self.wake_at(self.timeline.free[device], device)
        for successor in self.followers[index]:
            self.wake_at(self.timeline.ready_at(successor), self.table.device[successor])

    def wake_at(self, time: float, device: int) -> None:
        heapq.heappush(self.wake, (time, next(self.turns), device))


def _footprints(problem: Problem, stages: list[list[int]]) -> list[dict[int, tuple[float, ...]]]:
    """Per device, its route's first stage there -> per microbatch of one iteration, the
    activations it holds on the device (its own, where microbatches differ)."""
    footprint: list[dict[int, tuple[float, ...]]] = [{} for _ in range(problem.num_devices)]
    for device, device_stages in enumerate(stages):
        for route, _ in problem.routes:
            mine = [stage for stage in device_stages if stage in route]
            if mine:
                footprint[device][mine[0]] = tuple(
                    sum(problem.memory_delta(FORWARD, stage, microbatch=j) for stage in mine)
                    for j in range(problem.num_microbatches))
    return footprint
