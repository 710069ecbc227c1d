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
from collections.abc import Sequence

from zbopt.errors import ZboptError
from zbopt.model import Device, Model
from zbopt.planner.certify import SplitFamily, least_memory, split_bound
from zbopt.planner.result import OPTIMAL, Outcome, PipelinePlan, Plan, PlanRow
from zbopt.planner.rules import RULES, split_by_rule
from zbopt.planner.split import Pipeline, Split, split_problem
from zbopt.problem import Problem
from zbopt.schedules import applicable
from zbopt.simulation import simulate
from zbopt.solvers import solve

SOLVE_SHARE = 1 / 12  # of the plan's time limit: one split's solve, at most
FAMILY_S = 5.0  # the most one step of the split family's CP-SAT may take


class _Clock:
    def __init__(self, seconds: float):
        self.deadline, self.seconds = time.perf_counter() + seconds, seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.perf_counter())

    def share(self) -> float:
        return min(self.left(), max(1.0, self.seconds * SOLVE_SHARE))


def plan(model: Model, device: Device, pipelines: Pipeline | Sequence[Pipeline], *,
         schedules: Sequence[str] | None = None, rules: Sequence[str] = RULES, time_limit: float = 120.0,
         workers: int = 2) -> Plan:
    """The best split and schedule of `model` on each of `pipelines`, with rows for each rule ×
    schedule (`schedules`: heuristics' names and OPTIMAL; None: every applicable one and OPTIMAL)
    and a certificate over every split. `time_limit` bounds the whole call, shared equally by the
    pipelines. A ZboptError in one line when no split of any pipeline runs in the device's memory."""
    pipelines = (pipelines,) if isinstance(pipelines, Pipeline) else tuple(pipelines)
    began, answers = time.perf_counter(), []
    for number, pipeline in enumerate(pipelines):
        left = time_limit - (time.perf_counter() - began)
        answers.append(_plan_one(model, device, pipeline, schedules, rules, _Clock(left / (len(pipelines) - number)),
                                 workers))
    result = Plan(model, device, tuple(answers))
    if result.best.best is None:
        least = min(least_memory(model, pipeline) for pipeline in pipelines)
        raise ZboptError(f"plan: no split of the model runs in {device.memory_gb:g} GB per device (found in "
                         f"{time_limit:g} s); every split needs at least {least:.4g} GB on its fullest device "
                         "(parameters and one microbatch's activations)")
    return result


def _plan_one(model: Model, device: Device, pipeline: Pipeline, schedules, rules, clock: _Clock,
              workers: int) -> PipelinePlan:
    solved: dict[Split, Outcome] = {}
    rows = []
    for rule in rules:
        rows += _rule_rows(rule, model, device, pipeline, schedules, solved, clock, workers)
    family = SplitFamily(model, device, pipeline)
    for split in solved:
        family.exclude(split)
    rest, pruned = _search(model, device, pipeline, family, solved, clock, workers)
    found = [outcome for outcome in solved.values() if outcome.simulation is not None]
    best = min(found, key=lambda outcome: outcome.makespan) if found else None
    lower = min([rest, *(outcome.lower_bound for outcome in solved.values())])
    return PipelinePlan(pipeline, tuple(rows), best, lower, len(solved), pruned)


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
            return rest, family.exhausted or rest >= best
        family.exclude(split)
        try:
            problem = split_problem(model, device, pipeline, split)
        except ZboptError:  # a stage with no time: outside zbopt's Problem; its closed-form bound stands
            solved[split] = Outcome(split, None, split_bound(model, device, pipeline, split), "-")
            continue
        solved[split] = _solved(problem, split, clock, workers)
    return rest, False
