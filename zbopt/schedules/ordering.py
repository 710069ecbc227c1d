"""A generated schedule in a chosen microbatch order: one place for every generator (the registry's
`generate` and torch's built-ins call `in_order`).

The generator plans the problem with its microbatches permuted (`reordered`: microbatch k costs what
order[k] does) and its schedule is relabelled back (`relabelled`), so a generator that plans with
per-stage values gives its own schedule with the microbatches renamed, and one that times its
candidates with the simulator (ZB's, V's greedy, the block builders) chooses among them for the
order it is given.

The searched rule `dynapipe` is DynaPipe's micro-batch ordering (Jiang et al., "DynaPipe: Optimizing
Multi-task Training through Dynamic Pipelines", EuroSys 2024; `optimize_schedule` in
dynapipe/schedule_opt/execution_planner.py of awslabs/optimizing-multitask-training-through-
dynamic-pipelines): cluster the microbatches by cost into 4 groups (3 above 20 microbatches), simulate
the schedule for every order of the groups and for the given order, keep the shortest (ties: the
first). Two changes make it deterministic: the clusters are cut at the largest gaps between sizes
(`sizes`; one-dimensional single linkage, where DynaPipe runs k-means on F and B of the first and
last stage), and a group's microbatches keep their given order (DynaPipe shuffles them).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from zbopt.core.errors import ProblemError
from zbopt.core.problem import Problem
from zbopt.core.problem.order import (
    SEARCHED_RULES,
    check_order,
    relabelled,
    reordered,
    route_groups,
    sizes,
    sorted_order,
)
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import simulate

__all__ = ["Build", "Order", "clusters", "dynapipe_candidates", "in_order"]

Build = Callable[[Problem], Schedule]
Order = Sequence[int] | str | None


def in_order(build: Build, problem: Problem, order: Order) -> Schedule:
    """`build(problem)` with the microbatches entering in `order`: None (as `build` numbers them),
    a rule name (`ORDER_RULES`) or a permutation (`order[k]` enters k-th, in every iteration)."""
    if order is None or order == "given" or (isinstance(order, Sequence) and not isinstance(order, str)
                                             and list(order) == list(range(problem.num_microbatches))):
        return build(problem)  # the identity
    if problem.sequence_slices > 1:
        raise ProblemError("order", order, "not with sequence_slices (a sequence's slices enter together, in "
                                           "their order)")
    if isinstance(order, str) and order in SEARCHED_RULES:
        return _searched(build, problem)
    chosen = sorted_order(problem, order) if isinstance(order, str) else check_order(problem, order)
    return _built(build, problem, chosen)


def _built(build: Build, problem: Problem, order: tuple[int, ...]) -> Schedule:
    return relabelled(build(reordered(problem, order)), order, problem.num_microbatches)


def _searched(build: Build, problem: Problem) -> Schedule:
    """DynaPipe's rule (module docstring): the schedule of least simulated makespan among the
    given order and every order of the clusters, preferring schedules within the memory limit."""
    best = None
    for order in dynapipe_candidates(problem):
        schedule = _built(build, problem, order)
        result = simulate(problem, schedule)
        key = (not result.valid, result.makespan)
        if best is None or key < best[0]:
            best = (key, schedule)
    return best[1]


def dynapipe_candidates(problem: Problem) -> list[tuple[int, ...]]:
    """The given order, then one order per ordering of the size clusters (each route group keeps
    its microbatches, arranged by their cluster's place, ties in their given order)."""
    cluster = clusters(sizes(problem), 4 if problem.num_microbatches <= 20 else 3)
    candidates = [tuple(range(problem.num_microbatches))]
    for ranking in itertools.permutations(range(max(cluster) + 1)):
        order = tuple(j for group in route_groups(problem) for j in sorted(group, key=lambda j: ranking[cluster[j]]))
        if order not in candidates:
            candidates.append(order)
    return candidates


def clusters(values: Sequence[float], count: int) -> tuple[int, ...]:
    """Per value, its cluster (0 = the smallest values): the sorted distinct values cut at their
    `count - 1` largest gaps (fewer clusters where fewer distinct values)."""
    distinct = sorted(set(values))
    gaps = sorted(range(1, len(distinct)), key=lambda i: (distinct[i - 1] - distinct[i], i))[:count - 1]
    starts = sorted(distinct[i] for i in gaps)
    return tuple(sum(value >= start for start in starts) for value in values)
