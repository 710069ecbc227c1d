"""The plan: the split rules with every schedule, then the joint search over splits, certified.

Each named rule's split is scheduled by every applicable heuristic and by the optimizer (rows of
rule × schedule). The joint search then takes splits in the order of `SplitFamily`'s bound, the
least first, and solves each with zbopt's optimizer; it stops when the least bound of the splits
left reaches the best makespan found (every other split is pruned: none can be shorter) or when
time runs out. The certificate covers every split: the least of the solved splits' own lower
bounds and the bound on the splits left.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from zbopt.errors import ZboptError
from zbopt.model import Device, Model
from zbopt.plan.certify import SplitFamily, split_bound
from zbopt.plan.rules import RULES, split_by_rule
from zbopt.plan.split import Pipeline, Split, split_problem
from zbopt.problem import Problem
from zbopt.schedules import applicable
from zbopt.simulation import Simulation, simulate
from zbopt.solvers import solve
from zbopt.solvers.gap import relative_gap

OPTIMAL = "optimal"  # the optimizer's row, beside the heuristics' names
SOLVE_SHARE = 1 / 12  # of the plan's time limit: one split's solve, at most
FAMILY_S = 5.0  # the most one step of the split family's CP-SAT may take


@dataclass(frozen=True)
class Outcome:
    """One split solved: its best schedule's simulation (None if none fits) and a lower bound on
    every schedule of that split."""

    split: Split
    simulation: Simulation | None
    lower_bound: float
    schedule: str

    @property
    def makespan(self) -> float:
        return math.inf if self.simulation is None else self.simulation.makespan


@dataclass(frozen=True)
class PlanRow:
    """One rule's split under one schedule; `note` says why there is no makespan."""

    rule: str
    schedule: str
    split: Split | None
    simulation: Simulation | None
    note: str | None = None

    @property
    def makespan(self) -> float | None:
        return None if self.simulation is None else self.simulation.makespan


@dataclass(frozen=True)
class Plan:
    """The answer: the rows, the best split and schedule found, and the certificate over every
    split (`lower_bound`; `pruned`: the splits left all bound at least the best; `explored`: how
    many splits were solved)."""

    model: Model
    device: Device
    pipeline: Pipeline
    rows: tuple[PlanRow, ...]
    best: Outcome
    lower_bound: float
    explored: int
    pruned: bool

    @property
    def gap(self) -> float:
        return relative_gap(self.best.makespan, self.lower_bound)


class _Clock:
    def __init__(self, seconds: float):
        self.began, self.deadline, self.seconds = time.perf_counter(), time.perf_counter() + seconds, seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.perf_counter())

    def share(self) -> float:
        return min(self.left(), max(1.0, self.seconds * SOLVE_SHARE))


def plan(model: Model, device: Device, pipeline: Pipeline, *, schedules: tuple[str, ...] | None = None,
         rules: tuple[str, ...] = RULES, time_limit: float = 120.0, workers: int = 2) -> Plan:
    """The best split and schedule of `model` on `pipeline`, with rows for each rule × schedule
    (`schedules`: heuristics' names and OPTIMAL; None: every applicable one and OPTIMAL) and a
    certificate over every split. `time_limit` bounds the whole call."""
    clock = _Clock(time_limit)
    solved: dict[Split, Outcome] = {}
    rows = []
    for rule in rules:
        rows += _rule_rows(rule, model, device, pipeline, schedules, solved, clock, workers)
    family = SplitFamily(model, device, pipeline)
    for split in solved:
        family.exclude(split)
    rest, pruned = _search(model, device, pipeline, family, solved, clock, workers)
    if not solved or all(outcome.simulation is None for outcome in solved.values()):
        raise ZboptError(f"plan: no split of the model runs in {device.memory_gb} GB per device "
                         f"within {time_limit:g} s")
    best = min(solved.values(), key=lambda outcome: outcome.makespan)
    lower = min([rest, *(outcome.lower_bound for outcome in solved.values())])
    return Plan(model, device, pipeline, tuple(rows), best, min(lower, best.makespan), len(solved), pruned)


def _rule_rows(rule: str, model: Model, device: Device, pipeline: Pipeline, schedules, solved: dict,
               clock: _Clock, workers: int) -> list[PlanRow]:
    """The rows of one rule: its split under each schedule (the optimizer's answer also recorded
    in `solved`)."""
    try:
        split = split_by_rule(rule, model, pipeline)
        problem = split_problem(model, device, pipeline, split)
    except ZboptError as error:
        return [PlanRow(rule, "-", None, None, str(error))]
    rows = []
    heuristics = dict(applicable(problem))
    for name in (schedules or (*heuristics, OPTIMAL)):
        if name == OPTIMAL:
            outcome = solved.get(split) or _solved(problem, split, clock, workers)
            solved[split] = outcome
            rows.append(PlanRow(rule, OPTIMAL, split, outcome.simulation,
                                None if outcome.simulation else "no schedule found in time"))
        elif name in heuristics:
            simulation = simulate(problem, heuristics[name])
            rows.append(PlanRow(rule, name, split, simulation if simulation.valid else None,
                                None if simulation.valid else "over the memory limit"))
        else:
            rows.append(PlanRow(rule, name, split, None, "not applicable"))
    return rows


def _solved(problem: Problem, split: Split, clock: _Clock, workers: int) -> Outcome:
    result = solve(problem, time_limit=max(clock.share(), 0.5), workers=workers)
    name = result.simulation.schedule.name if result.simulation is not None else "-"
    return Outcome(split, result.simulation, result.lower_bound, name or result.solver)


def _search(model: Model, device: Device, pipeline: Pipeline, family: SplitFamily, solved: dict, clock: _Clock,
            workers: int) -> tuple[float, bool]:
    """Solve splits in the family's order until the splits left cannot beat the best found or
    time runs out; (a bound on every split not solved, whether they were all pruned)."""
    rest = 0.0
    while clock.left() > 0.5:
        split, rest = family.next_split(min(FAMILY_S, clock.left() / 4))
        best = min((outcome.makespan for outcome in solved.values()), default=math.inf)
        if split is None or rest >= best:
            return rest, split is None and family.exhausted or rest >= best
        family.exclude(split)
        try:
            problem = split_problem(model, device, pipeline, split)
        except ZboptError:  # a stage with no time: outside zbopt's Problem; its closed-form bound stands
            solved[split] = Outcome(split, None, split_bound(model, device, pipeline, split), "-")
            continue
        solved[split] = _solved(problem, split, clock, workers)
    return rest, False
