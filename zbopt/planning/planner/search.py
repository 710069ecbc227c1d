"""The plan: the split rules with every schedule, then the joint search over splits, certified.

Each named rule's split is scheduled by every applicable heuristic and by the optimizer (rows of
rule × schedule). The joint search then takes splits in the order of `SplitFamily`'s bound, the
least first, and solves each with zbopt's optimizer; it stops when the least bound of the splits
left reaches the best iteration time found (every other split is pruned: none can be shorter) or
when time runs out. The certificate covers every split: the least of the solved splits' own lower
bounds and the bound on the splits left. The objective is the iteration time: the makespan, and
where the device and the training time them the gradient reductions and the optimizer step
(`zbopt.planning.model.collectives`); the splits' makespan bounds hold for it too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from zbopt.core import interrupt
from zbopt.core.errors import ZboptError
from zbopt.core.problem import Problem
from zbopt.core.simulation import Simulation
from zbopt.core.tolerance import MAX_TOTAL
from zbopt.planning.comparison import simulated_in_time
from zbopt.planning.model import Device, Model
from zbopt.planning.model.collectives import ends_times, gathered_gb, least_ends_ms
from zbopt.planning.planner.certify import SplitFamily, least_memory, split_bound
from zbopt.planning.planner.result import OPTIMAL, OVER_THE_LIMIT, Outcome, PipelinePlan, Plan, PlanRow
from zbopt.planning.planner.rules import RULES, split_by_rule
from zbopt.planning.planner.split import Pipeline, Split, check_stages, split_problem, splits_backward
from zbopt.schedules import get, registered
from zbopt.solvers import lower_bounds, solve
from zbopt.solvers.api import HEURISTICS_CUTOFF, HEURISTICS_SHARE
from zbopt.solvers.warm import best_of

__all__ = ["FAMILY_S", "FIRST_BOUND_SHARE", "MAX_PLAN_LAYERS", "MIN_SOLVE_S", "PRECHECK_SHARE", "SOLVE_SHARE", "plan",
           "solved_split"]

SOLVE_SHARE = 1 / 12  # of the plan's time limit: one split's solve, at most
FAMILY_S = 5.0  # the most one step of the split family's CP-SAT may take
MIN_SOLVE_S = 0.5  # no split is solved with less time left than this
PRECHECK_SHARE = 0.1  # of a split's solve: its independent bounds, before any search
FIRST_BOUND_SHARE = 0.1  # of a pipeline's time: the family's first bound, before any split is solved
# measured, a 5 s step of the split family: 0.5 s at 5,000 layers, 2.2 s at 10,000, 6.3 s at 20,000
MAX_PLAN_LAYERS = 10_000


@dataclass
class _Run:
    """What every step of one pipeline's plan shares: the model on its pipeline, its share of the
    plan's clock, and where splits are solved (here, or `parallel` at a time on `executor`)."""

    model: Model
    device: Device
    pipeline: Pipeline
    clock: interrupt.Clock
    workers: int
    executor: Executor | None = None
    parallel: int = 1

    def __post_init__(self) -> None:
        self.solve_seconds = max(interrupt.span(1.0), self.clock.left() * SOLVE_SHARE)  # one split's solve, at most
        self.heuristics_cutoff = self.clock.share("heuristics cutoff", HEURISTICS_CUTOFF).deadline
        # what the iteration's ends add to every split's makespan bound, at least
        self.ends_floor = least_ends_ms(self.device, self.model.training, self.model.layers)

    def problem(self, split: Split) -> Problem:
        return split_problem(self.model, self.device, self.pipeline, split)

    def unsolved(self, split: Split) -> Outcome:
        """A split not searched: no schedule, its closed-form bound (`certify.split_bound`) and the ends'."""
        return Outcome(split, None, split_bound(self.model, self.device, self.pipeline, split) + self.ends_floor, "-")

    def solve_all(self, splits: list[Split], incumbent: float = math.inf,
                  warm: Simulation | None = None) -> dict[Split, Outcome]:
        """Each split solved, at once on the executor when there is one (`solved_split`; one whose
        bounds reach `incumbent` is not searched; `warm`, one split's schedule to start from). A
        split outside zbopt's Problem (a stage with no time) keeps its closed-form bound."""
        seconds, outcomes, problems = min(self.clock.left(), self.solve_seconds), {}, {}
        for split in splits:
            try:
                problems[split] = self.problem(split)
            except ZboptError:
                outcomes[split] = self.unsolved(split)
        if seconds < interrupt.span(MIN_SOLVE_S):  # no time left: each keeps its closed-form bound
            return {**outcomes, **{split: self.unsolved(split) for split in problems}}
        if self.executor is None:
            answers = {split: solved_split(problem, seconds, self.workers, incumbent, warm)
                       for split, problem in problems.items()}
        else:
            # another process: a split counts its work on a meter of its own, added to this one's after
            futures = {split: self.executor.submit(solved_split, problem, seconds, self.workers, incumbent, warm,
                                                   interrupt.deterministic())
                       for split, problem in problems.items()}
            answers = {split: future.result() for split, future in futures.items()}
            for *_, work in answers.values():
                interrupt.spend(work)
        for split, (simulation, lower_bound, name, _) in answers.items():
            outcomes[split] = Outcome(split, simulation, lower_bound, name)
        return outcomes


