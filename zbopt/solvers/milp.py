"""The exact optimizer as a mixed-integer program through PuLP (CBC or HiGHS).

The disjunctive big-M model of the Zero Bubble paper's Appendix G, built from the same op DAG as
the CP-SAT model:
  - start time S_i >= head_i per op, makespan C >= S_i + d_i (or per-device spans);
  - precedences S_j >= S_i + d_i + latency;
  - one binary x_ik per pair of ops on a device ("i runs before k"), with
        S_k >= S_i + d_i - M (1 - x_ik)   and   S_i >= S_k + d_k - M x_ik,
    fixed where the implied graph (DAG, symmetry breaking, memory precedences) orders the pair;
  - memory: a device's level when forward k starts depends only on which of its ops run before
    k, so  M_B(k) + sum_i x_ik · delta_i <= limit  is linear in the binaries; and the memory
    disjunctions (`bounds.memory_disjunctions`) as cuts x_(B,F) + x_(W,F) >= 1.
Times are the problem's own floats (no ticks); the MILP's tolerances state its resolution.
"""

from __future__ import annotations

import multiprocessing
import signal
import time

import networkx as nx

from zbopt.ops import Op
from zbopt.problem import FORWARD, Problem
from zbopt.simulate import simulate
from zbopt.solvers.bounds import heads_and_tails, implied_graph, lower_bounds, memory_disjunctions
from zbopt.solvers.result import (
    OBJECTIVES,
    SolveResult,
    TickScale,
    check_close,
    meets_bound,
    objective_bound,
    objective_value,
    schedule_from_starts,
    settle,
    warm_start_simulation,
)

BACKENDS = ("cbc", "highs")
RESOLUTION = 1e-6  # feasibility tolerance of CBC and HiGHS, in the problem's units


def _ordered_before(graph: nx.DiGraph) -> set[tuple[Op, Op]]:
    """Pairs (a, b) on one device where a must precede b through the implied graph (the DAG, the
    symmetry breaking and the memory precedences, safe as in the CP-SAT model)."""
    closure = nx.transitive_closure_dag(graph)
    return {(a, b) for a, b in closure.edges if graph.nodes[a]["device"] == graph.nodes[b]["device"]}


def solve_milp(
    problem: Problem,
    *,
    backend: str = "highs",
    time_limit: float = 60.0,
    warm_start: str | None = None,
    workers: int = 2,
    objective: str = "makespan",
) -> SolveResult:
    """Smallest makespan (or longest device span) under the memory limit, as a MILP; see the module
    docstring. The status is read from the solver's own solution status, not PuLP's "Optimal",
    which PuLP also reports after a time limit.

    The MILP is built and solved in a fresh process: PuLP imports highspy, and highspy and OR-Tools
    each ship their own HiGHS library; whichever loads second into a process fails to resolve its
    symbols. So PuLP never enters the caller's process, which may use CP-SAT. Ctrl-C stops the
    child and raises KeyboardInterrupt here (no schedule: the MILP solvers keep their incumbent).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    arguments = dict(backend=backend, time_limit=time_limit, warm_start=warm_start, workers=workers,
                     objective=objective)
    # leaving the block terminates the child, also when Ctrl-C interrupts the wait
    with multiprocessing.get_context("spawn").Pool(1, initializer=_ignore_interrupts) as pool:
        return pool.apply(_solve_here, (problem,), arguments)


def _ignore_interrupts() -> None:
    """Ctrl-C is the parent's to handle: it stops the child, which should not print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _solve_here(problem: Problem, *, backend: str, time_limit: float, warm_start: str | None, workers: int,
                objective: str) -> SolveResult:
    """Build and solve the MILP in this process (a child of `solve_milp`)."""
    import pulp

    began = time.perf_counter()
    bounds = lower_bounds(problem)
    independent_bound = objective_bound(problem, bounds, objective)
    warm = warm_start_simulation(problem, warm_start, objective)
    tolerance = RESOLUTION * max(1.0, independent_bound)
    if meets_bound(warm, objective, independent_bound, tolerance):
        status, simulation, value, lower = settle("unknown", None, warm, objective, independent_bound, tolerance, True)
        return SolveResult(status, simulation, value, lower, backend, objective, time.perf_counter() - began,
                           warm[0], RESOLUTION, bounds.as_dict())
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(graph)
    everything_in_a_row = (sum(d["duration"] for _, d in graph.nodes(data=True))
                           + sum(d["latency"] for *_, d in graph.edges(data=True)))
    horizon = warm[1].makespan if warm is not None else everything_in_a_row

    model, start, before, goal = build_model(problem, graph, heads, tails, horizon, independent_bound, objective)
    ops = list(graph)
    if warm is not None:
        for op in ops:
            start[op].setInitialValue(warm[1].times_of(op)[0])
        goal.setInitialValue(objective_value(warm[1], objective))
        for (first, second), x in before.items():
            if isinstance(x, pulp.LpVariable):
                x.setInitialValue(1 if warm[1].times_of(first)[0] < warm[1].times_of(second)[0] else 0)

    remaining = max(1.0, time_limit - (time.perf_counter() - began))
    if backend == "cbc":
        engine = pulp.PULP_CBC_CMD(msg=False, timeLimit=remaining, threads=workers, gapRel=1e-7,
                                    warmStart=warm is not None)
    else:
        engine = pulp.HiGHS(msg=False, timeLimit=remaining, threads=workers, gapRel=1e-7)
    model.solve(engine)
    solution = model.sol_status
    status = {pulp.LpSolutionOptimal: "optimal", pulp.LpSolutionIntegerFeasible: "feasible",
              pulp.LpSolutionInfeasible: "infeasible"}.get(solution, "unknown")
    simulation = None
    if status in ("optimal", "feasible"):
        starts = {op: start[op].value() for op in ops}
        simulation = simulate(problem, schedule_from_starts(problem, starts, backend), strict=True)
        check_close(backend, objective_value(simulation, objective), goal.value(), TickScale(1, True, RESOLUTION))
    status, simulation, value, lower = settle(status, simulation, warm, objective, independent_bound, tolerance, True)
    return SolveResult(status, simulation, value, lower, backend,
                       objective, time.perf_counter() - began, None if warm is None else warm[0], RESOLUTION,
                       bounds.as_dict())


