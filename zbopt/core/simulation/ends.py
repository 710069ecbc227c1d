"""The iteration's ends, timed around the pipeline (`Problem.iteration_ends`): FSDP's unshards
before the first forwards, each stage's gradient reduction after its last gradient op, and each
device's optimizer step after its compute and reductions.

They run as zbopt's lowering to torch's compute_comms CSV places them
(`zbopt.io.torch_format.torch_comms_actions`), so no schedule lists them: each device's
communication stream, beside compute, carries one transfer at a time, the unshards from time 0
chunk by chunk, then each reduction once its stage's last gradient op has ended, in the order they
become ready (which is also the order that ends the stream soonest: one machine with release
times). The step runs on compute, last. Torch's own lowering agrees up to 3 chunks per device
(`_add_unshard_reshard` prefetches 3 stages: all of them at the start; `_add_reduce_grad` puts a
reduction after the stage's last backward) but reshards at the rank's end, holding the gathered
parameters longer than zbopt's RESHARD right after the stage's last gradient op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zbopt.core.ops import COMPUTE_LANE, OpTable
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshard_windows

__all__ = ["EndTimes", "EndWindow", "end_times", "gathered_memory", "gradient_ends", "unshards_done"]


@dataclass(frozen=True)
class EndTimes:
    """When each of the iteration's ends runs, as (start, end) pairs.

    unshard, reduce : per virtual stage (a zero-length window where it takes no time).
    step : per device, its optimizer step.
    gradients_done : per virtual stage, when its last gradient op ends (its reshard).
    """

    unshard: tuple[tuple[float, float], ...]
    reduce: tuple[tuple[float, float], ...]
    step: tuple[tuple[float, float], ...]
    gradients_done: tuple[float, ...]

    @property
    def finish(self) -> float:
        """When the last device's step has ended: the iteration's end."""
        return max(end for _, end in self.step)

    def windows(self, problem: Problem) -> list[EndWindow]:
        """Every end that takes time, as the charts, the report and the trace draw it: each
        stage's unshard and reduction named as torch's actions ("0UNSHARD", "0REDUCE_GRAD"), then
        each device's step."""
        placed = [*(EndWindow(f"{stage}UNSHARD", problem.device_of(stage), "unshard", *window)
                    for stage, window in enumerate(self.unshard)),
                  *(EndWindow(f"{stage}REDUCE_GRAD", problem.device_of(stage), "reduce", *window)
                    for stage, window in enumerate(self.reduce)),
                  *(EndWindow("optimizer step", device, "step", *window) for device, window in enumerate(self.step))]
        return [window for window in placed if window.end > window.begin]


class EndWindow(NamedTuple):
    """One of the iteration's ends: its name, its device, what it is ("unshard", "reduce" or
    "step": the step runs on compute, the others on the communication stream), when it runs."""

    name: str
    device: int
    what: str
    begin: float
    end: float


def unshards_done(problem: Problem) -> tuple[float, ...]:
    """Per device, when all its unshards have ended (0 without): a plan that times its own ops may
    start a device's compute there and meet every forward's unshard."""
    if problem.iteration_ends is None:
        return (0.0,) * problem.num_devices
    windows = unshard_windows(problem)
    return tuple(max(windows[stage][1] for stage in stages) for stages in problem.stages_of_device)


def gathered_memory(problem: Problem) -> tuple[float, ...]:
    """Per device, its stages' gathered parameters together (0 without FSDP): what a plan built op
    by op counts as held throughout (they are freed only at each stage's last gradient op)."""
    if problem.iteration_ends is None:
        return (0.0,) * problem.num_devices
    held = problem.iteration_ends.unshard_memory
    return tuple(sum(held[stage] for stage in stages) for stages in problem.stages_of_device)


def end_times(problem: Problem, table: OpTable, end: np.ndarray) -> EndTimes:
    """The ends' windows for ops ending at `end` (indexed by `table`'s op numbers)."""
    ends = problem.iteration_ends
    unshard = unshard_windows(problem)
    ready = gradient_ends(problem, table, end)
    device = np.asarray(table.device)
    on_compute = np.asarray(table.lane) == COMPUTE_LANE
    reduce = [(0.0, 0.0)] * problem.num_stages
    step = []
    for d, (stages, free) in enumerate(zip(problem.stages_of_device, unshards_done(problem), strict=True)):
        for stage in sorted(stages, key=lambda s: (ready[s], s)):
            begin = max(free, ready[stage])
            free = begin + ends.reduce_times[stage]
            reduce[stage] = (begin, free)
        begin = max(free, float(end[on_compute & (device == d)].max()))
        step.append((begin, begin + ends.step_times[d]))
    return EndTimes(unshard, tuple(reduce), tuple(step), tuple(ready))


def gradient_ends(problem: Problem, table: OpTable, end: np.ndarray) -> list[float]:
    """Per virtual stage, when its last gradient op (W, or BW) ends, for ops ending at `end`:
    where its reduction and its reshard may start."""
    kind = np.asarray(table.kind)
    stage = np.asarray([op.stage for op in table.ops()])
    gradients = kind == table.gradient_kind
    last = np.full(problem.num_stages, -np.inf)
    np.maximum.at(last, stage[gradients], end[gradients])
    return last.tolist()
