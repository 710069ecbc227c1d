"""The split and the schedule in one CP-SAT model: stage durations are variables of the split.

Issue 31 asked to measure this against the plan's search (solve the promising splits one by one,
certify over all with `SplitFamily`). Here every op of every microbatch is an interval whose size
is its stage's duration, read off the split's boundaries (`split_model.BoundaryModel`); a device's
ops do not overlap; the dependencies carry the latency between devices; each device's memory is a
cumulative of its parameters (held all step) and its activations (M_B - M_W from F's start to B's
end, M_W to W's end). Microbatches are identical, so each column's ops run in microbatch order
(the CP-SAT model's symmetry breaking, see `zbopt.solvers.full_model`). Times and memory are in
SCALE ticks rounded down and the device memory rounded up, so CP-SAT's proven bound is a bound on
every split's makespan; its answer is re-simulated on the split's exact Problem.
`benchmarks/bench_plan.py --joint` measures it beside `plan`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from zbopt.core.ops import Op
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import Simulation, simulate
from zbopt.planning.model import Device, Model
from zbopt.planning.planner.split import Pipeline, Split, split_problem
from zbopt.planning.planner.split_model import SCALE, BoundaryModel

__all__ = ["JointAnswer", "joint_search"]

_QUANTITY = {"F": "forward", "B": "backward", "W": "weight", "BW": "gradient"}


@dataclass(frozen=True)
class JointAnswer:
    """The joint model's best split and its schedule re-simulated (None when none was found), and
    the bound in ms CP-SAT proved on every split's makespan."""

    split: Split | None
    simulation: Simulation | None
    lower_bound_ms: float
    proven: bool


def joint_search(model: Model, device: Device, pipeline: Pipeline, seconds: float,
                 hint: tuple[Split, Simulation] | None = None, workers: int = 2) -> JointAnswer:
    """The least makespan over every split and schedule, as CP-SAT finds it in `seconds`
    (optionally from a `hint`: a split and its simulated schedule)."""
    from ortools.sat.python import cp_model

    from zbopt.solvers.cp_parts import limit, solve_stoppable

    boundaries = BoundaryModel(model, pipeline)
    cp, m, stages = boundaries.model, pipeline.num_microbatches, pipeline.num_stages
    kinds = ("F", "B", "W") if all(layer.weight_ms is not None for layer in model.layers) else ("F", "BW")
    horizon = boundaries.horizon * 2 + math.floor(device.p2p_ms * SCALE) * 2 * stages * m
    duration = {(kind, s): _variable(cp, boundaries.stage_sum(_QUANTITY[kind], s), horizon, f"d{kind}{s}")
                for kind in kinds for s in range(stages)}
    start, end, intervals = {}, {}, {}
    for kind, s, j in itertools.product(kinds, range(stages), range(m)):
        op = (kind, s, j)
        start[op], end[op] = cp.NewIntVar(0, horizon, f"s{op}"), cp.NewIntVar(0, horizon, f"e{op}")
        intervals[op] = cp.NewIntervalVar(start[op], duration[kind, s], end[op], f"i{op}")
    for index in range(pipeline.num_devices):
        cp.AddNoOverlap([intervals[op] for op in intervals if pipeline.device_of(op[1]) == index])
    _dependencies(cp, pipeline, device, kinds, start, end)
    for kind, s, j in itertools.product(kinds, range(stages), range(m - 1)):
        cp.Add(start[kind, s, j] <= start[kind, s, j + 1])  # identical microbatches: column order
    if device.usable_gb is not None:
        _memory(cp, boundaries, pipeline, device, kinds, start, end, horizon)
    makespan = cp.NewIntVar(0, horizon, "makespan")
    cp.AddMaxEquality(makespan, list(end.values()))
    cp.Minimize(makespan)
    if hint is not None:
        _hint(cp, boundaries, hint, start)
    solver = cp_model.CpSolver()
    limit(solver, seconds, workers)
    status = solve_stoppable(solver, cp)
    bound = 0.0 if status == cp_model.INFEASIBLE else solver.BestObjectiveBound() / SCALE
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return JointAnswer(None, None, bound, status == cp_model.INFEASIBLE)
    cuts = [solver.Value(boundary) for boundary in boundaries.boundaries]
    split = tuple(after - before for before, after in itertools.pairwise(cuts))
    problem = split_problem(model, device, pipeline, split)
    orders = [sorted((op for op in start if pipeline.device_of(op[1]) == index), key=lambda op: solver.Value(start[op]))
              for index in range(pipeline.num_devices)]
    schedule = Schedule([[f"{s}{kind}{j}" for kind, s, j in order] for order in orders])
    return JointAnswer(split, simulate(problem, schedule), bound, status == cp_model.OPTIMAL)