def solved_split(problem: Problem, seconds: float, workers: int, incumbent: float = math.inf,
                 warm: Simulation | None = None,
                 deterministic: bool = False) -> tuple[Simulation | None, float, str, float]:
    """(the best schedule's simulation, the lower bound, the schedule's name, the work it counted
    on a meter of its own) of one split's Problem: zbopt's optimizer within `seconds` (a
    module-level function, so an executor can run it), from `warm` (the split's best row: the
    answer is never behind it) or else the best heuristic; first its independent lower bounds
    for a tenth of that, and no search when they already reach `incumbent`, the best iteration
    time of another split (with one chunk, the device DP proves most splits worse in milliseconds).
    `deterministic` in another process (which does not see the caller's meter): `seconds` of
    work on a meter of its own, whose count it returns (else 0)."""
    own = interrupt.Clock(seconds, "split", interrupt.Meter()) if deterministic and not interrupt.deterministic() \
        else None
    with interrupt.metered(own):
        return (*_solved_split(problem, seconds, workers, incumbent, warm), 0.0 if own is None else own.meter.spent)


def _solved_split(problem: Problem, seconds: float, workers: int, incumbent: float,
                  warm: Simulation | None) -> tuple[Simulation | None, float, str]:
    """`solved_split` on the clock under way."""
    began = interrupt.now()
    if incumbent < math.inf:
        bound = lower_bounds(problem, began + seconds * PRECHECK_SHARE).best
        if bound >= incumbent:
            return None, bound, "-"
    try:
        left = max(seconds - (interrupt.now() - began), interrupt.span(MIN_SOLVE_S))
        result = solve(problem, time_limit=interrupt.clock_of(left, "split"), workers=workers, warm_start=warm,
                       deterministic=interrupt.deterministic())
    except interrupt.Interrupted as stop:  # Ctrl-C: the solve's best so far, if any; the plan stops after it
        if stop.partial is None:
            return None, 0.0, "-"
        result = stop.partial
    name = result.simulation.schedule.name if result.simulation is not None else "-"
    return result.simulation, result.lower_bound, name or result.solver


