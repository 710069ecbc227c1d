"""The single-device relaxation: one device's ops alone, solved exactly (CP-SAT), as a lower bound.

Where a device holds several stages (v >= 2) this complements the device sequencing bound (a
dynamic program over the same device, `sequencing.device_sequencing`, which merges orders and so can
be weaker, but needs no solver and is often far faster). It keeps everything that involves only
the device and relaxes the rest:

- each op starts after its head and is followed by its tail (the implied graph's, see `implied`);
- between two of the device's ops in one microbatch's chain (F on chunk 0 ... F on chunk 1, B on
  chunk 1 ... B on chunk 0, B before its W) at least the work and latency of the ops between them
  on other devices (the "round trip");
- the implied graph's edges among the device's ops (microbatch order per kind and stage, memory
  precedences, iteration barriers);
- one op at a time, and the device's memory limit;
- objective: the latest end plus tail.

Notes
-----
Some optimal schedule runs the ops of each kind and stage in microbatch order (see `full_model`), and
every such valid schedule, restricted to the device, satisfies all of the above; so the
relaxation's optimum, and any lower bound CP-SAT proves on it, bounds the makespan. Durations,
heads, tails and lags are rounded down to integer ticks and memory amounts down (the limit up),
which only relaxes it further.
"""

from __future__ import annotations

import math

import networkx as nx
from ortools.sat.python import cp_model

from zbopt.ops import Op
from zbopt.problem import Problem
from zbopt.solvers.cp_parts import lifetime_intervals, solve_stoppable, timed_solver
from zbopt.solvers.sequencing import chain_lags
from zbopt.ticks import memory_scale, tick_scale

RELAXATION_SUBSOLVERS = ("max_lp", "core")
RELAXATION_SEED = 1  # CP-SAT's own default, with which the times in `device_relaxation` were measured


def device_relaxation(problem: Problem, device: int, graph: nx.DiGraph, heads: dict[Op, float],
                      tails: dict[Op, float], seconds: float) -> float:
    """A lower bound on the makespan from `device` alone (see the module docstring), proven by
    CP-SAT within `seconds` (its best bound when it does not finish)."""
    scale = tick_scale(problem)

    def ticks(value: float) -> int:
        return math.floor(value * scale.ticks_per_unit + 1e-6)

    mine = [op for op in graph if graph.nodes[op]["device"] == device]
    duration = {op: ticks(graph.nodes[op]["duration"]) for op in mine}
    horizon = max(ticks(heads[op]) for op in mine) + sum(duration.values()) + max(ticks(tails[op]) for op in mine)
    model = cp_model.CpModel()
    start = {op: model.NewIntVar(ticks(heads[op]), horizon, f"s_{op}") for op in mine}
    end = {op: start[op] + duration[op] for op in mine}
    model.AddNoOverlap([model.NewFixedSizeIntervalVar(start[op], duration[op], f"i_{op}") for op in mine])
    for earlier, later, lag in chain_lags(problem, device):
        model.Add(start[later] >= end[earlier] + ticks(lag))
    for source, target, data in graph.edges(data=True):
        if graph.nodes[source]["device"] == device == graph.nodes[target]["device"]:
            model.Add(start[target] >= end[source] + ticks(data["latency"]))
    if problem.memory_limit is not None:  # amounts rounded down, the limit up: a relaxation
        held = lifetime_intervals(model, problem, mine, start, end, horizon, lambda amount: math.floor(amount + 1e-9))
        capacity = math.ceil(problem.memory_limit[device] * memory_scale(problem) - 1e-9)
        model.AddCumulative([life.interval for life in held[device]], [life.amount for life in held[device]], capacity)
    goal = model.NewIntVar(0, 2 * horizon, "goal")
    for op in mine:
        model.Add(goal >= end[op] + ticks(tails[op]))
    model.Minimize(goal)
    # two workers that prove these small models fast together (measured: p = 4, v = 2, V-Min's memory:
    # optima proven in 2-7 s, where the default search's bound stalls ~10% lower after 20 s)
    solver = timed_solver(seconds, len(RELAXATION_SUBSOLVERS), RELAXATION_SEED)
    solver.parameters.subsolvers.extend(RELAXATION_SUBSOLVERS)
    code = solve_stoppable(solver, model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        return 0.0  # infeasible cannot happen for a valid problem; prove nothing rather than too much
    return scale.units(solver.BestObjectiveBound())
