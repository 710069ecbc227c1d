"""The warm start: the heuristic schedule a solve starts from (and is never worse than)."""

from __future__ import annotations

import math

from zbopt import interrupt
from zbopt.errors import NotApplicableError, ProblemError, ZboptError
from zbopt.microbatch_order import sorted_order
from zbopt.problem import Problem
from zbopt.problem.microbatches import EQUAL_MICROBATCHES, every_microbatch_at
from zbopt.schedules import generate, registered
from zbopt.simulation import Simulation, simulate
from zbopt.solvers.answer import objective_value
from zbopt.solvers.gap import meets


def best_heuristic(problem: Problem, kind: str = "makespan", deadline: float = math.inf,
                   cutoff: float = math.inf) -> tuple[str, Simulation] | None:
    """The registered heuristic with the best objective among those valid under the memory limit;
    at equal objective, the one with the lower highest peak memory (1f1b before gpipe). Without a
    limit, none that recomputes or offloads: that only adds work or traffic, and lowers a peak the
    model (which then has no such choice) cannot match. They run in registry order; past `deadline`
    (`time.perf_counter()`) none starts once one is valid, and one still running then stops
    (`interrupt.check`: at p = 32, m = 512 some take seconds); while none is valid they may run to
    `cutoff`. After Ctrl-C none runs on, so an interrupt under a limit no heuristic fits yet answers
    at once, with no warm start."""
    best: tuple[str, Simulation] | None = None
    planned = planning_problem(problem)
    for name, order in _candidates(problem):
        if interrupt.requested.is_set() or (best is not None and interrupt.past(deadline)):
            break
        try:
            with interrupt.deadline_scope(cutoff if best is None else deadline):
                schedule = generate(name, planned, order=None if order is None else order[1])
        except (NotApplicableError, interrupt.TimeUp):
            continue
        result = _timed(problem, schedule)
        needless = not problem.mechanisms_matter and (result.table.recomputed or result.table.offloaded)
        if result.valid and not needless and (best is None or _preferred(result, best[1], kind)):
            best = (name if order is None else f"{name} ({order[0]} order)", result)
    return best


def _candidates(problem: Problem):
    """(registered name, None or (rule, order)) in registry order: each heuristic as numbered and,
    where microbatches differ, in the sorting rules' orders too (computed on the problem itself:
    the heuristics plan with stage values, where every order looks alike)."""
    rules = []
    if not problem.microbatches_equal and problem.sequence_slices == 1:
        given = tuple(range(problem.num_microbatches))
        for rule in ("longest-first", "shortest-first"):
            order = sorted_order(problem, rule)
            if order != given and order not in [chosen for _, chosen in rules]:
                rules.append((rule, order))
    for entry in registered():
        yield entry.name, None
        for rule in rules:
            yield entry.name, rule


def planning_problem(problem: Problem) -> Problem:
    """What a heuristic plans with: the problem, or where it has costs per microbatch its per-stage values
    (every microbatch costing its stage's value: some generators build a one-microbatch copy of
    the problem, which rows per microbatch do not fit); its schedule is then simulated with each
    microbatch's own costs (its orders: the times it planned are the stage values'), and kept
    only where it stays within the memory limit. Where the stage values need more memory than the
    limit gives (every microbatch smaller than `reference_tokens`), every microbatch at its stage's
    largest, whose floor is the problem's own. Sequence slices stay (a schedule of the unsliced
    problem is no schedule of the sliced one)."""
    if problem.per_microbatch is None:
        return problem
    try:
        return problem.replace(**EQUAL_MICROBATCHES)
    except ProblemError:
        return every_microbatch_at(problem, max)


def _timed(problem: Problem, schedule) -> Simulation:
    """`schedule` (planned on `planning_problem`) simulated on the problem: where microbatches
    differ, its orders with each microbatch's own costs, not the times it planned."""
    return simulate(problem, schedule if problem.microbatches_equal else schedule.without_times())


def _preferred(simulation: Simulation, other: Simulation, kind: str) -> bool:
    """Whether `simulation` beats `other`: a better objective, or one as good (within the
    optimality tolerance) with a lower highest peak memory."""
    value, other_value = objective_value(simulation, kind), objective_value(other, kind)
    if not meets(other_value, value):
        return True
    return meets(value, other_value) and max(simulation.peak_memory) < max(other.peak_memory)


def warm_start_simulation(problem: Problem, warm_start: str | None, kind: str, deadline: float = math.inf,
                          cutoff: float = math.inf) -> tuple[str, Simulation] | None:
    """The named heuristic's simulation (an error if it breaks the memory limit or does not finish
    by `cutoff`), or the best one (see `best_heuristic` for the deadlines)."""
    if warm_start is None:
        return best_heuristic(problem, kind, deadline, cutoff)
    try:
        with interrupt.deadline_scope(cutoff):
            schedule = generate(warm_start, planning_problem(problem))
    except interrupt.TimeUp:
        if interrupt.requested.is_set():
            return None
        raise ZboptError(f"warm start '{warm_start}' did not finish within the time limit") from None
    result = _timed(problem, schedule)
    if not result.valid:
        raise ZboptError(f"warm start '{warm_start}' breaks the memory limit: {result.violations[0]}")
    return warm_start, result