def plan(model: Model, device: Device, pipelines: Pipeline | Sequence[Pipeline], *,
         schedules: Sequence[str] | None = None, rules: Sequence[str] = RULES,
         time_limit: float | interrupt.Clock = 120.0, workers: int = 2, executor: Executor | None = None,
         parallel: int = 1, deterministic: bool = False) -> Plan:
    """The best split and schedule of `model` on each of `pipelines`, with rows for each rule ×
    schedule and a certificate over every split.

    Parameters
    ----------
    model : the layers in order (`load_model`, `Model.from_config`, ...).
    device : the device every stage runs on (its memory is the limit).
    pipelines : one or several (devices, chunks, placement, microbatches) to plan for.
    schedules : the rows' schedules: heuristics' names and OPTIMAL; None: every applicable one and
        OPTIMAL.
    rules : the named splits that get rows (`RULES`).
    time_limit : seconds (or a `Clock` the caller counts) for the whole call, shared equally by
        the pipelines.
    workers : the solver's threads.
    executor, parallel : with an `executor` (say, a dask `Client(...).get_executor()`), the search
        solves `parallel` splits at a time there.
    deterministic : two calls give the same plan and certificate (`solve`'s `deterministic`: the
        time limit a budget of work, shared by the same rule; no wall clock decides which splits
        are solved); only the reported times differ.

    Returns
    -------
    Plan : per pipeline its rows, its best split and schedule, and a lower bound on every split
        with every schedule; `best`, `iteration_time` (the makespan without iteration ends),
        `lower_bound` and `gap` over the pipelines.

    Raises
    ------
    ZboptError : in one line, when a pipeline has more stages than the model has layers, or when no
        split of any pipeline runs in the device's memory.

    Examples
    --------
    Eight equal layers (F = B = W = 1 ms) on 4 devices, 8 microbatches: two layers a stage, and no
    schedule beats the bound over every split.

    >>> from zbopt import Device, Layer, Model, Pipeline
    >>> layers = Model.from_repeats([(Layer("decoder", 1.0, 1.0, 1.0, activation_gb=1, parameters_gb=1), 8)])
    >>> answer = plan(layers, Device(memory_gb=20), Pipeline(4, 1, "loop", 8), schedules=["zb-h1"], time_limit=10)
    >>> answer.best.best.split, answer.iteration_time, answer.gap
    ((2, 2, 2, 2), 54.0, 0.0)
    """
    pipelines = (pipelines,) if isinstance(pipelines, Pipeline) else tuple(pipelines)
    _check_plan(model, device, pipelines, schedules, time_limit)
    began, answers, clock = time.perf_counter(), [], interrupt.as_clock(time_limit, "plan", deterministic)
    with interrupt.stoppable(), interrupt.metered(clock):
        for number, pipeline in enumerate(pipelines):
            share = clock.share(f"pipeline {number}", 1 / (len(pipelines) - number))
            run = _Run(model, device, pipeline, share, workers, executor, max(1, parallel))
            answers.append(_plan_one(run, schedules, rules))
            if interrupt.requested.is_set():
                break
        result = Plan(model, device, tuple(answers))
        if interrupt.requested.is_set():  # Ctrl-C: the plan so far, for the caller to show
            raise interrupt.Interrupted(result if result.best.best is not None else None)
    if result.best.best is None:
        raise ZboptError(_nothing_found(model, device, pipelines, time.perf_counter() - began))
    return result


def _check_plan(model: Model, device: Device, pipelines: Sequence[Pipeline], schedules, time_limit: float) -> None:
    """One line for what no search could fix: an unknown or repeated schedule, a time limit that is not a
    positive number, a model mixing fused and split backwards or of more than MAX_PLAN_LAYERS layers,
    a reserve without a memory, more stages than layers, work beyond the range."""
    for number, name in enumerate(schedules or ()):
        if name != OPTIMAL:
            get(name)  # an unknown name: UnknownScheduleError, naming the close ones
        if name in schedules[:number]:
            raise ZboptError(f"plan: schedule '{name}' is asked for twice (each gives a row per split rule)")
    if not isinstance(time_limit, interrupt.Clock) and \
            not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise ZboptError(f"plan: time_limit = {time_limit!r}: expected a number of seconds above 0")
    splits_backward(model)
    if device.memory_gb is None and device.reserve_gb:  # a reserve of 0 keeps nothing: no memory needed
        raise ZboptError(f"plan: a reserve of {device.reserve_gb:g} GB but no device memory to keep it from "
                         "(give the device's memory: --device-memory, or memory in the model file)")
    if len(model.layers) > MAX_PLAN_LAYERS:
        raise ZboptError(f"plan: {len(model.layers):,} layers, more than the {MAX_PLAN_LAYERS:,} its split models "
                         "hold (their element constraints grow as stages x layers, and CP-SAT's presolve does not "
                         "stop for Ctrl-C); write a repeated block of layers as one layer")
    for pipeline in pipelines:
        check_stages(model, pipeline.num_devices, pipeline.chunks_per_device)
        _check_range(model, pipeline)
    ends = sum(sum(values) for key, values in ends_times(device, model.training, [model.layers], [[0]]).items()
               if key.endswith("_times"))
    if ends > MAX_TOTAL:  # the whole model's reduction, gather and step, on one stage
        raise ZboptError(f"plan: the iteration's ends (the whole model's gradient reduction, gathers and optimizer "
                         f"step) take {ends:.3g} ms, beyond zbopt's range ({MAX_TOTAL:g} ms): check the device's "
                         "dp_bandwidth and memory_bandwidth and the layers' gradient")


