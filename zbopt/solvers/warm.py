"""The warm start: the heuristic schedule a solve starts from (and is never worse than)."""

from __future__ import annotations

import math
from functools import cache, partial

from zbopt.core import interrupt
from zbopt.core.errors import NotApplicableError, ProblemError, ZboptError
from zbopt.core.problem import Problem
from zbopt.core.problem.microbatches import EQUAL_MICROBATCHES, every_microbatch_at
from zbopt.core.problem.order import ORDER_RULES, SORTED_RULES, check_order, sorted_order
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import Simulation, simulate
from zbopt.schedules import generate, registered
from zbopt.schedules.ordering import Order
from zbopt.schedules.regathers import PLACES, regathered
from zbopt.solvers.answer import objective_value
from zbopt.solvers.gap import meets

__all__ = ["best_heuristic", "best_of", "planning_problem", "warm_start_simulation"]


def best_heuristic(problem: Problem, kind: str = "makespan", deadline: float = math.inf,
                   cutoff: float = math.inf, order: tuple[str, Order] | None = None,
                   stop: float = math.inf) -> tuple[str, Simulation] | None:
    """The registered heuristic with the best objective among those valid under the memory limit;
    at equal objective, the one with the lower highest peak memory (1f1b before gpipe). Without a
    limit, none that recomputes or offloads: that only adds work or traffic, and lowers a peak the
    model (which then has no such choice) cannot match. Where microbatches differ, each heuristic
    also in every order rule (`ORDER_RULES`: the sorted ones and DynaPipe's searched one), as
    `compare` shows them, so that no row of a table beats the solver's start. They run in
    registry order; past `deadline` (`time.perf_counter()`) none starts once one is valid, and one
    still running then stops (`interrupt.check`: at p = 32, m = 512 some take seconds); while none
    is valid they may run to `cutoff` (after it each stops at once: every generator's `Schedule`
    checks the time device by device, so past the cutoff there is no warm start), none starts
    after `stop` (the caller's whole time limit) and one built is simulated up to it (at m = 10^4
    that takes half a second). After Ctrl-C none runs on, so an interrupt under a limit no
    heuristic fits yet answers at once, with no warm start. `order` (its label, a rule or the
    microbatches in the order they enter): every heuristic in that order only."""
    best: tuple[str, Simulation] | None = None
    orders = [None, *((rule, rule) for rule in ORDER_RULES[1:])] if order is None else [order]
    candidates = _candidates(problem, orders)
    for name, label, build in candidates:
        if interrupt.past(stop) or (best is not None and interrupt.past(deadline)):
            break
        try:
            with interrupt.deadline_scope(cutoff if best is None else deadline):
                schedule = build()
            with interrupt.deadline_scope(stop):  # one built is timed up to the whole limit: it may be the only one
                result = _timed(problem, schedule)
        except (NotApplicableError, interrupt.TimeUp):
            continue
        needless = not problem.mechanisms_matter and (result.table.recomputed or result.table.offloaded)
        if result.valid and not needless and (best is None or _preferred(result, best[1], kind)):
            best = (name if label is None else f"{name} ({label} order)", result)
    return best


def _candidates(problem: Problem, orders: list):
    """(registered name, order label or None, a call building it) in registry order, each
    heuristic in each of `orders` ((label, rule or permutation), or None: as numbered) where
    microbatches differ (and are not a sequence's slices, which enter together), as numbered
    otherwise, each in every build of `_builds`; where re-gathers may pay, each build also
    re-gathered (`schedules.regathers`), as `compare` shows it, so that no row of its table beats
    the solver's start."""
    if problem.microbatches_equal or problem.sequence_slices > 1:
        orders = orders[:1] if orders[0] is None else orders
    planned = planning_problem(problem) if problem.per_microbatch is not None else None
    for order in orders:  # every heuristic in the given order first: a searched order takes longest
        label, rule = (None, None) if order is None else order
        for entry in registered():
            for build in _builds(entry.name, problem, rule, planned):
                build = cache(build)  # built once for its re-gathered variants too
                yield entry.name, label, build
                if problem.reshard_matters:
                    for place in PLACES:
                        yield f"{entry.name} (re-gathered)", label, partial(_regathered, build, problem, place)


def _builds(name: str, problem: Problem, order: Order, planned: Problem | None) -> list:
    """The calls building heuristic `name` in `order`: on the problem itself, as `compare` builds
    its rows, then, where the problem has rows per microbatch (`planned`: its `planning_problem`),
    planned on the stage values, whose plans keep some heuristics within a limit that the rows' own
    costs mislead; there in the sorted orders only (every searched order looks alike)."""
    builds = [partial(_built, name, problem, order)]
    if planned is not None and not (isinstance(order, str) and order not in SORTED_RULES):
        builds.append(partial(_built, name, planned, sorted_order(problem, order) if isinstance(order, str) else order))
    return builds


def _regathered(build, problem: Problem, place: str) -> Schedule:
    """The heuristic `build` makes, re-gathered at `place`; NotApplicableError where that adds no G."""
    variant = regathered(problem, build(), place)
    if variant is None:
        raise NotApplicableError("no stage's order leaves room for a re-gather")
    return variant


