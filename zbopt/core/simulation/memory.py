"""Memory over time: each device's step function from the ops' allocations and releases, and the
first moment each device goes over its limit."""

from __future__ import annotations

import numpy as np

from zbopt.core.kinds import REGATHER
from zbopt.core.ops import Op, OpTable
from zbopt.core.problem import Problem
from zbopt.core.simulation.ends import EndTimes, forwards_done, gradient_starts
from zbopt.core.simulation.result import MemoryViolation
from zbopt.core.tolerance import RELATIVE_TOLERANCE, memory_ceiling

__all__ = ["memory_steps", "memory_violations"]


def memory_steps(problem: Problem, table: OpTable, start: np.ndarray, end: np.ndarray, ends: EndTimes | None = None):
    """Per device, the memory step function (times, levels) from the alloc/free events (with FSDP,
    each stage's gathered parameters and unsharded gradients, `_fsdp_events`); and per op, the
    level right after its own event (changes at one moment counted in the steps' order)."""
    device = np.asarray(table.device)
    delta = np.asarray(table.memory_delta)
    allocates = np.asarray(table.allocates_at_start)
    when = np.where(allocates, start, end)
    fsdp = problem.iteration_ends
    if ends is not None and (any(fsdp.unshard_memory) or any(fsdp.gradient_memory)):
        events = np.asarray(_fsdp_events(problem, table, start, end, ends), dtype=float).reshape(-1, 4)
        device = np.concatenate((device, events[:, 0].astype(np.int64)))
        delta = np.concatenate((delta, events[:, 1]))
        allocates = np.concatenate((allocates, events[:, 2].astype(bool)))
        when = np.concatenate((when, events[:, 3]))
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


def _fsdp_events(problem: Problem, table: OpTable, start: np.ndarray, end: np.ndarray,
                 ends: EndTimes) -> list[tuple[int, float, bool, float]]:
    """FSDP's memory as (device, change, allocates, when) events, in every iteration: each stage's
    gathered parameters from its unshard's start until its last gradient op ends (where the
    schedule gathers them again, its G of that stage and iteration, freed when the stage's last
    forward ends and held again from the G's start); its unsharded gradients from its first
    gradient op's start until its reduction ends."""
    held, gradients, m = problem.iteration_ends.unshard_memory, problem.iteration_ends.gradient_memory, \
        problem.num_microbatches
    regathered = set(table.regathered)
    iteration = np.asarray(table.iteration)
    events = []
    for k in range(problem.iterations):
        first = gradient_starts(problem, table, np.where(iteration == k, start, np.inf))
        for stage in range(problem.num_stages):
            device, amount = problem.device_of(stage), held[stage]
            if gradients[stage]:
                events += [(device, gradients[stage], True, first[stage]),
                           (device, -gradients[stage], False, ends.reduce[k][stage][1])]
            if not amount:
                continue
            events.append((device, amount, True, ends.unshard[k][stage][0]))
            if (stage, k * m) in regathered:
                regather = table.index(Op(REGATHER, stage, k * m))
                events += [(device, -amount, False, forwards_done(table, end, regather)),
                           (device, amount, True, start[regather])]
            events.append((device, -amount, False, ends.gradients_done[k][stage]))
    return events


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