def _check_range(model: Model, pipeline: Pipeline) -> None:
    """One line, naming the layer adding most, where the model's work over the pipeline's m
    microbatches or what all of them hold (with the parameters) is beyond zbopt's range
    (MAX_TOTAL ms or GB: the split models count in integer microseconds and MB)."""
    m = pipeline.num_microbatches
    for what, unit, size in (("work", "ms", lambda layer: m * (layer.forward_ms + layer.backward_ms
                                                                 + (layer.weight_ms or 0.0))),
                             ("memory", "GB", lambda layer: m * layer.activation_gb + layer.parameters_gb)):
        total = sum(map(size, model.layers))
        if total > MAX_TOTAL:
            heaviest = max(model.layers, key=size)
            raise ZboptError(f"plan: the model's {what} over m = {m} microbatches, {total:.3g} {unit}, is beyond "
                             f"zbopt's range ({MAX_TOTAL:g} {unit}); layer {heaviest.name!r} adds most")


def _nothing_found(model: Model, device: Device, pipelines: Sequence[Pipeline], seconds: float) -> str:
    """Why no plan came: the device's memory (with the least any split needs, where CP-SAT proves
    a positive amount in 2 s), else the time limit."""
    needs = [least_memory(model, pipeline, seconds=2.0) for pipeline in pipelines]
    least = min(needs)
    if device.usable_gb is not None and least > device.usable_gb:
        reserve = f" ({device.memory_gb:g} GB less a reserve of {device.reserve:g} GB)" if device.reserve else ""
        gathered = ", FSDP's gathered weights and " if gathered_gb(model.training, model.layers) else " and "
        return (f"plan: no split of the model runs in {device.usable_gb:g} GB per device{reserve}; every split needs "
                f"at least {least:.4g} GB on its fullest device (parameters{gathered}one microbatch's "
                f"activations)")
    refusals = []
    for pipeline in pipelines:  # splits refused for what they are, not for time: say why
        try:
            split_problem(model, device, pipeline, split_by_rule("even", model, pipeline))
        except ZboptError as error:
            refusals.append(error)
    if len(refusals) == len(pipelines):  # where one pipeline's even split is a problem, time is the reason
        return f"plan: no split could be solved; the even one is refused: {refusals[0]}"
    return f"plan: no schedule found for any split in {seconds:.3g} s; give more time (--time-limit)"


def _plan_one(run: _Run, schedules, rules) -> PipelinePlan:
    """One pipeline: the family's first bound (a bound on every split, before any is solved), the
    rules' rows, then the search; the best of every schedule found, the optimizer's and the rows'."""
    family = SplitFamily(run.model, run.device, run.pipeline)
    family.next_split(min(interrupt.span(FAMILY_S), FIRST_BOUND_SHARE * run.clock.left()))
    solved: dict[Split, Outcome] = {}
    simulated: dict[Split, tuple[dict[str, Simulation], list[str]]] = {}  # built, and not tried in time
    rows = []
    for number, rule in enumerate(rules):  # each rule's heuristics: its part of the share, of what is left then
        rows += _rule_rows(rule, run, schedules, solved, simulated,
                           run.clock.share(f"{rule} heuristics", HEURISTICS_SHARE / (len(rules) - number)))
    for split in solved:
        family.exclude(split)
    pruned = _search(run, family, solved)
    found = [outcome for outcome in solved.values() if outcome.simulation is not None]
    found += [Outcome(row.split, row.simulation, 0.0, row.schedule) for row in rows if row.simulation is not None]
    best = min(found, key=lambda outcome: outcome.iteration_time) if found else None
    lower = min([family.floor + run.ends_floor, *(outcome.lower_bound for outcome in solved.values())])
    return PipelinePlan(run.pipeline, tuple(rows), best, lower, len(solved), pruned)


