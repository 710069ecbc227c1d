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

import heapq
import itertools
import math
from operator import attrgetter

from zbopt.kinds import FORWARD, WEIGHT
from zbopt.ops import Op
from zbopt.problem import Problem
from zbopt.schedule import Schedule
from zbopt.schedules.registry import register, require
from zbopt.timeline import Timeline
from zbopt.tolerance import memory_ceiling

_BACKWARD, _CONTINUE, _TAKE_IN, _WEIGHT = range(4)  # priorities, first wins


@register("greedy", "zbopt's memory-capped list schedule: any placement and chunk count, within the memory "
                    "limit (B first, F when the whole microbatch fits, W in the gaps)", attrgetter("memory_caps"),
          bidirectional=True)
def greedy(problem: Problem) -> Schedule:
    """The list schedule of the module docstring, timed as the simulator times it. One iteration."""
    require(problem.iterations == 1, "greedy", "iterations = 1 (it plans one iteration)")
    require(all(need <= memory_ceiling(cap) for need, cap in zip(problem.one_microbatch_memory, problem.memory_caps,
                                                                    strict=True)),
            "greedy", "a memory limit of at least one microbatch's activations on each device's stages "
                      "(it keeps every activation)")
    timeline = Timeline(problem)
    table = timeline.table
    stages = [sorted(device_stages) for device_stages in problem.stages_of_device]
    microbatches = {stage: problem.microbatches_of(stage) for stage in range(problem.num_stages)}
    # per device, its route's first stage there -> the activations a microbatch of that route holds on it
    footprint: list[dict[int, float]] = [{} for _ in range(problem.num_devices)]
    for device, device_stages in enumerate(stages):
        for route, _ in problem.routes:
            mine = [stage for stage in device_stages if stage in route]
            if mine:
                footprint[device][mine[0]] = sum(problem.activation_memory[stage] for stage in mine)
    spare = problem.one_microbatch_memory
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

    first_index = {(kind, stage): table.index(Op(kind, stage, microbatches[stage][0])) for kind, stage in done}

    def fits(device: int, stage: int) -> bool:
        """Whether the device may take in the next microbatch of its route's first stage `stage`
        there (see the module docstring)."""
        room = ceiling[device] - timeline.held[device] - reserved[device] - footprint[device][stage]
        pending = [microbatches[entry][done[FORWARD, entry]] for entry in footprint[device]
                   if done[FORWARD, entry] < len(microbatches[entry])]
        lowest = microbatches[stage][done[FORWARD, stage]] == min(pending)
        return room >= 0 and (lowest or room >= spare[device])

    def candidates(device: int):
        """(ready time, priority, microbatch, -stage, kind) of each op the device could run next (it
        is free: every op it ran has ended and freed what it frees); a new microbatch only if it fits."""
        for stage in stages[device]:
            for kind in problem.kinds:
                count = done[kind, stage]
                if count >= len(microbatches[stage]):
                    continue
                ready = timeline.ready_at(first_index[kind, stage] + count)
                microbatch = microbatches[stage][count]
                if kind == WEIGHT:
                    yield ready, _WEIGHT, microbatch, -stage, kind
                elif kind != FORWARD:
                    yield ready, _BACKWARD, microbatch, -stage, kind
                elif stage not in footprint[device]:
                    yield ready, _CONTINUE, microbatch, -stage, kind
                elif fits(device, stage):
                    yield ready, _TAKE_IN, microbatch, -stage, kind

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
        index = first_index[kind, op.stage] + done[kind, op.stage]
        if kind == FORWARD:
            reserved[device] += footprint[device].get(op.stage, 0.0)
            reserved[device] -= table.memory_delta[index]
        timeline.append(op, now)
        done[kind, op.stage] += 1
        left -= 1
        heapq.heappush(wake, (timeline.free[device], next(turns), device))
        for successor in followers[index]:
            heapq.heappush(wake, (timeline.ready_at(successor), next(turns), table.device[successor]))
    return Schedule(timeline.orders, [[timeline.start_of(op) for op in order] for order in timeline.orders])
