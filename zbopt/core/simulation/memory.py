"""Memory over time: each device's step function from the ops' allocations and releases, and the
first moment each device goes over its limit."""

from __future__ import annotations

import numpy as np

from zbopt.core.ops import OpTable
from zbopt.core.problem import Problem
from zbopt.core.simulation.ends import EndTimes
from zbopt.core.simulation.result import MemoryViolation
from zbopt.core.tolerance import RELATIVE_TOLERANCE, memory_ceiling

__all__ = ["memory_steps", "memory_violations"]


def memory_steps(problem: Problem, table: OpTable, start: np.ndarray, end: np.ndarray, ends: EndTimes | None = None):
    """Per device, the memory step function (times, levels) from the alloc/free events (with FSDP,
    each stage's gathered parameters from its unshard's start until its last gradient op ends,
    `ends`, in every iteration); and per op, the level right after its own event (changes at one moment counted in the
    steps' order)."""
    device = np.asarray(table.device)
    delta = np.asarray(table.memory_delta)
    allocates = np.asarray(table.allocates_at_start)
    when = np.where(allocates, start, end)
    if ends is not None and any(problem.iteration_ends.unshard_memory):
        held = problem.iteration_ends.unshard_memory
        gathered = [stage for stage in range(problem.num_stages) if held[stage]] * problem.iterations
        iterations = np.repeat(np.arange(problem.iterations), len(gathered) // problem.iterations)
        device = np.concatenate((device, [problem.device_of(stage) for stage in gathered] * 2))
        delta = np.concatenate((delta, [held[stage] for stage in gathered], [-held[stage] for stage in gathered]))
        allocates = np.concatenate((allocates, [True] * len(gathered), [False] * len(gathered)))
        when = np.concatenate((when, [ends.unshard[k][stage][0] for k, stage in zip(iterations, gathered, strict=True)],
                               [ends.gradients_done[k][stage] for k, stage in zip(iterations, gathered, strict=True)]))
    # a free that ends within the time tolerance after an allocation starts counts as before it:
    # float noise (a period of 25/3 repeated) must not make two activations overlap
    settled = np.where(allocates, when, when - RELATIVE_TOLERANCE * np.maximum(1.0, np.abs(when)))
    order = np.lexsort((allocates, settled, device))
    levels = np.cumsum(delta[order])
    times = when[order]
    counts = np.bincount(device, minlength=problem.num_devices)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    steps = []
    after = np.empty(len(when))  # the parameters' events after the ops'
    for d in range(problem.num_devices):
        lo, hi = bounds[d], bounds[d + 1]
        device_levels = levels[lo:hi] - (levels[lo - 1] if lo else 0.0)
        after[order[lo:hi]] = device_levels
        device_times = times[lo:hi]
        last_at_time = np.append(device_times[1:] != device_times[:-1], True)
        steps.append((device_times[last_at_time], device_levels[last_at_time]))
    return tuple(steps), after[:table.size]


def memory_violations(problem: Problem, memory_steps) -> tuple[MemoryViolation, ...]:
    """Per device over its limit (beyond the tolerance), the first moment it is."""
    if problem.memory_limit is None:
        return ()
    violations = []
    for device, ((times, levels), limit) in enumerate(zip(memory_steps, problem.memory_limit, strict=True)):
        over = np.flatnonzero(levels > memory_ceiling(limit))
        if over.size:
            i = over[0]
            violations.append(MemoryViolation(device, float(times[i]), float(levels[i]), limit))
    return tuple(violations)
