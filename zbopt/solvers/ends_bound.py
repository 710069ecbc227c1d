"""A lower bound on the iteration time where the problem has the iteration's ends
(`Problem.iteration_ends`, timed as in `zbopt.core.simulation.ends`).

Three facts, each holding in every valid schedule:

- the op that ends last is some stage's last gradient op (every forward is followed by its
  backward on the same device), so that stage's reduction and its device's step still follow it:
  the iteration lasts at least a makespan bound + the least reduction + step;
- a device's ops all wait for its first chunk's unshard (each depends on a forward of its own),
  so it ends its compute no sooner than that unshard's end + its work, and its last op is one of
  its stages' last gradient ops, followed by that stage's reduction and the device's step: one
  cycle; a later iteration starts its unshards at the device's step before, so each adds a cycle;
- a stage's reduction starts after its gradient ops could end at the earliest (the op DAG's
  longest paths of the first iteration, devices ignored), on a stream that carries one transfer
  at a time after the device's unshards: taken as they become ready (optimal for one machine
  with release times), then the step; then a cycle per later iteration.

With several iterations, also: every op depends on a forward of the first stage, which waits for
its device's step before (and its unshard), so that device's step ends each iteration at least a
cycle after the one before: its first unshard, its own ops run alone after their heads (device
sequencing with no tails) or its span (the other devices' work between its first and last op), a
reduction, its step; and the last iteration, from there, holds a
whole pipeline (a one-iteration makespan bound) and a reduction and a step after it
(`repeated_bound`).
"""

from __future__ import annotations

import numpy as np

from zbopt.core.dag import device_work, earliest_finish, op_graph
from zbopt.core.ops import op_table
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshard_windows, unshards_done
from zbopt.core.simulation.ends import device_ends, gradient_ends
from zbopt.solvers.implied import heads_and_tails
from zbopt.solvers.sequencing import device_sequencing, jackson_preemptive
from zbopt.solvers.span_bound import device_span

__all__ = ["iteration_ends_bound", "repeated_bound"]


def iteration_ends_bound(problem: Problem, makespan_bound: float, per_device: bool = True) -> tuple[float, int | None]:
    """(the bound, the device it binds on, or None where it is the first fact's) given a lower
    bound on the makespan of `problem`; the first fact alone unless `per_device` (the other two
    walk the op DAG: skipped where the caller's deadline does not allow that)."""
    ends = problem.iteration_ends
    best = makespan_bound + min(ends.reduce_times[stage] + ends.step_times[problem.device_of(stage)]
                                for stage in range(problem.num_stages))
    if not per_device:
        return best, None
    where = None
    first = problem.replace(iterations=1) if problem.iterations > 1 else problem
    unshard, unshards_end = unshard_windows(first), unshards_done(first)
    finish, table = earliest_finish(op_graph(first)), op_table(first)
    ready = gradient_ends(first, table, np.array([finish[op] for op in table.ops()]))
    for device, (stages, work) in enumerate(zip(problem.stages_of_device, device_work(first), strict=True)):
        cycle = unshard[stages[0]][1] + work + min(ends.reduce_times[stage] for stage in stages) \
            + ends.step_times[device]
        stream = device_ends(first, device, unshards_end[device], 0.0, {stage: ready[stage] for stage in stages})
        value = max(cycle, stream.step[1]) + (problem.iterations - 1) * cycle
        if value > best:
            best, where = value, device
    return best, where


def repeated_bound(problem: Problem, bare: Problem, one_pipeline: float, deadline: float) -> float:
    """With several iterations, (iterations - 1) cycles of the first stage's device and then a
    whole pipeline and the least reduction and step. `bare`: one iteration of `problem` without
    its ends, timed from its first forward's release (every op waits for a first-stage forward;
    several iterations have one, both ways refusing them); `one_pipeline`: a lower bound on its
    makespan. The device's ops alone: by device sequencing where every activation is kept (its
    dynamic program assumes so), else by the preemptive one-machine bound."""
    ends, device = problem.iteration_ends, problem.device_of(0)
    heads, _ = heads_and_tails(op_graph(bare))
    mine = {op: head for op, head in heads.items() if bare.device_of(op.stage) == device}
    table = op_table(bare)
    alone = jackson_preemptive([(head, table.duration[table.index(op)], 0.0) for op, head in mine.items()])
    if not bare.mechanisms_matter:
        alone = max(alone, device_sequencing(bare, device, mine, dict.fromkeys(mine, 0.0), 0.0, deadline))
    alone = max(alone, device_span(bare, device))  # the other devices' work between its first and last op
    stages = problem.stages_of_device[device]
    gathered = ends.unshard_times[stages[0]]
    cycle = gathered + alone + min(ends.reduce_times[stage] for stage in stages) + ends.step_times[device]
    last = min(ends.reduce_times[stage] + ends.step_times[problem.device_of(stage)]
               for stage in range(problem.num_stages))
    return (problem.iterations - 1) * cycle + gathered + one_pipeline + last
