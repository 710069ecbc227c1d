"""A memory-capped list schedule for any placement, chunk count and memory limit.

The published heuristics each fix a memory level (1F1B's, V-Min's, ...); below it none applies,
and the optimizer then starts from nothing. This one fits any limit at or above the floor (one
microbatch's activations on every stage of a device), so every problem has a warm start:

- whenever a device is free it runs, of the ops whose input has arrived, a B (the lowest
  microbatch, the later stage on a tie), else an F of a microbatch it has already taken in, else
  it takes in the next microbatch (the F on its first stage) if there is room, else a W: B's first
  and W's in the gaps, as the Zero Bubble schedules do;
- a device takes microbatches in, in microbatch order, only when its memory can hold all of the
  microbatch's activations on the device at once, which it then reserves. So an F of a taken-in
  microbatch always fits. A device waiting to take in the lowest unfinished microbatch (W's
  included) holds nothing: lower ones are finished, higher ones not yet taken in. So that
  microbatch is always taken in, its F's fit and its B's and W's need no room: the schedule never
  deadlocks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from operator import attrgetter

from zbopt.ops import Op
from zbopt.problem import FORWARD, WEIGHT, Problem
from zbopt.schedule import Schedule
from zbopt.schedules.registry import register, require
from zbopt.simulate import memory_ceiling
from zbopt.timeline import Timeline

_BACKWARD, _CONTINUE, _TAKE_IN, _WEIGHT = range(4)  # priorities, first wins


@register("greedy", "zbopt's memory-capped list schedule: any placement and chunk count, within the memory "
                    "limit (B first, F when the whole microbatch fits, W in the gaps)", attrgetter("memory_caps"))
def greedy(problem: Problem) -> Schedule:
    """The list schedule of the module docstring, timed as the simulator times it. One iteration."""
    require(problem.iterations == 1, "greedy", "iterations = 1 (it plans one iteration)")
    require(all(need <= memory_ceiling(cap) for need, cap in zip(problem.one_microbatch_memory, problem.memory_caps,
                                                                    strict=True)),
            "greedy", "a memory limit of at least one microbatch's activations on each device's stages "
                      "(it keeps every activation)")
    timeline = Timeline(problem)
    table = timeline.table
    m = problem.num_microbatches
    stages = [sorted(device_stages) for device_stages in problem.stages_of_device]
    footprint = problem.one_microbatch_memory
    ceiling = [memory_ceiling(limit) for limit in problem.memory_caps]
    reserved = [0.0] * problem.num_devices
    done = {(kind, stage): 0 for kind in problem.kinds for stage in range(problem.num_stages)}
    left = table.size
    followers: list[list[int]] = [[] for _ in range(table.size)]
    for index, source in enumerate(table.predecessor):
        if source >= 0:
            followers[source].append(index)
    turns = itertools.count()
    wake = [(0.0, next(turns), device) for device in range(problem.num_devices)]

    first_index = {(kind, stage): table.index(Op(kind, stage, 0)) for kind, stage in done}

    def candidates(device: int):
        """(ready time, priority, microbatch, -stage, kind) of each op the device could run next (it
        is free: every op it ran has ended and freed what it frees); a new microbatch only if it fits."""
        for stage in stages[device]:
            for kind in problem.kinds:
                count = done[kind, stage]
                if count >= m:
                    continue
                ready = timeline.ready_at(first_index[kind, stage] + count)
                if kind == WEIGHT:
                    yield ready, _WEIGHT, count, -stage, kind
                elif kind != FORWARD:
                    yield ready, _BACKWARD, count, -stage, kind
                elif stage != stages[device][0]:
                    yield ready, _CONTINUE, count, -stage, kind
                elif timeline.held[device] + reserved[device] + footprint[device] <= ceiling[device]:
                    yield ready, _TAKE_IN, count, -stage, kind

    while left:
        if not wake:
            raise RuntimeError("greedy: no op can start on any device")  # cannot happen (module docstring)
        now, _, device = heapq.heappop(wake)
        if now < timeline.free[device]:
            continue  # busy: it woke itself for when it is free
        options = list(candidates(device))
        startable = [option[1:] for option in options if option[0] <= now]
        if not startable:
            soonest = min((option[0] for option in options), default=math.inf)
            if soonest < math.inf:
                heapq.heappush(wake, (soonest, next(turns), device))
            continue  # otherwise another device's op, or this device's own, wakes it
        _, microbatch, negative_stage, kind = min(startable)
        op = Op(kind, -negative_stage, microbatch)
        index = first_index[kind, op.stage] + microbatch
        if kind == FORWARD:
            reserved[device] += footprint[device] if op.stage == stages[device][0] else 0.0
            reserved[device] -= table.memory_delta[index]
        timeline.append(op, now)
        done[kind, op.stage] += 1
        left -= 1
        heapq.heappush(wake, (timeline.free[device], next(turns), device))
        for successor in followers[index]:
            heapq.heappush(wake, (timeline.ready_at(successor), next(turns), table.device[successor]))
    return Schedule(timeline.orders, [[timeline.start_of(op) for op in order] for order in timeline.orders])
