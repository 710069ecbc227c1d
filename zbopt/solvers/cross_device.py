"""The k-device relaxation: the ops of a group of devices together, solved by CP-SAT, as a lower bound.

A device whose memory is full waits for a gradient that its neighbour, itself busy, sends late: no
bound on one device sees that wait, one on the two of them does. The relaxation keeps everything
that involves only the group's devices and relaxes the rest (one device is the single-device
relaxation, the bounds' device relaxation):

- each op starts after its head and is followed by its tail (the implied graph's, see `implied`);
- the implied graph's edges among the group's ops, with their latencies: the microbatch chains
  between its devices, microbatch order per kind and stage, memory precedences, iteration barriers;
- between two of the group's ops in one microbatch's chain, at least the work and latency of the
  ops between them on the devices left out (`sequencing.chain_lags`, the round trip);
- one op at a time per device, and each device's memory limit (a cumulative of activation lifetimes);
- where a limit makes recomputation or offload matter, each activation kept, recomputed or
  offloaded, with the optional R, O and L ops and the footprints of the full model
  (`model_memory.activation_choice_literals`, `cp_parts.lifetime_intervals`);
- with overlapped pairs, every candidate pair of the group's devices as an optional interval
  (`overlap_pairs.pair_choices`), so the bound prices how many pairs can form; where the candidates
  would be too many (or recomputation or offload matter too), the ops shortened as
  `pair_relaxation.pair_relaxed` does instead;
- objective: the latest end plus tail.

Notes
-----
Some optimal schedule has the microbatch order `implied.symmetric_successors` gives, and every such
valid schedule, restricted to the group, satisfies all of the above (an op of a device left out
takes at least its least duration, `overlap_pairs.least_duration`), so the relaxation's optimum, and
any lower bound CP-SAT proves on it, bounds the makespan. Durations, heads, tails, lags and
latencies are rounded down to integer ticks, memory amounts down and limits up, which only relaxes
it further. The horizon leaves room for running the group's microbatches one after another, each op
after its whole lag, so it cuts off no optimum of the relaxation.

Measured (`benchmarks/bench_cross_device.py`, 30 s per group, two workers on a busy machine): two
devices prove more than every single-device bound on small problems (p = 2-3, m = 2-3: by one
op or two), and the relaxation prices recomputation and overlapped pairs where the single-device
bounds do not; at issue 30's grid (p = 6-8, m = 12-24) CP-SAT proves nothing above the single
device's dynamic program for k = 1, 2 or 3, from the DP's value or from 0 alike.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import NamedTuple

import networkx as nx
from ortools.sat.python import cp_model

from zbopt.core.dag import device_work
from zbopt.core.kinds import OFFLOAD, RECOMPUTE, RELOAD, WEIGHT
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.ticks import cost_values, memory_scale, scaled_costs, tick_scale
from zbopt.solvers.cp_parts import OpVars, lifetime_intervals, solve_stoppable, timed_solver
from zbopt.solvers.model_memory import activation_choice_literals
from zbopt.solvers.overlap_pairs import PairChoice, candidate_window, least_duration, pair_choices
from zbopt.solvers.pair_relaxation import pair_relaxed
from zbopt.solvers.sequencing import chain_lags

__all__ = ["SEED", "SUBSOLVERS", "GroupBound", "cross_device_bound", "device_groups", "group_relaxation"]

# two workers that prove these models fast together (measured on the single device: p = 4, v = 2, V-Min's
# memory: optima proven in 2-7 s, where the default search's bound stalls ~10% lower after 20 s)
SUBSOLVERS = ("max_lp", "core")
SEED = 1  # CP-SAT's own default, with which those times were measured


class _Group(NamedTuple):
    """The relaxation's data in integer ticks: the problem with every cost rounded down, the
    group's devices and ops, each op's head and tail, every precedence (earlier, later, least time
    from the end of one to the start of the other) and the horizon."""

    problem: Problem
    devices: frozenset[int]
    ops: list[Op]
    head: dict[Op, int]
    tail: dict[Op, int]
    precedences: list[tuple[Op, Op, int]]
    horizon: int


class GroupBound(NamedTuple):
    """What CP-SAT found on a group's relaxation (problem units): `bound`, the least value it
    proved (a lower bound on the makespan), and `relaxed`, the best solution of the relaxation it
    found (None if none): no better bound can come from this group, however long it is solved."""

    bound: float
    relaxed: float | None


def cross_device_bound(problem: Problem, devices: tuple[int, ...], graph: nx.DiGraph, heads: dict[Op, float],
                       tails: dict[Op, float], seconds: float, floor: float = 0.0) -> float:
    """A lower bound on the makespan from the ops of `devices` together (see the module
    docstring), proven by CP-SAT within `seconds` (its best bound when it does not finish), and at
    least `floor`: any lower bound on the makespan known already (e.g. the single-device bounds),
    from which CP-SAT starts proving.

    `graph` is `implied.implied_graph(problem)`; `heads` and `tails` are any valid for `problem`
    (its `implied.heads_and_tails`, with overlapped pairs those of each op at its least duration,
    e.g. of `overlap_pairs.as_paired` or of `pair_relaxed`)."""
    return group_relaxation(problem, devices, graph, heads, tails, seconds, floor).bound


def group_relaxation(problem: Problem, devices: tuple[int, ...], graph: nx.DiGraph, heads: dict[Op, float],
                     tails: dict[Op, float], seconds: float, floor: float = 0.0) -> GroupBound:
    """`cross_device_bound`, with the best solution of the relaxation CP-SAT found.

    Notes
    -----
    With the objective at least `floor` the model's optimum is the larger of the relaxation's
    optimum and `floor`, both at most the makespan's optimum: so any lower bound will do."""
    model, goal, scale = _model(problem, devices, graph, heads, tails, floor)
    model.Minimize(goal)
    solver = timed_solver(seconds, len(SUBSOLVERS), SEED)
    solver.parameters.subsolvers.extend(SUBSOLVERS)
    code = solve_stoppable(solver, model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        return GroupBound(floor, None)  # infeasible cannot happen for a valid problem; prove nothing more
    found = code in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    return GroupBound(max(floor, solver.BestObjectiveBound() / scale),
                      solver.ObjectiveValue() / scale if found else None)


def _model(problem: Problem, devices: tuple[int, ...], graph: nx.DiGraph, heads: dict[Op, float],
           tails: dict[Op, float], floor: float) -> tuple[cp_model.CpModel, object, int]:
    """The relaxation of the group (see the module docstring): the model, its objective (a
    variable, at least `floor`) and the ticks per problem unit."""
    paired = problem.pairs is not None
    if paired and (problem.mechanisms_matter or candidate_window(problem, None)[1]):
        problem = pair_relaxed(problem)  # the pairs would not all be candidates: every op shortened instead
    scale = _floor_scale(problem)
    group = _group(problem, frozenset(devices), graph, heads, tails, scale)
    model = cp_model.CpModel()
    ops, pairs, choices = _intervals(model, group)
    _no_overlap(model, group.problem, ops, pairs)
    _precedences(model, group, ops, pairs)
    if problem.memory_limit is not None:
        _memory(model, group, ops, choices)
    least = math.floor(floor * scale + 1e-6)
    goal = model.NewIntVar(least, max(least, group.horizon + max(group.tail.values())), "goal")
    for op in group.ops:
        model.Add(goal >= _tail_from(ops[op], op, group.problem, paired) + group.tail[op])
    return model, goal, scale


def _tail_from(variables: OpVars, op: Op, problem: Problem, paired: bool):
    """Where an op's tail counts from: its end; with overlapped pairs, where tails are measured from
    an op's start plus its least duration (`overlap_pairs.as_paired`: a B's W may start with it in
    a pair), its start plus that least duration, or only its start where the pairs were relaxed."""
    if not paired:
        return variables.end
    return variables.start + (least_duration(problem, op) if problem.pairs is not None else 0)


def device_groups(problem: Problem, k: int, scores: list[float] | None = None) -> list[tuple[int, ...]]:
    """The groups of `k` devices worth a `cross_device_bound`: those a microbatch's route links,
    i.e. connected by consecutive stages on different devices (loop: k adjacent devices around the
    ring, the last linked to the first where v >= 2; V: k adjacent devices; bidirectional, whose
    routes both run along the devices, k adjacent devices too). The most promising first: by the
    highest per-device `scores` (e.g. the single-device bounds; default each device's work) in the
    group, then by their sum. All devices when k >= p."""
    p = problem.num_devices
    if k >= p:
        return [tuple(range(p))]
    links: list[set[int]] = [set() for _ in range(p)]
    for stages, _ in problem.routes:
        for stage, following in pairwise(stages):
            one, other = problem.device_of(stage), problem.device_of(following)
            if one != other:
                links[one].add(other)
                links[other].add(one)
    groups = {frozenset([device]) for device in range(p)}
    for _ in range(k - 1):
        groups = {group | {near} for group in groups for device in group for near in links[device] - group}
    score = device_work(problem) if scores is None else scores
    return sorted((tuple(sorted(group)) for group in groups),
                  key=lambda group: (-max(score[d] for d in group), -sum(score[d] for d in group), group))


def _floor_scale(problem: Problem) -> int:
    """Ticks per unit: the solvers' (`tick_scale`), finer while some cost would round down to
    nothing (a rounded-down problem keeps every cost positive)."""
    scale = tick_scale(problem).ticks_per_unit
    least = min(cost_values(problem))
    while least * scale < 1:
        scale *= 10
    return scale


def _floored(problem: Problem, scale: int) -> Problem:
    """The problem with every cost and the latency in ticks, rounded down (each microbatch's own)."""
    return scaled_costs(problem, lambda value: math.floor(value * scale + 1e-6))


def _group(problem: Problem, devices: frozenset[int], graph: nx.DiGraph, heads: dict[Op, float],
           tails: dict[Op, float], scale: int) -> _Group:
    """The group's ops, heads, tails and precedences in ticks: the graph's edges among them, and
    each chain lag that is not one of them (the least durations of the ops left out between)."""

    def ticks(value: float) -> int:
        return math.floor(value * scale + 1e-6)

    floored = _floored(problem, scale)
    mine = [op for op in graph if graph.nodes[op]["device"] in devices]
    present = set(mine)
    precedences = [(source, target, ticks(data["latency"])) for source, target, data in graph.edges(data=True)
                   if source in present and target in present]
    linked = {(source, target) for source, target, _ in precedences}
    least = [least_duration(floored, op) for op in op_table(floored).ops()] if floored.pairs is not None else None
    precedences += [(earlier, later, round(lag)) for earlier, later, lag in chain_lags(floored, devices, least)
                    if (earlier, later) not in linked]
    head = {op: ticks(heads[op]) for op in mine}
    work = sum(floored.cost(*op) for op in mine)
    if floored.mechanisms_matter:  # room for an R, O and L per activation
        kinds = [RECOMPUTE] * floored.recomputation_matters + [OFFLOAD, RELOAD] * floored.offload_matters
        work += sum(floored.cost(kind, op.stage, op.microbatch) for op in mine if op.kind == floored.kinds[0]
                    for kind in kinds)
    horizon = max(head.values()) + int(work) + sum(max(0, lag) for *_, lag in precedences)
    return _Group(floored, devices, mine, head, {op: ticks(tails[op]) for op in mine}, precedences, horizon)


def _intervals(model, group: _Group) -> tuple[dict[Op, OpVars], list[PairChoice], dict | None]:
    """Every op of the group (a fixed interval from its head on), with overlapped pairs the
    candidate pairs and each member alone or in one of them, and with recomputation or offload
    the choice per activation and the optional R, O and L (the full model's own pieces)."""
    floored, horizon = group.problem, group.horizon
    ops = {}
    for op in group.ops:
        size = int(floored.cost(*op))
        start = model.NewIntVar(group.head[op], horizon, f"s_{op}")
        ops[op] = OpVars(start, start + size, model.NewFixedSizeIntervalVar(start, size, f"i_{op}"))
    pairs: list[PairChoice] = []
    if floored.pairs is not None:  # every candidate: `cross_device_bound` relaxed the pairs away otherwise
        pairs, members = pair_choices(model, floored, ops, horizon, candidate_window(floored, None)[0])
        ops.update(members)
    choices = None
    if floored.mechanisms_matter:
        choices, optional = activation_choice_literals(model, floored, ops, horizon)
        ops.update(optional)
    return ops, pairs, choices


def _no_overlap(model, problem: Problem, ops: dict[Op, OpVars], pairs: list[PairChoice]) -> None:
    """One op at a time on each device's compute lane (pairs included) and on each copy lane."""
    lanes: dict[tuple, list] = {}
    for op, variables in ops.items():
        device = problem.device_of(op.stage)
        key = (op.kind, problem.host_link(device)) if op.kind in (OFFLOAD, RELOAD) else ("compute", device)
        lanes.setdefault(key, []).append(variables.interval)
    for pair in pairs:
        lanes["compute", problem.device_of(pair.members[0].stage)].append(pair.interval)
    for intervals in lanes.values():
        model.AddNoOverlap(intervals)


def _precedences(model, group: _Group, ops: dict[Op, OpVars], pairs: list[PairChoice]) -> None:
    """Every precedence of the group; a B and its W in one chosen pair of F, B and W start together."""
    whole_backward = {pair.members[1]: pair.whole_backward for pair in pairs if pair.whole_backward is not None}
    for earlier, later, lag in group.precedences:
        precedence = model.Add(ops[later].start >= ops[earlier].end + lag)
        if earlier in whole_backward and later == Op(WEIGHT, earlier.stage, earlier.microbatch):
            precedence.OnlyEnforceIf(whole_backward[earlier].Not())


def _memory(model, group: _Group, ops: dict[Op, OpVars], choices) -> None:
    """Each device's activations within its limit: amounts rounded down, the limit up."""
    problem = group.problem
    start = {op: variables.start for op, variables in ops.items()}
    end = {op: variables.end for op, variables in ops.items()}
    held = lifetime_intervals(model, problem, group.ops, start, end, group.horizon,
                              lambda amount: math.floor(amount + 1e-9), choices)
    unit = memory_scale(problem)
    for device in group.devices:
        capacity = math.ceil(problem.memory_limit[device] * unit - 1e-9)
        model.AddCumulative([life.interval for life in held[device]], [life.amount for life in held[device]], capacity)
