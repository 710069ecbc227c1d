"""The whole pipeline with only its heaviest microbatches: a lower bound where microbatches differ.

Leaving microbatches out is a relaxation (every schedule of the problem, their ops dropped, is a
schedule of the rest, within the same memory limit), so the optimum of any subset bounds the
problem's. Solving the k heaviest by the full CP-SAT model sees what no one- or two-device
relaxation does: large microbatches queueing behind each other on every device.
"""

from __future__ import annotations

import math

from zbopt.core import interrupt
from zbopt.core.dag import critical_path
from zbopt.core.errors import NotApplicableError, ZboptError
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.problem.order import selected
from zbopt.core.simulation import simulate
from zbopt.schedules import generate
from zbopt.solvers import full_model
from zbopt.solvers.task import SearchTask

__all__ = ["HEAVIEST_WORKERS", "heaviest_microbatches_bound", "selectable"]

HEAVIEST_WORKERS = 2


def selectable(problem: Problem) -> bool:
    """Whether a subset of the microbatches is a relaxation `heaviest_microbatches_bound` can take:
    they differ, one iteration, no sequence slices (a slice needs its sequence's), no pairs (one
    member left out would leave the other a pair's time), one route (the both-ways placement
    sends microbatches by their number), no recomputation or offload that memory makes pay (their
    costs per microbatch follow values the subset would derive anew)."""
    return not problem.microbatches_equal and problem.num_microbatches > 2 and problem.iterations == 1 \
        and problem.sequence_slices == 1 and problem.pairs is None and not problem.bidirectional \
        and not problem.mechanisms_matter


def heaviest_microbatches_bound(problem: Problem, deadline: float, floor: float = 0.0) -> float:
    """The least makespan of `problem` with only its k heaviest microbatches (by their work on
    every stage), k = 2, 3, ... below m, each solved by the full CP-SAT model until `deadline`
    (`interrupt.now()`): the largest proved. A schedule of the problem, the others' ops left out,
    is one of each subset (`order.selected`), so each bounds the optimum; it sees what no device
    relaxation does, large microbatches queueing behind each other on every device. A subset
    whose greedy schedule is no longer than `floor` (the best bound so far) cannot raise it and
    is skipped; it stops at the first subset CP-SAT does not prove (its bound still counts): a
    larger one proves less in the time. Measured on microbatches spanning 8x at ZB-H1's peak:
    p = 3, m = 5, the three heaviest proved 21.56 in 0.9 s (the other bounds 18.74, the optimum
    22.53); p = 4, m = 6, three proved 29.04 (27.55 from a 60 s search); p = 4, m = 16, nothing
    above the device load."""
    table = op_table(problem)
    work = [0.0] * problem.num_microbatches
    for index in range(table.size):
        work[table.op(index).microbatch] += table.duration[index]
    heaviest = sorted(range(problem.num_microbatches), key=lambda microbatch: (-work[microbatch], microbatch))
    value = 0.0
    for count in range(2, problem.num_microbatches):
        if interrupt.past(deadline):
            break
        kept = sorted(heaviest[:count])
        subset = _faithful(problem, table, kept)
        if subset is None:
            break
        if _greedy_makespan(subset) <= max(floor, value):
            continue
        found = full_model.search(subset, SearchTask("makespan", None, critical_path(subset), deadline,
                                                     HEAVIEST_WORKERS, 0))
        value = max(value, found.bound)  # less the rounding, proved or not
        if found.status != "optimal":
            break
    return value


def _faithful(problem: Problem, table, kept: list[int]) -> Problem | None:
    """`problem` (`table`: its op table) with only the microbatches `kept` (`order.selected`), or
    None where that problem does not give each op the duration and memory it has in `problem`: values that follow from
    others per microbatch (say, weight memory from the activations' mean) would be derived anew
    from the subset's, and a bound on such a problem is no bound on this one (a review found one
    at 12 where the optimum is 10.5)."""
    try:
        subset = selected(problem, kept)
    except ZboptError:
        return None
    own = op_table(subset)
    for index in range(own.size):
        kind, stage, microbatch = own.op(index)
        original = table.index(Op(kind, stage, kept[microbatch]))
        if not (math.isclose(own.duration[index], table.duration[original], rel_tol=1e-12)
                and math.isclose(subset.memory_delta(kind, stage, microbatch=microbatch),
                                 problem.memory_delta(kind, stage, microbatch=kept[microbatch]), rel_tol=1e-12,
                                 abs_tol=1e-15)):
            return None
    return subset


def _greedy_makespan(problem: Problem) -> float:
    """The greedy schedule's makespan, at least the optimum (infinite where it breaks the limit or
    does not apply)."""
    try:
        simulation = simulate(problem, generate("greedy", problem))
    except NotApplicableError:
        return math.inf
    return simulation.makespan if simulation.valid else math.inf
