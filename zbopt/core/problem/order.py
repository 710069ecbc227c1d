"""The order microbatches enter the pipeline: `order[k]` is the microbatch that enters k-th.

Where microbatches differ (`Problem.microbatches_equal` false) their order is a decision: a
heuristic that plans with per-stage values treats microbatches alike, so the order is given to it
from outside. Ordering a schedule is two steps, each exact:

- `reordered(problem, order)`: the same problem with microbatch k costing what microbatch order[k]
  costs (tokens or table columns permuted), which the generator plans for;
- `relabelled(schedule, order, m)`: that schedule with microbatch k renamed order[k] (in every
  iteration), a schedule of the original problem with the same times.

The closed rules by name (`ORDER_RULES`) sort by a microbatch's size, its total work over the stages
(`sizes`); the rule that needs a generator and the simulator (`dynapipe`) is in
`zbopt.schedules.ordering`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from zbopt.core.errors import ProblemError
from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.problem.slices import total_tokens
from zbopt.core.schedule import Schedule

__all__ = ["ORDER_KEY", "ORDER_RULES", "SEARCHED_RULES", "SORTED_RULES", "check_order", "entry_order", "relabelled",
           "reordered", "route_groups", "selected", "sizes", "sorted_order"]

SORTED_RULES = ("given", "longest-first", "shortest-first")
SEARCHED_RULES = ("dynapipe",)  # zbopt.schedules.ordering
ORDER_RULES = SORTED_RULES + SEARCHED_RULES
ORDER_KEY = "order"


def sizes(problem: Problem) -> tuple[float, ...]:
    """Per microbatch of one iteration, its total work: the sum over the stages it visits of its
    own cost of every kind the problem's schedules run (F, B, W or F, BW)."""
    m = problem.num_microbatches
    totals = [0.0] * m
    for stages, microbatches in problem.routes:
        for j in range(microbatches.start, min(microbatches.stop, m)):  # one iteration: they repeat
            totals[j] = sum(problem.cost(kind, stage, j) for stage in stages for kind in problem.kinds)
    return tuple(totals)


def route_groups(problem: Problem) -> tuple[range, ...]:
    """The microbatches of one iteration that may trade places: all of them, or with the
    bidirectional placement each route's (a microbatch cannot change its way through the pipeline)."""
    return tuple(range(microbatches.start, microbatches.stop) for _, microbatches in problem.routes) \
        if problem.bidirectional else (range(problem.num_microbatches),)


def sorted_order(problem: Problem, rule: str) -> tuple[int, ...]:
    """The order of a sorting rule: `given` (0..m-1), `longest-first` or `shortest-first` by
    `sizes` (ties keep their given order), within each route group."""
    if rule not in SORTED_RULES:
        raise ProblemError(ORDER_KEY, rule, f"expected one of {', '.join(ORDER_RULES)} or a permutation of "
                                            f"0..{problem.num_microbatches - 1}")
    if rule == "given":
        return tuple(range(problem.num_microbatches))
    size, sign = sizes(problem), -1 if rule == "longest-first" else 1
    return tuple(j for group in route_groups(problem) for j in sorted(group, key=lambda j: (sign * size[j], j)))


def check_order(problem: Problem, order: Sequence[int]) -> tuple[int, ...]:
    """`order` as a tuple, checked: a permutation of 0..m-1 that keeps each microbatch in its route
    group (`route_groups`); else a ProblemError naming `order`."""
    m = problem.num_microbatches
    if isinstance(order, str) or not isinstance(order, Sequence):
        raise ProblemError(ORDER_KEY, order, f"expected a rule ({', '.join(ORDER_RULES)}) or a list of microbatches")
    if any(isinstance(j, bool) or not isinstance(j, int) for j in order) or sorted(order) != list(range(m)):
        raise ProblemError(ORDER_KEY, order, f"expected a permutation of 0..{m - 1}, each microbatch once")
    for group in route_groups(problem):
        if any(order[k] not in group for k in group):
            raise ProblemError(ORDER_KEY, order, f"positions {group.start}..{group.stop - 1} must hold microbatches "
                                                 f"{group.start}..{group.stop - 1}: with the bidirectional placement "
                                                 "each route orders its own")
    return tuple(order)


def reordered(problem: Problem, order: Sequence[int]) -> Problem:
    """`problem` with microbatch k costing what microbatch order[k] costs (its tokens, or its
    column of every table); the problem itself where its microbatches are equal or the order is 0..m-1."""
    if problem.microbatches_equal or tuple(order) == tuple(range(problem.num_microbatches)):
        return problem
    return problem.replace(**_columns(problem, order))


def selected(problem: Problem, microbatches: Sequence[int]) -> Problem:
    """`problem` with only `microbatches` (in this order), each costing what it costs in `problem`
    (its tokens at the problem's reference length, or its column of every table). Every schedule
    of `problem`, its other microbatches' ops left out, is one of this: a relaxation, whose
    optimum bounds the problem's. Microbatches that differ, one iteration."""
    changes = _columns(problem, microbatches)
    if problem.microbatch_tokens is not None:
        tokens = problem.microbatch_tokens
        changes["reference_tokens"] = problem.reference_tokens or sum(map(total_tokens, tokens)) / len(tokens)
    return problem.replace(num_microbatches=len(microbatches), **changes)


def _columns(problem: Problem, microbatches: Sequence[int]) -> dict:
    """The per-microbatch key of `problem` (tokens or tables) with `microbatches`' entries, in order."""
    if problem.microbatch_tokens is not None:
        return {"microbatch_tokens": [problem.microbatch_tokens[j] for j in microbatches]}
    if not problem.microbatch_tables:
        return {}
    return {"microbatch_tables": tuple((key, tuple(tuple(row[j] for j in microbatches) for row in rows))
                                       for key, rows in problem.microbatch_tables)}


def relabelled(schedule: Schedule, order: Sequence[int], microbatches: int) -> Schedule:
    """`schedule` with microbatch k of every iteration renamed order[k] (ops, pairs; times kept)."""
    if tuple(order) == tuple(range(microbatches)):
        return schedule

    def rename(op: Op) -> Op:
        iteration, k = divmod(op.microbatch, microbatches)
        return op._replace(microbatch=iteration * microbatches + order[k])

    return dataclasses.replace(schedule, orders=tuple(tuple(map(rename, ops)) for ops in schedule.orders),
                               pairs=tuple(tuple(map(rename, members)) for members in schedule.pairs))


def entry_order(problem: Problem, schedule: Schedule) -> tuple[int, ...]:
    """The microbatches of one iteration in the order the schedule runs their forward on their
    route's first stage: the order a runtime must feed them in."""
    order = []
    for stages, microbatches in problem.routes:
        ops = schedule.orders[problem.device_of(stages[0])]
        order += [op.microbatch for op in ops if op.kind == FORWARD and op.stage == stages[0]
                  and op.microbatch < problem.num_microbatches and op.microbatch in microbatches]
    return tuple(order)
