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

With several iterations the step is each device's flush: its forwards of iteration k + 1 wait for
its step of iteration k (and, with FSDP, for their stage's unshard, gathered again after it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zbopt.core.kinds import FORWARD, REGATHER
from zbopt.core.ops import COMPUTE_LANE, OpTable
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshard_windows, unshards_done

__all__ = ["END_NAMES", "DeviceEnds", "EndTimes", "EndWindow", "device_ends", "end_times", "forwards_done",
           "gathered_memory", "gradient_ends", "gradient_starts", "held_throughout"]


@dataclass(frozen=True)
class EndTimes:
    """When each of the iteration's ends runs, per iteration k, as (start, end) pairs.

    unshard[k], reduce[k] : per virtual stage (a zero-length window where it takes no time); a
        later iteration's unshards start at its device's step before.
    step[k] : per device, its optimizer step.
    gradients_done[k] : per virtual stage, when its last gradient op ends (its reshard).
    """

    unshard: tuple[tuple[tuple[float, float], ...], ...]
    reduce: tuple[tuple[tuple[float, float], ...], ...]
    step: tuple[tuple[tuple[float, float], ...], ...]
    gradients_done: tuple[tuple[float, ...], ...]

    @property
    def finish(self) -> float:
        """When the last device's last step has ended: the iteration's end."""
        return max(end for _, end in self.step[-1])

    def windows(self, problem: Problem) -> list[EndWindow]:
        """Every end that takes time, as the charts, the report and the trace draw it: each
        stage's unshard and reduction named as torch's actions ("0UNSHARD", "0REDUCE_GRAD"), then
        each device's step; iteration by iteration."""
        placed = []
        for unshard, reduce, step in zip(self.unshard, self.reduce, self.step, strict=True):
            placed += [*(EndWindow(f"{stage}UNSHARD", problem.device_of(stage), "unshard", *window)
                         for stage, window in enumerate(unshard)),
                       *(EndWindow(f"{stage}REDUCE_GRAD", problem.device_of(stage), "reduce", *window)
                         for stage, window in enumerate(reduce)),
                       *(EndWindow("optimizer step", device, "step", *window) for device, window in enumerate(step))]
        return [window for window in placed if window.end > window.begin]

    def releases(self, table: OpTable) -> np.ndarray:
        """Per op, the earliest start the ends allow: a forward of iteration k after its stage's
        unshard of iteration k (after its device's step of iteration k - 1), a re-gather (G) after
        its device's unshards; 0 for other ops."""
        problem = table.problem
        stage = np.asarray(table.stage)
        last_stage = np.asarray([problem.stages_of_device[device][-1] for device in range(problem.num_devices)])
        iteration = np.asarray(table.iteration)
        unshard_end = np.asarray([[end for _, end in windows] for windows in self.unshard])
        kind = np.asarray(table.kind)
        released = np.where(kind == FORWARD, unshard_end[iteration, stage], 0.0)
        regather = kind == REGATHER
        return np.where(regather, unshard_end[iteration, last_stage[np.asarray(table.device)]], released)


# what each kind of end is called wherever it is shown (the charts, the report, the trace's categories)
END_NAMES = {"unshard": "unshard (FSDP all-gather)", "reduce": "gradient reduction", "step": "optimizer step"}


class EndWindow(NamedTuple):
    """One of the iteration's ends: its name, its device, what it is ("unshard", "reduce" or
    "step": the step runs on compute, the others on the communication stream), when it runs."""

    name: str
    device: int
    what: str
    begin: float
    end: float


class DeviceEnds(NamedTuple):
    """One device's ends in one iteration: its stages' reductions (stage -> window) and its step."""

    reduce: dict[int, tuple[float, float]]
    step: tuple[float, float]


def device_ends(problem: Problem, device: int, stream_free: float, compute_done: float,
                gradients_done: dict[int, float]) -> DeviceEnds:
    """A device's reductions, one at a time on its stream from `stream_free` (its unshards done),
    each once its stage's last gradient op has ended (`gradients_done`), in the order they become
    ready; then its step, once they and its compute (`compute_done`) have ended."""
    ends = problem.iteration_ends
    reduce = {}
    for stage in sorted(gradients_done, key=lambda s: (gradients_done[s], s)):
        begin = max(stream_free, gradients_done[stage])
        stream_free = begin + ends.reduce_times[stage]
        reduce[stage] = (begin, stream_free)
    begin = max(stream_free, compute_done)
    return DeviceEnds(reduce, (begin, begin + ends.step_times[device]))


def gathered_memory(problem: Problem) -> tuple[float, ...]:
    """Per device, its stages' gathered parameters together (0 without FSDP): what a plan built op
    by op counts as held throughout (they are freed only at each stage's last gradient op)."""
    return _per_device(problem, "unshard_memory")


def held_throughout(problem: Problem) -> tuple[float, ...]:
    """Per device, FSDP's gathered parameters and unsharded gradients of its stages together (0
    without FSDP): what a plan that caps memory as it goes, and neither frees the parameters at
    each stage's last gradient op nor the gradients at its reduction's end, counts as held from
    the start (more than the device ever holds of them: its caps then hold for the simulator's)."""
    return _per_device(problem, "unshard_memory", "gradient_memory")


def _per_device(problem: Problem, *keys: str) -> tuple[float, ...]:
    """Per device, the iteration ends' per-stage `keys` summed over its stages (0 without ends)."""
    ends = problem.iteration_ends
    if ends is None:
        return (0.0,) * problem.num_devices
    return tuple(sum(getattr(ends, key)[stage] for key in keys for stage in stages)
                 for stages in problem.stages_of_device)


def end_times(problem: Problem, table: OpTable, end: np.ndarray) -> EndTimes:
    """The ends' windows for ops ending at `end` (indexed by `table`'s op numbers), iteration by
    iteration: each one's unshards start at its device's step before."""
    device = np.asarray(table.device)
    iteration = np.asarray(table.iteration)
    on_compute = np.asarray(table.lane) == COMPUTE_LANE
    steps_done: tuple[float, ...] | None = None
    unshard, reduce, step, ready = [], [], [], []
    for k in range(problem.iterations):
        unshard.append(unshard_windows(problem, steps_done))
        ready.append(gradient_ends(problem, table, np.where(iteration == k, end, -np.inf)))
        done = [float(end[on_compute & (device == d) & (iteration == k)].max()) for d in range(problem.num_devices)]
        reduce_k = [(0.0, 0.0)] * problem.num_stages
        step_k = []
        for d, (stages, free) in enumerate(zip(problem.stages_of_device, unshards_done(problem, steps_done),
                                               strict=True)):
            placed = device_ends(problem, d, free, done[d], {stage: ready[k][stage] for stage in stages})
            for stage, window in placed.reduce.items():
                reduce_k[stage] = window
            step_k.append(placed.step)
        reduce.append(tuple(reduce_k))
        step.append(tuple(step_k))
        steps_done = tuple(finish for _, finish in step_k)
    return EndTimes(tuple(unshard), tuple(reduce), tuple(step), tuple(tuple(times) for times in ready))


def forwards_done(table: OpTable, end, regather: int) -> float:
    """When the forwards of a re-gather's stage and iteration have all ended, for ops ending at
    `end` (`regather`: the G's op number): where the stage's parameters are freed before it."""
    return max(end[index] for index in table.same_device_inputs[regather])


def gradient_ends(problem: Problem, table: OpTable, end: np.ndarray) -> list[float]:
    """Per virtual stage, when its last gradient op (W, or BW) ends, for ops ending at `end`:
    where its reduction and its reshard may start."""
    return _over_gradient_ops(problem, table, end, np.maximum, -np.inf)


def gradient_starts(problem: Problem, table: OpTable, start: np.ndarray) -> list[float]:
    """Per virtual stage, when its first gradient op (W, or BW) starts, for ops starting at
    `start`: where its unsharded gradients are allocated."""
    return _over_gradient_ops(problem, table, start, np.minimum, np.inf)


def _over_gradient_ops(problem: Problem, table: OpTable, times: np.ndarray, pick: np.ufunc, none: float) -> list[float]:
    """Per virtual stage, `pick` (np.maximum or np.minimum) of its gradient ops' `times`; `none`
    where it has none (or `times` leaves them out)."""
    gradients = np.asarray(table.kind) == problem.gradient_kind
    stage = np.asarray(table.stage)
    picked = np.full(problem.num_stages, none)
    pick.at(picked, stage[gradients], times[gradients])
    return picked.tolist()