def _variable(cp, expression, upper: int, name: str):
    """An integer variable equal to `expression` (an interval's size must be one variable)."""
    variable = cp.NewIntVar(0, upper, name)
    cp.Add(variable == expression)
    return variable


def _dependencies(cp, pipeline: Pipeline, device: Device, kinds, start, end) -> None:
    """F(s) -> F(s+1), F(last) -> B(last), B(s+1) -> B(s), B(s) -> W(s), each with the latency
    (rounded down) where the two stages' devices differ."""
    latency = math.floor(device.p2p_ms * SCALE)
    last, backward = pipeline.num_stages - 1, kinds[1]
    for s, j in itertools.product(range(pipeline.num_stages), range(pipeline.num_microbatches)):
        if s < last:
            gap = latency if pipeline.device_of(s) != pipeline.device_of(s + 1) else 0
            cp.Add(start["F", s + 1, j] >= end["F", s, j] + gap)
            cp.Add(start[backward, s, j] >= end[backward, s + 1, j] + gap)
        else:
            cp.Add(start[backward, s, j] >= end["F", s, j])
        if "W" in kinds:
            cp.Add(start["W", s, j] >= end["B", s, j])


def _memory(cp, boundaries: BoundaryModel, pipeline: Pipeline, device: Device, kinds, start, end,
            horizon: int) -> None:
    """Per device a cumulative: its parameters all step, each activation from F's start (M_B -
    M_W to B's end, M_W to W's end; all of M_B to BW's end when fused)."""
    capacity = math.ceil(device.usable_gb * SCALE)
    split = "W" in kinds
    for index in range(pipeline.num_devices):
        own = pipeline.stages_on(index)
        parameters = _variable(cp, sum(boundaries.stage_sum("parameters", s) for s in own), capacity, f"p{index}")
        lifetimes, demands = [cp.NewIntervalVar(0, horizon, horizon, f"params{index}")], [parameters]
        for s in own:
            activation = _variable(cp, boundaries.stage_sum("activation", s), capacity, f"a{s}")
            releases = [(kinds[1], activation)]
            if split:  # B frees M_B - M_W, W the rest
                kept = _variable(cp, boundaries.stage_sum("kept", s), capacity, f"k{s}")
                releases = [("B", _variable(cp, activation - kept, capacity, f"b{s}")), ("W", kept)]
            for j in range(pipeline.num_microbatches):
                for kind, amount in releases:
                    size = cp.NewIntVar(0, horizon, f"l{kind}{s}_{j}")
                    lifetimes.append(cp.NewIntervalVar(start["F", s, j], size, end[kind, s, j], f"L{kind}{s}_{j}"))
                    demands.append(amount)
        cp.AddCumulative(lifetimes, demands, capacity)


def _hint(cp, boundaries: BoundaryModel, hint: tuple[Split, Simulation], start) -> None:
    """The split's boundaries and its schedule's start times (in ticks) as CP-SAT's hint."""
    split, simulation = hint
    for boundary, cut in zip(boundaries.boundaries[1:-1], itertools.accumulate(split[:-1]), strict=True):
        cp.AddHint(boundary, cut)
    for (kind, s, j), variable in start.items():
        cp.AddHint(variable, math.floor(simulation.times_of(Op(kind, s, j))[0] * SCALE))