def _rule_rows(rule: str, run: _Run, schedules, solved: dict, simulated: dict,
               heuristics: interrupt.Clock) -> list[PlanRow]:
    """The rows of one rule: its split under each schedule (the optimizer's answer recorded in
    `solved`, the heuristics', built within `heuristics`, in `simulated`, both by split)."""
    try:
        with interrupt.deadline_scope(heuristics.deadline):  # the rules are quadratic in the layers
            split = split_by_rule(rule, run.model, run.pipeline,
                                  seconds=min(interrupt.span(10.0), run.clock.left() / 4))
        problem = run.problem(split)
    except ZboptError as error:
        return [PlanRow(rule, "-", None, None, str(error))]
    except interrupt.TimeUp:
        return [PlanRow(rule, "-", None, None, "its split was not found in the rule's share of the time limit, "
                                               "or Ctrl-C")]
    rows = []
    if split not in simulated:  # several rules often give one split: its heuristics once
        names = [entry.name for entry in registered()] if schedules is None else \
            [name for name in schedules if name != OPTIMAL]
        late: list[str] = []
        simulated[split] = simulated_in_time(problem, names, deadline=heuristics.deadline,
                                             cutoff=run.heuristics_cutoff, reasons={}, late=late), late
    heuristics, late = simulated[split]
    for name in (schedules or (*heuristics, OPTIMAL)):
        if name == OPTIMAL and split not in solved and (run.clock.left() < interrupt.span(MIN_SOLVE_S)
                                                        or interrupt.requested.is_set()):
            rows.append(PlanRow(rule, OPTIMAL, split, None, "the time limit was reached, or Ctrl-C"))
        elif name == OPTIMAL:
            if split not in solved:
                warm = best_of(simulation for simulation in heuristics.values() if simulation.valid)
                solved.update(run.solve_all([split], warm=warm))
            simulation = solved[split].simulation
            rows.append(PlanRow(rule, OPTIMAL, split, simulation, None if simulation else "no schedule found in time"))
        elif name in heuristics:
            simulation = heuristics[name]
            rows.append(PlanRow(rule, name, split, simulation if simulation.valid else None,
                                None if simulation.valid else OVER_THE_LIMIT))
        else:
            rows.append(PlanRow(rule, name, split, None, "not applicable, or not built in the time limit"))
    if late and schedules is None:  # the ones asked for by name have their rows above
        rows.append(PlanRow(rule, "-", split, None,
                            f"not tried in the heuristics' share of the time: {', '.join(late)}"))
    return rows


def _search(run: _Run, family: SplitFamily, solved: dict) -> bool:
    """Solve splits in the family's order, `run.parallel` at a time, until the splits left cannot
    beat the best found or time runs out (`family.floor` then bounds every split not solved);
    whether the splits left were all pruned."""
    while run.clock.left() > interrupt.span(MIN_SOLVE_S) and not interrupt.requested.is_set():
        best = min((outcome.iteration_time for outcome in solved.values()), default=math.inf)
        batch: list[Split] = []
        while len(batch) < run.parallel:
            split, rest = family.next_split(min(interrupt.span(FAMILY_S), run.clock.left() / 4))
            if split is None or rest + run.ends_floor >= best:
                break
            family.exclude(split)
            batch.append(split)
        if not batch:
            return family.exhausted or family.floor + run.ends_floor >= best
        solved.update(run.solve_all(batch, best))
    return False