def build_model(problem: Problem, graph: nx.DiGraph, heads: dict, tails: dict, horizon: float,
                independent_bound: float, objective: str):
    """The disjunctive MILP: (model, start variables, "runs before" terms, objective variable)."""
    import pulp

    model = pulp.LpProblem("zbopt", pulp.LpMinimize)
    ops = list(graph)
    name = {op: str(op) for op in ops}
    duration = {op: graph.nodes[op]["duration"] for op in ops}
    slack = RESOLUTION * max(1.0, horizon)  # float heads and warm-start times may differ by a rounding
    start = {op: pulp.LpVariable(f"S_{name[op]}", max(0.0, heads[op] - slack), horizon - duration[op] + slack)
             for op in ops}
    goal = pulp.LpVariable(objective, independent_bound - slack, horizon + slack)
    model += goal
    for source, target, data in graph.edges(data=True):
        model += start[target] >= start[source] + duration[source] + data["latency"]
    fixed = _ordered_before(graph)
    before: dict[tuple[Op, Op], object] = {}  # (i, k) -> 1, 0 or a binary: i runs before k
    for stages in problem.stages_of_device:
        mine = sorted(op for op in ops if op.stage in stages)
        for index, first in enumerate(mine):
            for second in mine[index + 1:]:
                if (first, second) in fixed:
                    before[first, second], before[second, first] = 1, 0
                    model += start[second] >= start[first] + duration[first]
                elif (second, first) in fixed:
                    before[first, second], before[second, first] = 0, 1
                    model += start[first] >= start[second] + duration[second]
                else:
                    x = pulp.LpVariable(f"x_{name[first]}_{name[second]}", cat="Binary")
                    before[first, second], before[second, first] = x, 1 - x
                    model += start[second] >= start[first] + duration[first] - horizon * (1 - x)
                    model += start[first] >= start[second] + duration[second] - horizon * x
    if problem.memory_limit is not None:
        for device, stages in enumerate(problem.stages_of_device):
            mine = [op for op in ops if op.stage in stages]
            for forward in (op for op in mine if op.kind == FORWARD):
                level = problem.activation_memory[forward.stage] + pulp.lpSum(
                    before[other, forward] * problem.memory_delta(other.kind, other.stage)
                    for other in mine if other != forward)
                model += level <= problem.memory_limit[device]
        for backward, weight, forward in memory_disjunctions(problem, ops):
            ended = before[backward, forward] + before[weight, forward]
            if not isinstance(ended, int):  # both fixed: the implied graph settled it
                model += ended >= 1
    if objective == "makespan":
        for op in ops:
            if tails[op] == 0:
                model += goal >= start[op] + duration[op]
    else:
        for device, stages in enumerate(problem.stages_of_device):
            first = pulp.LpVariable(f"first_{device}", 0, horizon)
            for op in ops:
                if op.stage in stages:
                    model += first <= start[op]
                    model += goal >= start[op] + duration[op] - first
    return model, start, before, goal
