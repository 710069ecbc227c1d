"""The exact optimizer as a constraint program (OR-Tools CP-SAT).

The model, built in named steps like OR-Tools' job-shop example:
  1. one fixed-size interval per op, its start bounded by its head and tail;
  2. no overlap on a device;
  3. precedences with latency, and the weight-update barrier between iterations;
  4. memory: per device a cumulative over activation lifetimes (F start -> B end holds M_B - M_W,
     F start -> W end holds M_W; fused: F start -> BW end holds M_B), or a reservoir of the same
     allocations and releases;
  5. symmetry breaking: ops of one kind on one stage run in microbatch order (safe: see below),
     and with it the memory precedences and disjunctions it implies (`bounds.memory_precedences`,
     `bounds.memory_disjunctions`): redundant given the memory constraint, but they let the solver
     prove memory-bound optima;
  6. objective: the makespan (or the longest device span) with the independent lower bound.

Symmetry breaking is safe because microbatches are identical: in any valid schedule, relabel the
ops of each (kind, stage) so that their microbatch numbers follow their start times. Every edge
type links column (kind, stage) to another with one constant delay (duration + latency), and for
any pairing a_j <= b_j the sorted values also satisfy a_(k) <= b_(k); so every dependency still
holds, and memory, which counts started and finished ops per column, is unchanged. Within an
iteration only, when iterations are separated by a flush.
"""

from __future__ import annotations

import sys
import time

from ortools.sat.python import cp_model

from zbopt.ops import Op, op_graph
from zbopt.problem import FORWARD, Problem
from zbopt.simulate import op_table, simulate
from zbopt.solvers.bounds import heads_and_tails, implied_graph, lower_bounds, memory_disjunctions
from zbopt.solvers.result import (
    OBJECTIVES,
    SolveResult,
    TickScale,
    ceil_ticks,
    check_close,
    meets_bound,
    memory_scale,
    objective_bound,
    objective_value,
    schedule_from_starts,
    settle,
    tick_scale,
    warm_start_simulation,
)

MEMORY_MODELS = ("cumulative", "reservoir")
_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
           cp_model.MODEL_INVALID: "unknown", cp_model.UNKNOWN: "unknown"}


def tick_problem(problem: Problem, scale: TickScale) -> Problem:
    """The problem with every cost and the latency in whole ticks (at least one per op)."""

    def ticks(values):
        return None if values is None else [max(1, scale.ticks(v)) for v in values]

    return problem.replace(forward_times=ticks(problem.forward_times), backward_times=ticks(problem.backward_times),
                           weight_times=ticks(problem.weight_times), p2p_time=scale.ticks(problem.p2p_time))


class _Progress(cp_model.CpSolverSolutionCallback):
    """A live line on stderr with incumbent, bound, gap and elapsed time."""

    def __init__(self, scale: TickScale, lower_bound: float):
        super().__init__()
        self.scale, self.lower_bound, self.began = scale, lower_bound, time.perf_counter()

    def on_solution_callback(self) -> None:
        incumbent = self.scale.units(self.ObjectiveValue())
        bound = max(self.lower_bound, self.scale.units(self.BestObjectiveBound()))
        gap = (incumbent - bound) / incumbent if incumbent > 0 else 0.0
        sys.stderr.write(f"\r  incumbent {incumbent:.6g}  bound {bound:.6g}  gap {gap:6.2%}  "
                         f"{time.perf_counter() - self.began:6.1f} s ")
        sys.stderr.flush()


