"""A timed schedule and its metrics (`Simulation`), as the simulator returns it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from zbopt.core.ops import COMPUTE_LANE, Op, OpTable
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule, pair_text
from zbopt.core.simulation.ends import EndTimes
from zbopt.core.wiring import Shown, dataframe

__all__ = ["MemoryViolation", "Pair", "Simulation"]


class Pair(NamedTuple):
    """An overlapped pair as the simulator runs it: its members' op numbers (the forward first),
    in its device's order, and its cost."""

    members: tuple[int, ...]
    cost: float


@dataclass(frozen=True)
class MemoryViolation:
    """The first moment a device holds more than its memory limit."""

    device: int
    time: float
    amount: float
    limit: float

    def __str__(self) -> str:
        return f"device {self.device} holds {self.amount:g} at t={self.time:g}, over its memory limit {self.limit:g}"


@dataclass(frozen=True, eq=False)
class Simulation(Shown):
    """A timed schedule and its metrics. Build it with `simulate`, never by hand.

    Metrics (times in the problem's units, memory in its memory units):

    - `makespan`: last op end minus first op start, over all devices.
    - `iteration_time`: until every device's optimizer step has ended (`ends`, the windows of the
      iteration's ends: unshards, reductions, steps); the makespan where the problem has none.
    - `busy[d]`: total duration of device d's compute ops (recomputes included: work, if
      repeated; copies excluded: they run on the copy lanes beside compute);
      `idle[d]` = makespan - busy[d].
    - `bubble_rate` = 1 - sum(busy) / (p · makespan): the idle share of all device time.
    - `span[d]`: from device d's first op start to its last op end.
    - `zb_bubble_rate` = 1 - max(busy) / max(span): the Zero Bubble paper's measure
      (span - m(F+B+W)) / span, where span is the longest per-device span. With uniform costs
      max(busy) = m·v·(F+B+W)·iterations, the paper's formula; with non-uniform costs the busiest
      device's work stands in for m(F+B+W).
    - `peak_memory[d]`: the most memory device d holds at any moment. F holds activation_memory
      from its start; B releases M_B - M_W at its end, W releases M_W at its end, BW releases M_B
      at its end. A recomputed activation's F holds only checkpoint_memory, its R the rest from
      R's start. An offloaded one is freed when its O ends and held again from its L's start.
      Releases at a moment count before allocations at the same moment.
    - `memory_steps[d]`: (times, levels): from times[i] on, device d holds levels[i].
    - `violations`: per device over its limit, the first such moment; `valid` when there is none.
    - `table.recomputed`, `table.offloaded`: the (stage, microbatch) pairs the schedule recomputes
      (its R ops) and offloads (its O and L ops).

    `device_ops[d]` are the op numbers of device d in schedule order.
    """

    problem: Problem
    schedule: Schedule
    table: OpTable  # numbers the ops; start, end are indexed by op number
    device_ops: tuple[np.ndarray, ...]
    start: np.ndarray
    end: np.ndarray
    memory_steps: tuple[tuple[np.ndarray, np.ndarray], ...]
    violations: tuple[MemoryViolation, ...]
    pairs: tuple[Pair, ...] = ()
    memory_after: np.ndarray | None = None  # per op, what its device holds right after the op's own change
    ends: EndTimes | None = None  # the iteration's ends, where the problem has them

    @property
    def valid(self) -> bool:
        return not self.violations

    @cached_property
    def origin(self) -> float:
        """The first op's start (time 0 where unshards run first): time 0 of the charts, the report
        and the traces."""
        first = float(self.start.min())
        return min(first, 0.0) if self.ends is not None and any(self.problem.iteration_ends.unshard_times) else first

    @cached_property
    def makespan(self) -> float:
        return float(self.end.max()) - self.origin

    @cached_property
    def iteration_time(self) -> float:
        """Until every device's optimizer step has ended (the makespan without the iteration's ends):
        what the solvers minimise."""
        return self.makespan if self.ends is None else max(self.ends.finish, float(self.end.max())) - self.origin

    @cached_property
    def busy(self) -> tuple[float, ...]:
        work = np.where(np.asarray(self.table.lane) == COMPUTE_LANE, self.table.duration, 0.0)
        for pair in self.pairs:  # one op of the pair's cost
            work[list(pair.members)] = 0.0
            work[pair.members[0]] = pair.cost
        return tuple(float(work[indices].sum()) for indices in self.device_ops)

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - busy for busy in self.busy)

    @cached_property
    def span(self) -> tuple[float, ...]:
        return tuple(float(self.end[i].max() - self.start[i].min()) for i in self.device_ops)

    @property
    def bubble_rate(self) -> float:
        return 1.0 - sum(self.busy) / (self.problem.num_devices * self.makespan)

    @property
    def zb_bubble_rate(self) -> float:
        return 1.0 - max(self.busy) / max(self.span)

    @cached_property
    def peak_memory(self) -> tuple[float, ...]:
        return tuple(float(levels.max()) for _, levels in self.memory_steps)

    def times_of(self, op: Op) -> tuple[float, float]:
        """(start, end) of one op."""
        index = self.table.index(op)
        return float(self.start[index]), float(self.end[index])

    def to_dataframe(self):
        """One row per device: busy, idle, span, peak memory, as a pandas DataFrame (pandas is optional)."""
        return dataframe([{"device": device, "busy": self.busy[device], "idle": self.idle[device],
                                   "span": self.span[device], "peak_memory": self.peak_memory[device]}
                                  for device in range(self.problem.num_devices)])

    def timed_orders(self) -> Schedule:
        """The schedule with the simulated start times filled in."""
        times = [self.start[indices].tolist() for indices in self.device_ops]
        return dataclasses.replace(self.schedule, start_times=times)

    def to_dict(self) -> dict:
        """Every metric as JSON-able values, plus the problem and the timed schedule."""
        problem = self.problem
        return {
            "schedule": self.schedule.name,
            "num_stages": problem.num_devices,
            "num_devices": problem.num_devices,
            "num_virtual_stages": problem.num_stages,
            "num_microbatches": problem.num_microbatches,
            "chunks_per_device": problem.chunks_per_device,
            "placement": problem.placement,
            "iterations": problem.iterations,
            "split_backward": problem.split_backward,
            "makespan": self.makespan,
            "iteration_time": self.iteration_time,
            "bubble_rate": self.bubble_rate,
            "zb_bubble_rate": self.zb_bubble_rate,
            "busy": list(self.busy),
            "idle": list(self.idle),
            "span": list(self.span),
            "peak_memory": list(self.peak_memory),
            "memory_limit": None if problem.memory_limit is None else list(problem.memory_limit),
            "valid": self.valid,
            "recomputed": [list(pair) for pair in self.table.recomputed],
            "offloaded": [list(pair) for pair in self.table.offloaded],
            "violations": [str(violation) for violation in self.violations],
            "orders": [[str(op) for op in order] for order in self.schedule.orders],
            "start_times": [self.start[indices].tolist() for indices in self.device_ops],
            "pairs": [pair_text(members) for members in self.schedule.pairs],
        }