def _named(name: str, problem: Problem, order: Order) -> Simulation:
    """The warm start the caller named, simulated: the first of its builds (`_builds`) that
    applies and holds the limit, else the last one built; the last refusal where none applies."""
    planned = planning_problem(problem) if problem.per_microbatch is not None else None
    result, refusal = None, None
    for build in _builds(name, problem, order, planned):
        try:
            result = _timed(problem, build())
        except NotApplicableError as error:
            refusal = error
            continue
        if result.valid:
            break
    if result is None:
        raise refusal
    return result


def _built(name: str, problem: Problem, order: Order) -> Schedule:
    """Heuristic `name` for `problem` in `order`; NotApplicableError where it cannot take the
    problem (a generator that builds a one-microbatch copy, which rows per microbatch do not fit)."""
    try:
        return generate(name, problem, order=order)
    except ProblemError as error:
        raise NotApplicableError(f"{name}: {error}") from None


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


def best_of(simulations, kind: str = "makespan") -> Simulation | None:
    """The best of `simulations` by the one rule a warm start is chosen by (`_preferred`: the
    objective, then the lower highest peak), or None for none: a caller's rows (compare's, a plan
    split's) and the heuristics' are weighed alike."""
    best = None
    for simulation in simulations:
        if best is None or _preferred(simulation, best, kind):
            best = simulation
    return best


def _preferred(simulation: Simulation, other: Simulation, kind: str) -> bool:
    """Whether `simulation` beats `other`: a better objective, or one as good (within the
    optimality tolerance) with a lower highest peak memory."""
    value, other_value = objective_value(simulation, kind), objective_value(other, kind)
    if not meets(other_value, value):
        return True
    return meets(value, other_value) and max(simulation.peak_memory) < max(other.peak_memory)


def warm_start_simulation(problem: Problem, warm_start: str | Schedule | Simulation | list | None, kind: str,
                          deadline: float = math.inf, cutoff: float = math.inf, order: Order = None,
                          stop: float = math.inf) -> tuple[str, Simulation] | None:
    """The warm start given: a registered heuristic's name, or a schedule (or its simulation on
    this problem) the caller already has, say the plan's best row on a split; an error if it
    breaks the memory limit or a heuristic does not finish by `cutoff`. None: the best heuristic
    (see `best_heuristic` for the deadlines); a list of schedules or simulations: the best of them
    and of the heuristics (compare's rows when they are not every heuristic's). `order`: a
    heuristic's microbatches enter in this order (a sorting rule of
    `zbopt.core.problem.order.SORTED_RULES`, or a permutation)."""
    entering = _entering(problem, order)
    if warm_start is None or isinstance(warm_start, list):
        found = [best_heuristic(problem, kind, deadline, cutoff, entering, stop),
                 *(warm_start_simulation(problem, given, kind) for given in warm_start or ())]
        found = [each for each in found if each is not None]
        chosen = best_of([simulation for _, simulation in found], kind)
        return next((each for each in found if each[1] is chosen), None)
    if isinstance(warm_start, (Schedule, Simulation)):
        if order is not None:
            raise ZboptError("order: a warm start given as a schedule runs its own order; give one of the two")
        given = warm_start if isinstance(warm_start, Simulation) and warm_start.problem == problem else \
            _given_schedule(problem, getattr(warm_start, "schedule", warm_start))
        if not given.valid:
            raise ZboptError(f"warm start '{given.schedule.name or 'the schedule given'}' breaks the memory limit: "
                             f"{given.violations[0]}")
        return given.schedule.name or "the schedule given", given
    try:
        with interrupt.deadline_scope(cutoff):
            result = _named(warm_start, problem, None if entering is None else entering[1])
    except interrupt.TimeUp:
        if interrupt.requested.is_set():
            return None
        raise ZboptError(f"warm start '{warm_start}' did not finish within the time limit") from None
    if not result.valid:
        raise ZboptError(f"warm start '{warm_start}' breaks the memory limit: {result.violations[0]}")
    return warm_start if entering is None else f"{warm_start} ({entering[0]} order)", result


def _given_schedule(problem: Problem, schedule: Schedule) -> Simulation:
    """A warm start the caller gave, simulated on the problem: one line naming it where it does
    not fit (another problem's schedule, say)."""
    try:
        return simulate(problem, schedule)
    except ZboptError as error:
        raise ZboptError(f"warm start '{schedule.name or 'the schedule given'}' does not fit this problem: "
                         f"{error}") from None


def _entering(problem: Problem, order: Order) -> tuple[str, Order] | None:
    """(label, order) of `order`: a rule of `ORDER_RULES` by its name, a permutation checked;
    None for the heuristics' own numbering."""
    if order is None:
        return None
    if isinstance(order, str):
        if order not in ORDER_RULES:
            raise ZboptError(f"order '{order}': the warm start takes {', '.join(ORDER_RULES)} or the microbatches "
                             "in the order they enter")
        return order, order
    return "chosen", check_order(problem, order)
