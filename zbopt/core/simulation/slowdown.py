"""Compute slowed while its device communicates (`comm_slowdown`, the iteration's ends): a compute
op's work runs at 1/factor of its speed while a transfer of its device runs (an unshard, a
reduction or a re-gather G: NCCL's kernels take a share of the device's cores and memory
bandwidth), at full speed otherwise.

Every transfer an op can meet is known when the sweep times it (`zbopt.core.simulation.timing`),
since the sweep times a device's ops in its order: its unshards (from time 0, a later iteration's
from its step), the re-gathers listed before it (issued when the compute op before them ends), and
the reductions of the stages whose last gradient op of the iteration has ended (each placed as its
stage becomes ready, which on one compute lane is the simulator's order of them, `device_ends`); a
reduction of a later gradient op starts after the op ends. So timing as soon as possible stays one
pass, and the ends timed afterwards (`ends.end_times`) are the windows it met.
"""

from __future__ import annotations

import bisect

from zbopt.core.ops import OpTable
from zbopt.core.problem.mechanisms import unshard_windows, unshards_done
from zbopt.core.simulation.ends import device_ends

__all__ = ["Slowdown"]


class Slowdown:
    """Per device, the windows of its transfers known so far (sorted; those before its compute's
    last start dropped) and its stream's state; `finish` is when a compute op ends."""

    def __init__(self, table: OpTable):
        problem = self.problem = table.problem
        self.factor = problem.iteration_ends.comm_slowdown
        self.windows: list[list[tuple[float, float]]] = [[] for _ in range(problem.num_devices)]
        self.stream_free = list(unshards_done(problem))
        self._add_unshards(unshard_windows(problem))
        self.gradient = problem.gradient_kind
        self.kind, self.stage, self.iteration = table.kind, table.stage, table.iteration
        self.left: dict[tuple[int, int], int] = {}  # per (stage, iteration), its gradient ops still to end
        for index, kind in enumerate(table.kind):  # (not `iteration_barrier`: a route's stage has fewer than m)
            if kind == self.gradient:
                key = (table.stage[index], table.iteration[index])
                self.left[key] = self.left.get(key, 0) + 1

    def _add_unshards(self, windows) -> None:
        for stage, (begin, end) in enumerate(windows):
            self.add(self.problem.device_of(stage), begin, end)

    def add(self, device: int, begin: float, end: float) -> None:
        """A transfer of `device` from `begin` to `end` (nothing where it takes no time)."""
        if end > begin:
            bisect.insort(self.windows[device], (begin, end))

    def finish(self, device: int, begin: float, work: float) -> float:
        """When a compute op of `device` that starts at `begin` (no earlier than the device's
        compute ops timed before it) has done `work`: at full speed outside its transfers, at
        1/factor inside them (overlapping transfers slow it once)."""
        windows = self.windows[device]
        while windows and windows[0][1] <= begin:
            windows.pop(0)
        now, left = begin, work
        for start, stop in windows:
            if stop <= now:
                continue  # inside a transfer already passed (two overlap)
            if start > now:
                if now + left <= start:
                    return now + left
                left -= start - now
                now = start
            inside = (stop - now) / self.factor
            if left <= inside:
                return now + left * self.factor
            left -= inside
            now = stop
        return now + left

    def ended(self, device: int, index: int, end: float) -> None:
        """Op `index` of `device` ended at `end`: the last gradient op of its stage and iteration
        places the stage's reduction on the device's stream."""
        if self.kind[index] != self.gradient:
            return
        key = (self.stage[index], self.iteration[index])
        self.left[key] -= 1
        if not self.left[key]:
            placed = device_ends(self.problem, device, self.stream_free[device], end, {key[0]: end})
            begin, self.stream_free[device] = placed.reduce[key[0]]
            self.add(device, begin, self.stream_free[device])

    def next_iteration(self, device: int, steps_done: tuple[float, ...]) -> None:
        """`device`'s optimizer step has ended (at `steps_done[device]`): its next unshards start then."""
        windows = unshard_windows(self.problem, steps_done)
        for stage in self.problem.stages_of_device[device]:
            self.add(device, *windows[stage])
        self.stream_free[device] = unshards_done(self.problem, steps_done)[device]