def solve_cpsat(
    problem: Problem,
    *,
    time_limit: float = 60.0,
    warm_start: str | None = None,
    workers: int = 2,
    seed: int = 0,
    objective: str = "makespan",
    memory_model: str = "cumulative",
    symmetry_breaking: bool = True,
    use_warm_start: bool = True,
    progress: bool = False,
) -> SolveResult:
    """Smallest makespan (or longest device span) under the memory limit, with CP-SAT.

    Parameters
    ----------
    time_limit : seconds of search.
    warm_start : a registered heuristic to start from; None: the best valid one.
    workers, seed : CP-SAT's search workers and random seed; one worker and a seed repeat exactly.
    objective : "makespan" or "span" (the Zero Bubble paper's longest per-device span).
    memory_model : "cumulative" or "reservoir".
    symmetry_breaking : order ops of one kind and stage by microbatch, with the memory precedences
        that follow (see the module docstring).
    use_warm_start : hint the model with the warm start and cap the horizon at its makespan.
    progress : print a live line on stderr.

    Returns
    -------
    SolveResult, its schedule re-simulated; never worse than the warm start.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    if memory_model not in MEMORY_MODELS:
        raise ValueError(f"memory_model must be one of {MEMORY_MODELS}")
    began = time.perf_counter()
    scale = tick_scale(problem)
    bounds = lower_bounds(problem)
    independent_bound = objective_bound(problem, bounds, objective)
    warm = warm_start_simulation(problem, warm_start, objective) if use_warm_start else None
    tolerance = 1e-9 * max(1.0, independent_bound)
    if meets_bound(warm, objective, independent_bound, tolerance):  # before any model is built
        status, simulation, value, lower = settle("unknown", None, warm, objective, independent_bound, tolerance, False)
        return SolveResult(status, simulation, value, lower, "cpsat", objective, time.perf_counter() - began,
                           warm[0], scale.resolution, bounds.as_dict())
    integral = tick_problem(problem, scale)
    table = op_table(integral)
    graph = implied_graph(integral) if symmetry_breaking else op_graph(integral)  # 3. and 5. as edges
    heads, tails = heads_and_tails(graph)

    ops = table.ops()
    duration = table.duration
    ops_of_device = [[op for op in ops if op.stage in stages] for stages in problem.stages_of_device]
    horizon = int(sum(duration) + sum(table.latency))  # everything in a row: always feasible
    hint = None
    if warm is not None:
        hinted = simulate(integral, warm[1].schedule.without_times())
        hint = {op: round(hinted.times_of(op)[0]) for op in ops}
        if objective == "makespan":
            horizon = round(hinted.makespan)

    model = cp_model.CpModel()
    # 1. intervals
    start, end, interval = {}, {}, {}
    for index, op in enumerate(ops):
        size = int(duration[index])
        latest = horizon - size - (int(tails[op]) if objective == "makespan" else 0)
        start[op] = model.NewIntVar(int(heads[op]), max(int(heads[op]), latest), f"start_{op}")
        end[op] = start[op] + size
        interval[op] = model.NewFixedSizeIntervalVar(start[op], size, f"op_{op}")
    # 2. no overlap per device
    for mine in ops_of_device:
        model.AddNoOverlap([interval[op] for op in mine])
    # 3. precedences and iteration barriers (and 5., the symmetry-breaking and memory precedences)
    for source, target, data in graph.edges(data=True):
        model.Add(start[target] >= end[source] + int(data["latency"]))
    # 4. memory
    if problem.memory_limit is not None:
        _add_memory(model, problem, ops, start, end, horizon, memory_model)
    # 5. the memory disjunctions (the precedences are edges of the implied graph)
    if symmetry_breaking:
        for backward, weight, forward in memory_disjunctions(problem, ops):
            backward_ended = model.NewBoolVar(f"ended_{backward}_{forward}")
            model.Add(start[forward] >= end[backward]).OnlyEnforceIf(backward_ended)
            model.Add(start[forward] >= end[weight]).OnlyEnforceIf(backward_ended.Not())
    # 6. objective
    if objective == "makespan":
        goal = model.NewIntVar(ceil_ticks(independent_bound, scale), horizon, "makespan")
        for op in ops:
            if tails[op] == 0:
                model.Add(goal >= end[op])
    else:
        goal = model.NewIntVar(ceil_ticks(independent_bound, scale), horizon, "span")
        for device, mine in enumerate(ops_of_device):
            first = model.NewIntVar(0, horizon, f"first_{device}")
            last = model.NewIntVar(0, horizon, f"last_{device}")
            model.AddMinEquality(first, [start[op] for op in mine])
            model.AddMaxEquality(last, [end[op] for op in mine])
            model.Add(goal >= last - first)
    model.Minimize(goal)
    if hint is not None:
        for op, value in hint.items():
            model.AddHint(start[op], value)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit - (time.perf_counter() - began))
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.catch_sigint_signal = True
    callback = _Progress(scale, independent_bound) if progress else None
    code = solver.Solve(model, callback)
    if progress:
        sys.stderr.write("\n")
    status = _STATUS[code]
    solver_bound = scale.units(solver.BestObjectiveBound()) - scale.error_bound if status != "infeasible" else 0.0
    simulation = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts = {op: solver.Value(start[op]) for op in ops}
        simulation = simulate(problem, schedule_from_starts(problem, starts, "cpsat"), strict=True)
        check_close("cp-sat", objective_value(simulation, objective), scale.units(solver.ObjectiveValue()), scale)
    status, simulation, value, lower = settle(status, simulation, warm, objective, max(independent_bound, solver_bound),
                                              tolerance, scale.exact)
    return SolveResult(status, simulation, value, lower, "cpsat",
                       objective, time.perf_counter() - began, None if warm is None else warm[0], scale.resolution,
                       bounds.as_dict())


def _add_memory(model, problem: Problem, ops: list[Op], start, end, horizon: int, memory_model: str) -> None:
    """Per device: activations held from F start to the end of the op that frees them."""
    unit = memory_scale(problem)
    for device, stages in enumerate(problem.stages_of_device):
        capacity = int(problem.memory_limit[device] * unit + 1e-6)
        if capacity >= sum(problem.activation_memory[s] * unit for s in stages) * problem.total_microbatches:
            continue  # the limit can never bind on this device
        held = [(op, kind, amount) for op in ops if op.kind == FORWARD and op.stage in stages
                for kind, amount in _releases(problem, op.stage)]
        if memory_model == "cumulative":
            intervals, demands = [], []
            for forward, kind, amount in held:
                release = Op(kind, forward.stage, forward.microbatch)
                size = model.NewIntVar(0, horizon, f"held_{release}")
                intervals.append(model.NewIntervalVar(start[forward], size, end[release], f"life_{release}"))
                demands.append(round(amount * unit))
            model.AddCumulative(intervals, demands, capacity)
        else:
            times, changes = [], []
            for forward, kind, amount in held:
                release = Op(kind, forward.stage, forward.microbatch)
                delta = round(amount * unit)
                times += [start[forward], end[release]]
                changes += [delta, -delta]
            model.AddReservoirConstraint(times, changes, 0, capacity)


def _releases(problem: Problem, stage: int) -> list[tuple[str, float]]:
    """The ops that free a stage's activation and how much each frees."""
    activation = problem.activation_memory[stage]
    if not problem.split_backward:
        return [("BW", activation)]
    kept = problem.weight_memory[stage]
    return [("B", activation - kept), ("W", kept)]
