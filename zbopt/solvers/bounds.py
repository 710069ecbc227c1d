"""Lower bounds on the makespan of any valid schedule, computed apart from every solver.

Each bound is a relaxation of the scheduling problem, so each is <= the optimum; the solvers'
answers are checked against them, and `lower_bounds` gives them all and the best:

- critical path: the longest chain of dependencies and latencies (in the implied graph, below);
- device load: per device, the earliest any of its ops can start + its total work + the least
  time any of its ops still needs after it ends;
- one-machine relaxation: per device, its ops on one machine with heads and tails, preemption
  allowed (`jackson_preemptive`);
- memory: per device, the memory-time its activations must hold, over its memory limit
  (`memory_bound`);
- device sequencing: per device, its ops alone on one machine, without preemption, each a
  round trip after the op before it in its microbatch's chain, within the memory limit
  (`device_sequencing`, a dynamic program);
- device relaxation (v >= 2): the same single device solved by CP-SAT (`relaxation`).

With recomputation allowed, the memory bound prices it (a recomputed activation holds less for
more work, `memory_bound`, and where a device holds one whole activation at a time,
`whole_activations_bound`), and the two single-device bounds, which assume every activation kept,
are 0 (a relaxation choosing what to recompute was tried: with 5 s per device CP-SAT proved no
more than the device's work, p = 4, m = 8, 1.5B costs). They are 0 too with the bidirectional
placement, where a microbatch visits only some of a device's stages. With overlapped pairs every
bound is that of `pair_relaxed`.

Notes
-----
Heads (earliest starts) and tails (the time still needed after an op ends) come from
`implied_graph`: the op DAG plus the precedences that every schedule with ops of one kind and
stage in microbatch order obeys (same-device order, and the memory precedences of
`memory_precedences`). Some optimal schedule has that order (see the CP-SAT module), so bounds
computed on the implied graph still bound the optimum.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import time
from dataclasses import dataclass, fields
from typing import NamedTuple

import networkx as nx

from zbopt.ops import Op, critical_path, device_work, earliest_finish, one_per_route, op_graph
from zbopt.problem import BACKWARD, FORWARD, WEIGHT, Problem
from zbopt.solvers.relaxation import chain_lags, device_relaxation
from zbopt.tolerance import memory_ceiling

RELAXATION_MAX_S = 20.0  # the single-device bounds' total time (v >= 2), or less if the deadline says so
SEQUENCING_SHARE = 0.3  # of it, for the device sequencing dynamic program before the CP-SAT relaxation
GRAPH_SECONDS_PER_OP = 1e-4  # building the implied graph and its heads and tails (measured: 4 s for 49k ops)


@dataclass(frozen=True)
class LowerBounds:
    """Every bound (problem units) and the best of them. device_sequencing is 0 where it was
    skipped because it could not beat the others (see `device_sequencing`)."""

    critical_path: float
    device_load: float
    one_machine: float
    memory: float
    device_sequencing: float
    device_relaxation: float = 0.0
    complete: bool = True  # False when a deadline cut some bounds short (those report 0 or less)

    def by_name(self) -> dict[str, float]:
        """Every bound by its name (the dataclass fields but `complete`)."""
        return {item.name: getattr(self, item.name) for item in fields(self) if item.name != "complete"}

    @property
    def best(self) -> float:
        return max(self.by_name().values())

    @property
    def binding(self) -> str:
        """The name of the bound that gives `best` (the first, on a tie)."""
        values = self.by_name()
        return max(values, key=values.__getitem__)

    def as_dict(self) -> dict[str, float]:
        return {**self.by_name(), "best": self.best}


def _same_order_group(problem: Problem, microbatch: int, other: int) -> bool:
    """Whether symmetry breaking orders the two microbatches: within an iteration when iterations
    are separated by a flush, across all of them otherwise."""
    m = problem.num_microbatches
    return not problem.flush or microbatch // m == other // m


def symmetric_successors(problem: Problem, ops) -> list[tuple[Op, Op]]:
    """Pairs (op, the same kind and stage on the next microbatch) that symmetry breaking orders.

    Where the columns are not interchangeable (`Problem.columns_interchangeable`: recomputation,
    offload or overlapped pairs allowed), only the forwards of each route's first stage:
    relabelling each column apart is no longer a symmetry, relabelling whole microbatches of one
    route still is, and sorts one column."""
    present = set(ops)
    firsts = {stages[0] for stages, _ in problem.routes}
    return [(op, following) for op in ops
            if (following := Op(op.kind, op.stage, op.microbatch + 1)) in present
            and _same_order_group(problem, op.microbatch, following.microbatch)
            and (problem.columns_interchangeable or (op.kind == FORWARD and op.stage in firsts))]


def memory_precedences(problem: Problem, ops) -> list[tuple[Op, Op]]:
    """Pairs (gradient op, forward) where the gradient op must end before the forward starts, in
    every valid schedule whose ops of one kind and stage run in microbatch order.

    Notes
    -----
    M_B is a microbatch's activation memory on stage s and M_W the part of it that W keeps after
    B, as in Table 1 of the Zero Bubble paper [1]_. On a device with limit L, if B(s, i) (or BW)
    has not ended when F(s, i+k) starts, then B(s, j) has not ended for any j >= i, so
    microbatches i..i+k of stage s all hold their activation M_B: too much once (k+1)·M_B > L. If
    W(s, i) has not ended, they hold at least M_W each and the new one M_B: too much once
    k·M_W + M_B > L. Each k is rounded up (a larger k is a weaker claim).

    References
    ----------
    .. [1] Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Table 1.

    None where the columns are not in microbatch order (`symmetric_successors`).
    """
    if problem.memory_limit is None or not problem.columns_interchangeable:
        return []
    present = set(ops)
    pairs = []
    for op in ops:
        if op.kind == FORWARD:
            continue
        limit = problem.memory_limit[problem.device_of(op.stage)]
        activation = problem.activation_memory[op.stage]
        if op.kind == WEIGHT:
            kept = problem.weight_memory[op.stage]
            if kept <= 0:
                continue
            distance = math.floor((limit - activation) / kept + 1e-9) + 1
        elif activation > 0:
            distance = math.floor(limit / activation + 1e-9)
        else:
            continue  # a stage that holds nothing never fills the memory
        forward = Op(FORWARD, op.stage, op.microbatch + distance)
        if forward in present and _same_order_group(problem, op.microbatch, forward.microbatch):
            pairs.append((op, forward))
    return pairs


def memory_disjunctions(problem: Problem, ops) -> list[tuple[Op, Op, Op]]:
    """Triples (B(s, j), W(s, i), F(s, n)), i < j < n, where at least one of the first two must end
    before the forward starts, in every valid microbatch-ordered schedule with a split backward.

    Notes
    -----
    The reasoning of `memory_precedences`: were neither ended, microbatches j..n of stage s would
    hold M_B each and i..j-1 at least M_W each: too much once (n-j+1)·M_B + (j-i)·M_W > L. For each
    j the latest such i is given (the strongest claim); j = n - k with (k+1)·M_B > L is a memory
    precedence instead. None where the columns are not in microbatch order (`memory_precedences`).
    """
    if problem.memory_limit is None or not problem.split_backward or not problem.columns_interchangeable:
        return []
    present = set(ops)
    triples = []
    for forward in ops:
        stage, newest = forward.stage, forward.microbatch
        kept = problem.weight_memory[stage]
        if forward.kind != FORWARD or kept <= 0:
            continue
        limit = problem.memory_limit[problem.device_of(stage)]
        activation = problem.activation_memory[stage]
        for pending in range(newest - 1, -1, -1):
            room = limit - (newest - pending + 1) * activation
            if room < 0:
                break
            oldest = pending - math.floor(room / kept + 1e-9) - 1
            weight = Op(WEIGHT, stage, oldest)
            if oldest >= 0 and weight in present and _same_order_group(problem, oldest, newest):
                triples.append((Op(BACKWARD, stage, pending), weight, forward))
    return triples


def implied_graph(problem: Problem) -> nx.DiGraph:
    """The op DAG plus, as edges with latency 0, the precedences every microbatch-ordered valid
    schedule obeys: an op before its successor of the same kind and stage (one device runs both),
    and the memory precedences."""
    graph = op_graph(problem)
    ops = list(graph)
    for source, target in symmetric_successors(problem, ops) + memory_precedences(problem, ops):
        if not graph.has_edge(source, target):
            graph.add_edge(source, target, latency=0.0)
    return graph


def heads_and_tails(graph: nx.DiGraph) -> tuple[dict[Op, float], dict[Op, float]]:
    """Per op, its head (earliest start, ignoring devices) and tail (the longest chain of work and
    latency that must follow its end)."""
    finish = earliest_finish(graph)
    heads = {op: finish[op] - graph.nodes[op]["duration"] for op in graph}
    tails: dict[Op, float] = {}
    for op in reversed(list(nx.topological_sort(graph))):
        tails[op] = max((graph.edges[op, nxt]["latency"] + graph.nodes[nxt]["duration"] + tails[nxt]
                         for nxt in graph.successors(op)), default=0.0)
    return heads, tails


def jackson_preemptive(jobs: list[tuple[float, float, float]]) -> float:
    """max(completion + tail) of the preemptive largest-tail-first schedule on one machine; jobs
    are (head, duration, tail).

    Notes
    -----
    This is the optimum of 1 | r_j, pmtn | max(C_j + q_j): Jackson's rule, largest tail first,
    extended to release dates with preemption [1]_; no schedule without preemption does better,
    so it is a lower bound.

    References
    ----------
    .. [1] W. A. Horn, "Some simple scheduling algorithms", Naval Research Logistics Quarterly
       21(1), 1974, pp. 177-185.

    Examples
    --------
    >>> jackson_preemptive([(0, 2, 5), (1, 1, 10)])  # the second preempts the first at t=1
    12.0
    """
    pending = sorted(jobs)
    ready: list[tuple[float, float]] = []  # (-tail, remaining)
    time, best, index = 0.0, 0.0, 0
    while index < len(pending) or ready:
        if not ready and time < pending[index][0]:
            time = pending[index][0]
        while index < len(pending) and pending[index][0] <= time:
            _, duration, tail = pending[index]
            heapq.heappush(ready, (-tail, duration))
            index += 1
        negative_tail, remaining = heapq.heappop(ready)
        next_release = pending[index][0] if index < len(pending) else float("inf")
        run = min(remaining, next_release - time)
        time += run
        if run < remaining:
            heapq.heappush(ready, (negative_tail, remaining - run))
        else:
            best = max(best, time - negative_tail)
    return float(best)


def activation_lifetimes(problem: Problem) -> list[tuple[float, float]]:
    """Per stage, the least time from F(s) start to the end of B(s) and of W(s) (or BW(s))."""
    single = one_per_route(problem)
    graph = op_graph(single)
    lifetimes = []
    for stage in range(problem.num_stages):
        forward = Op(FORWARD, stage, single.microbatches_of(stage)[0])
        finish = earliest_finish(graph.subgraph(nx.descendants(graph, forward) | {forward}))
        frees = [op for op in finish if op.stage == stage and op.kind != FORWARD]
        by_kind = {op.kind: finish[op] for op in frees}
        input_end = by_kind.get("B", by_kind.get("BW"))
        lifetimes.append((input_end, by_kind.get("W", input_end)))
    return lifetimes


def memory_bound(problem: Problem, lifetimes: list[tuple[float, float]], device_load: list[float]) -> float:
    """makespan >= (memory-time every device must integrate) / (its memory limit); 0 without limits.

    Notes
    -----
    Every microbatch's activation on stage s is held from its forward's start: all of it for at
    least the least time to the end of its input gradient (B, or BW), and the part W keeps
    (weight_memory) for at least the least time to the end of W (`lifetimes`, see
    `activation_lifetimes`). Summed over the microbatches and the device's stages, this
    memory-time (the integral) must fit under the device's limit during the makespan, so
    makespan >= integral / limit.

    With recomputation allowed, a recomputed activation holds its checkpoint for at least F and
    the whole activation from R's start for at least R + B (the part W keeps, R + B + W), which can
    be far less, but each costs its device R more work: `device_load[d]` (a bound on device d's
    makespan from its mandatory work) grows by it. Recomputing x_s microbatches of stage s,
    makespan >= max(load + sum x_s R_s, (integral - sum x_s saving_s) / limit); the least of this
    over real x_s in [0, M] bounds every choice (a fractional knapsack: recompute in decreasing
    saving per unit of R). Where the limit cannot hold two whole activations, so much more
    follows that `whole_activations_bound` is taken too (without offload: it assumes none), or
    with offload `whole_or_offloaded_bound`.

    With offload allowed, an activation may instead be held from F's start to its O's end and
    from its L's start, at no cost in compute: each activation counts the less of kept and
    offloaded (`_offloaded_memory_time`); the copy lanes' own capacity is not used here.
    """
    if problem.memory_limit is None:
        return 0.0
    best = 0.0
    for device, stages in enumerate(problem.stages_of_device):
        limit = problem.memory_limit[device]
        if problem.recomputation_matters and not problem.allow_offload:
            best = max(best, whole_activations_bound(problem, device, lifetimes, device_load[device]))
        if problem.offload_matters:
            best = max(best, whole_or_offloaded_bound(problem, device, lifetimes, device_load[device]))
        integral = 0.0
        trades = []  # (saving of memory-time per unit of recompute time, recompute time available)
        for stage in stages:
            count = len(problem.microbatches_of(stage))
            held = _memory_time(problem, stage, lifetimes[stage])
            if problem.offload_matters:
                held = min(held, _offloaded_memory_time(problem, stage))
            integral += count * held
            if problem.recomputation_matters:
                saving = held - _recomputed_memory_time(problem, stage)
                if saving > 0:
                    trades.append((saving / problem.recompute_times[stage], count * problem.recompute_times[stage]))
        if integral <= 0:  # a device that holds nothing (its limit is positive otherwise)
            continue
        if not problem.recomputation_matters:
            best = max(best, integral / limit)
        else:
            best = max(best, _trade_off(device_load[device], integral / limit, trades, limit))
    return best


def whole_activations_bound(problem: Problem, device: int, lifetimes: list[tuple[float, float]],
                            device_load: float) -> float:
    """A bound on the makespan from `device` when its limit holds one whole activation at a time
    (any two of its stages' activations exceed it); 0 otherwise.

    Notes
    -----
    An activation is whole from the start of its F (kept) or of its R (recomputed) to the end of
    its input gradient; two whole at once would pass the limit, so these spans are disjoint. A
    recomputed span lasts at least R + B. A kept span lasts at least F + rt + B, rt the least time
    its microbatch's chain spends away from the device between F and B (`lifetimes`), during which
    the device can only run ops that need no whole activation: W, and F of recomputed
    activations. A stage whose chain comes back to the device before its B (every stage but the
    device's last) cannot be kept: the later stage's whole span would fall within its own. The
    device's first op starts after the least head, its last ends before the least tail (together
    `device_load` less its work), and between them lie the disjoint spans and the W and
    recomputed F that found no room in a kept span. With k_s activations of stage s kept, the
    makespan is at least edges + sum_s [k_s (F + rt + B) + (M - k_s)(R + B)] + max(0, sum_s
    [(M - k_s) F + M W - k_s rt]); its least over real k_s in [0, M] is a linear program, whose
    value is max over lambda in [0, 1] of edges + sum_s M (R + B) + lambda · sum_s M (F + W) +
    sum_s M · min(0, a_s - lambda c_s), a_s = F + rt - R, c_s = F + rt (its dual), taken at the
    breakpoints.

    Where not even one whole activation and one checkpoint fit, no two activations of the device
    are held at once at all (were two held at once, the one released first is whole just before
    its release, while the other holds at least its checkpoint): each holds the device from its F's
    start for at least F + rt + B, and only W fits in the gaps.

    0 with the bidirectional placement: no chain comes back to a device, and the argument above
    (only the device's last stage kept) does not carry over.
    """
    device_view = _one_whole_at_a_time(problem, device, device_load)
    if device_view is None or problem.bidirectional:
        return 0.0
    stages, ceiling, whole, weight, edges = device_view
    count = problem.total_microbatches
    away = {s: lifetimes[s][0] - problem.forward_times[s] - problem.backward_times[s] for s in stages}
    if whole + min(problem.checkpoint_memory[s] for s in stages) > ceiling:  # one stage per device: a
        # device with more stages cannot go below one activation and a checkpoint (`min_memory_limit`)
        held = sum(count * (problem.forward_times[s] + away[s] + problem.backward_times[s]) for s in stages)
        return edges + held + max(0.0, sum(count * (weight[s] - away[s]) for s in stages))
    base = edges + sum(count * (problem.recompute_times[s] + problem.backward_times[s]) for s in stages)
    outside = sum(count * (problem.forward_times[s] + weight[s]) for s in stages)
    last = max(stages)  # the only stage that may be kept
    c = problem.forward_times[last] + away[last]
    a = c - problem.recompute_times[last]
    breakpoints = {0.0, 1.0} | ({a / c} if c > 0 and 0 < a / c < 1 else set())
    return max(base + share * outside + count * min(0.0, a - share * c) for share in breakpoints)


def whole_or_offloaded_bound(problem: Problem, device: int, lifetimes: list[tuple[float, float]],
                             device_load: float) -> float:
    """With offload allowed, a bound on the makespan from `device` when its limit holds one whole
    activation at a time (with recomputation allowed too: not even one and a checkpoint); 0
    otherwise.

    Notes
    -----
    An activation is whole on its device while kept, from F's start to its input gradient's end
    (at least F + rt + B, rt the least time its chain spends away from the device, as in
    `whole_activations_bound`), or while offloaded, from F's start to O's end and from L's start
    to the input gradient's end (at least F + O + L + B). No two of these spans overlap, nor, when
    the part W keeps and a whole activation exceed the limit, a span and the time from a B to its
    W (at least W). A recomputed activation is whole from R's start (at least R + B); while it
    holds its checkpoint no other can be whole (the limit holds no activation and a checkpoint),
    so its F, a compute op, lies outside every span and every W: it counts F + R + B. All lie
    between the device's least head and least tail (`device_load` less its work), so the makespan
    is at least those edges plus, per activation, the cheapest way.
    """
    device_view = _one_whole_at_a_time(problem, device, device_load)
    if device_view is None:
        return 0.0
    stages, ceiling, whole, weight, total = device_view
    if problem.recomputation_matters and whole + min(problem.checkpoint_memory[s] for s in stages) <= ceiling:
        return 0.0  # a recomputed activation's F may run while another is whole
    for s in stages:
        count = len(problem.microbatches_of(s))
        forward, backward = problem.forward_times[s], problem.backward_times[s]
        ways = [lifetimes[s][0],  # kept: F + rt + B
                forward + problem.offload_times[s] + problem.reload_times[s] + backward]
        if problem.recomputation_matters:
            ways.append(forward + problem.recompute_times[s] + backward)
        weight_alone = problem.split_backward and problem.weight_memory[s] + whole > ceiling
        total += count * (min(ways) + (weight[s] if weight_alone else 0.0))
    return total


class _OneWhole(NamedTuple):
    """A device whose limit holds one whole activation at a time (any two exceed it): its stages,
    its ceiling (`memory_ceiling`), its least activation, W's cost per virtual stage (0 when
    fused), and its edges, the least head plus the least tail (its `device_load` less its work)."""

    stages: tuple[int, ...]
    ceiling: float
    whole: float
    weight: tuple[float, ...]
    edges: float


def _one_whole_at_a_time(problem: Problem, device: int, device_load: float) -> _OneWhole | None:
    """What the bounds on a device that holds one whole activation at a time start from, or None
    when it holds two."""
    stages = problem.stages_of_device[device]
    ceiling = memory_ceiling(problem.memory_caps[device])
    whole = min(problem.activation_memory[s] for s in stages)
    if 2 * whole <= ceiling:
        return None
    weight = problem.weight_times if problem.split_backward else (0.0,) * problem.num_stages
    work = sum(len(problem.microbatches_of(s)) * (problem.forward_times[s] + problem.backward_times[s] + weight[s])
               for s in stages)
    return _OneWhole(stages, ceiling, whole, weight, device_load - work)


def _memory_time(problem: Problem, stage: int, lifetime: tuple[float, float]) -> float:
    """The least memory-time one kept activation of `stage` holds."""
    activation = problem.activation_memory[stage]
    kept = problem.weight_memory[stage] if problem.split_backward else 0.0
    to_input, to_weight = lifetime
    return (activation - kept) * to_input + kept * to_weight


def _recomputed_memory_time(problem: Problem, stage: int) -> float:
    """The least memory-time one recomputed activation of `stage` holds: its checkpoint from F's
    start to R's (at least F), then all of it for R and its backward."""
    return problem.checkpoint_memory[stage] * problem.forward_times[stage] + \
        _held_from_restore(problem, stage, problem.recompute_times[stage])


def _offloaded_memory_time(problem: Problem, stage: int) -> float:
    """The least memory-time one offloaded activation of `stage` holds: all of it for F and its O,
    then from its L's start for L and its backward (the part W keeps, also W)."""
    return problem.activation_memory[stage] * (problem.forward_times[stage] + problem.offload_times[stage]) + \
        _held_from_restore(problem, stage, problem.reload_times[stage])


def _held_from_restore(problem: Problem, stage: int, restore: float) -> float:
    """The least memory-time of an activation of `stage` from the start of the op that makes it
    whole again (R or L, lasting `restore`): all of it for that op and the backward, the part W
    keeps also for W."""
    backward = problem.backward_times[stage]
    weight = problem.weight_times[stage] if problem.split_backward else 0.0
    return _memory_time(problem, stage, (restore + backward, restore + backward + weight))


def _trade_off(load: float, memory: float, trades: list[tuple[float, float]], limit: float) -> float:
    """min over recompute time y of max(load + y, memory - saved(y) / limit), saved(y) taking the
    best `trades` (rate, amount) first: where the rising and the falling line meet, or an end."""
    for rate, amount in sorted(trades, reverse=True):
        if load >= memory:
            break
        step = (memory - load) / (1 + rate / limit)  # the y where the lines meet within this trade
        if step <= amount:
            return load + step
        load, memory = load + amount, memory - amount * rate / limit
    return max(load, memory)


def _chain(problem: Problem, device: int) -> list[tuple[str, int, float]]:
    """(kind, stage, lag) of the device's ops in one microbatch's dependency chain, in chain order
    (its forwards by stage, then its input backwards in reverse), each with the least time between
    the end of the one before it and its start (`relaxation.chain_lags`; 0 for the first)."""
    after = {(earlier.kind, earlier.stage): (later, lag) for earlier, later, lag in chain_lags(problem, device)
             if earlier.microbatch == 0 and later.kind != WEIGHT}
    first = min(problem.stages_of_device[device])
    chain = [(problem.kinds[0], first, 0.0)]
    while (chain[-1][0], chain[-1][1]) in after:
        later, lag = after[chain[-1][0], chain[-1][1]]
        chain.append((later.kind, later.stage, lag))
    return chain


def device_sequencing(problem: Problem, device: int, heads: dict[Op, float], tails: dict[Op, float],
                      needed: float = 0.0, deadline: float = math.inf) -> float:
    """The least max(end + tail) of `device`'s ops run alone on it, in microbatch order per kind
    and stage, each after its head, each op of a microbatch's chain at least its lag after the one
    before it on the device (the round trip through the other devices, `_chain`), W after its B,
    every forward within the memory limit; for any number of stages per device.

    0 for several iterations, 0 when one greedy order already reaches `needed` (the bound could
    not exceed it; this skips most devices of a long pipeline), and 0 when
    `time.perf_counter()` passes `deadline` before the dynamic program ends.

    Notes
    -----
    Every valid microbatch-ordered schedule, restricted to the device, is such a sequence, so this
    bounds the optimum. For a fixed order, starting each op as early as allowed is best for every
    later op (all constraints are lower limits on starts, and memory depends only on the order),
    so the orders are searched by dynamic programming over the state (ops done per kind and
    stage). Different orders reach one state with different labels (time, objective, the release
    of each op waiting for its chain predecessor's lag); keeping only their componentwise minimum
    is optimistic, so the result stays a lower bound. A state whose time plus the work left
    exceeds the objective of one greedy order is dropped: the best order's path keeps labels at
    most its own, whose time plus work left is at most its objective, so that path survives and
    the result stays at most the relaxation's optimum; dropping merged labels can only raise it
    towards that optimum (a review found it higher in about 1% of 50k random device cases, never
    above the optimum of a DP keeping every Pareto-optimal label). On the configurations of Table 5 of the
    Zero Bubble paper [1]_ (one stage per device) it gave the same value as keeping up to 64
    Pareto-optimal labels per state; with two (p = 4, m = 8, v = 2, V placement, V-Min's memory) it
    equals the optimum of the CP-SAT single-device relaxation (517.6 on the last device, reached
    there in 0.04 s against an unproven 30 s search).

    References
    ----------
    .. [1] Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Table 5.
    """
    if problem.total_microbatches != problem.num_microbatches:
        return 0.0
    m = problem.num_microbatches
    chain = _chain(problem, device)
    links = len(chain)
    weights = [(WEIGHT, stage, 0.0) for stage in problem.stages_of_device[device]] if problem.split_backward else []
    positions = [(kind, stage) for kind, stage, _ in chain + weights]  # one per kind and stage of the device
    lag = [lag for *_, lag in chain]
    duration = [problem.cost(kind, stage) for kind, stage in positions]
    op_heads = [[heads[Op(kind, stage, i)] for i in range(m)] for kind, stage in positions]
    op_tails = [[tails[Op(kind, stage, i)] for i in range(m)] for kind, stage in positions]
    position = {pair: index for index, pair in enumerate(positions)}
    allocates = [problem.activation_memory[stage] if kind == FORWARD else 0.0 for kind, stage in positions]
    frees = [0.0] * len(positions)
    for stage in problem.stages_of_device[device]:
        for kind, amount in problem.releases(stage):
            frees[position[kind, stage]] = amount
    # the op whose count bounds each op's: its chain predecessor, or for W its stage's B (kinds[1])
    waits_for = [None, *range(links - 1)] + [position[problem.kinds[1], stage] for _, stage, _ in weights]
    limit = memory_ceiling(problem.memory_caps[device])
    order = [*range(links - 1, -1, -1), *range(links, len(positions))]  # on ties: backwards, forwards, W

    def successors(state: tuple[int, ...], label: tuple[float, ...]):
        """(start, rank, state, label) for each op that can run next, started as early as allowed.
        A label is (time, objective, releases...): the releases of chain position c's waiting ops
        (microbatches state[c] .. state[c-1]-1) in one flat run per position, in chain order."""
        held = sum(count * (alloc - free) for count, alloc, free in zip(state, allocates, frees, strict=True))
        ends = [2]
        for c in range(1, links):
            ends.append(ends[-1] + state[c - 1] - state[c])
        for rank, index in enumerate(order):
            done = state[index]
            if done >= m or (waits_for[index] is not None and done >= state[waits_for[index]]):
                continue
            if allocates[index] and held + allocates[index] > limit:
                continue
            begin = max(label[0], op_heads[index][done])
            releases = label[2:]
            if index < links:
                if index:
                    begin = max(begin, label[ends[index - 1]])
                    releases = label[2:ends[index - 1]] + label[ends[index - 1] + 1:]
                if index + 1 < links:
                    cut = ends[index + 1] - 2 - (1 if index else 0)  # the end of position index + 1's run
                    releases = (*releases[:cut], begin + duration[index] + lag[index + 1], *releases[cut:])
            end = begin + duration[index]
            yield (begin, rank, (*state[:index], done + 1, *state[index + 1:]),
                   (end, max(label[1], end + op_tails[index][done]), *releases))

    start = (tuple(0 for _ in positions), (0.0, 0.0))
    steps = len(positions) * m
    probe = start
    upper = math.inf
    for _ in range(steps):  # one order (earliest start, then `order`) bounds the DP above, unless it deadlocks
        options = list(successors(*probe))
        if not options:
            break
        probe = min(options)[2:]
    else:
        if probe[1][1] <= needed:
            return 0.0
        upper = probe[1][1] * (1 + 1e-9)
    work = sum(duration) * m
    layer = dict([start])
    for _ in range(steps):
        if time.perf_counter() > deadline:
            return 0.0
        following: dict[tuple[int, ...], tuple[float, ...]] = {}
        for state, label in layer.items():
            for _begin, _rank, reached, reached_label in successors(state, label):
                known = following.get(reached)
                following[reached] = reached_label if known is None else tuple(map(min, reached_label, known))
        # a state whose device time plus the work it has left passes one order's objective cannot be on
        # the best order's path (its labels there are at most that order's own): drop it
        layer = {state: label for state, label in following.items()
                 if label[0] + work - sum(map(operator.mul, state, duration)) <= upper}
    return layer[tuple(m for _ in positions)][1]


def pair_relaxed(problem: Problem) -> Problem:
    """The problem whose bounds also bound `problem` where overlapped pairs may run
    (`Problem.overlap_times`): on each device, every F, B and W (or BW) shortened by the least
    ratio, over the pair kinds and the device's stages, of a pair's cost to its members' costs
    run one after the other (when below 1), and no pairs. The problem itself without pairs.

    Notes
    -----
    Any schedule of `problem` gives one of the relaxed problem no longer: a pair started at s with
    cost c becomes its members one after another from s, together at most c; every other op keeps
    its start and ends no later. No op starts before its inputs' (earlier) ends, the forwards
    allocate at the same moments and the backwards free no later, so the relaxed schedule is valid
    and ends no later: the relaxed problem's lower bounds bound `problem`'s optimum ("the cheapest
    way to run each op").
    """
    if not problem.overlap_times:
        return problem
    split = problem.split_backward
    ratio = [1.0] * problem.num_devices
    for device, stages in enumerate(problem.stages_of_device):
        for kind, _ in problem.overlap_times:
            cost = problem.overlap_cost(kind, device)
            for forward, backward in itertools.product(stages, stages):
                members = problem.forward_times[forward] + problem.backward_times[backward]
                if kind == "FBW" and split:
                    members += problem.weight_times[backward]
                ratio[device] = min(ratio[device], cost / members)
    scale = [ratio[problem.device_of(stage)] for stage in range(problem.num_stages)]

    def scaled(costs):
        return None if costs is None else [c * r for c, r in zip(costs, scale, strict=True)]

    return problem.replace(forward_times=scaled(problem.forward_times), backward_times=scaled(problem.backward_times),
                           weight_times=scaled(problem.weight_times), overlap_times=None)


def lower_bounds(problem: Problem, deadline: float = math.inf) -> LowerBounds:
    """All lower bounds of `problem` (see the module docstring), within `deadline`
    (`time.perf_counter()`) where one is given.

    The bounds on the op graph cost about GRAPH_SECONDS_PER_OP per op (networkx); when that does
    not fit before the deadline only the two that need no graph are computed (the longest
    microbatch's critical path, the busiest device's work) and `complete` is False. With
    recomputation allowed, or the bidirectional placement, the single-device bounds are 0 (see the
    module docstring). With one stage per device the
    device sequencing bound stops at the deadline, device by device (0 where it did not finish).
    With more, the single-device bounds share the time left before the deadline, at most
    RELAXATION_MAX_S: first the device sequencing (SEQUENCING_SHARE of it; 0 on a device that did
    not finish in its share), then the CP-SAT relaxations (`relaxation.device_relaxation`), each
    reporting the bound CP-SAT proved. The devices go in decreasing order of their preemptive
    one-machine bound, each with half of the phase's time left (the last with all of it), so a
    device done early leaves its time to the next; `complete` is False when some device had no
    time left. With overlapped pairs allowed, the bounds of `pair_relaxed(problem)`.
    """
    problem = pair_relaxed(problem)
    if time.perf_counter() + problem.num_ops * GRAPH_SECONDS_PER_OP > deadline:
        return LowerBounds(critical_path(problem), max(device_work(problem)), 0.0, 0.0, 0.0, complete=False)
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(graph)
    critical = max(heads[op] + graph.nodes[op]["duration"] + tails[op] for op in graph)
    per_device: list[list[tuple[float, float, float]]] = [[] for _ in range(problem.num_devices)]
    for op, data in graph.nodes(data=True):
        per_device[data["device"]].append((heads[op], data["duration"], tails[op]))
    device_load = [min(j[0] for j in jobs) + sum(j[1] for j in jobs) + min(j[2] for j in jobs) for jobs in per_device]
    load = max(device_load)
    preemptive = [jackson_preemptive(jobs) for jobs in per_device]
    one_machine = max(preemptive)
    lifetimes = activation_lifetimes(problem)
    memory = memory_bound(problem, lifetimes, device_load)
    sequencing = relaxed = 0.0
    if problem.mechanisms_matter or problem.bidirectional:  # the single-device bounds assume kept
        # activations in microbatch order, and every microbatch through every stage of the device
        return LowerBounds(critical, load, one_machine, memory, sequencing)
    if problem.chunks_per_device == 1:
        for device in range(problem.num_devices):
            if time.perf_counter() > deadline:
                return LowerBounds(critical, load, one_machine, memory, sequencing, complete=False)
            needed = max(critical, load, one_machine, memory, sequencing)
            sequencing = max(sequencing, device_sequencing(problem, device, heads, tails, needed, deadline))
        return LowerBounds(critical, load, one_machine, memory, sequencing, complete=time.perf_counter() <= deadline)
    until = min(time.perf_counter() + RELAXATION_MAX_S, deadline)
    # the device whose preemptive one-machine bound is highest first, with half of the time left: it
    # binds in most cases measured (V shapes at V-Min's memory: the last device; interleaved: the first;
    # not interleaved p = 8, memory 8, where device 0 binds with 819.7 and comes last, 735.1 preemptive)
    devices = sorted(range(problem.num_devices), key=lambda device: -preemptive[device])
    complete = True
    for share, method in ((SEQUENCING_SHARE, "sequencing"), (1.0, "relaxation")):
        ends = time.perf_counter() + share * (until - time.perf_counter())
        for turn, device in enumerate(devices):  # a device done early leaves its time to the rest
            seconds = (ends - time.perf_counter()) / min(2, problem.num_devices - turn)
            if seconds <= 0.01:
                complete = False
                break
            if method == "sequencing":
                needed = max(critical, load, one_machine, memory, sequencing)
                found = device_sequencing(problem, device, heads, tails, needed, time.perf_counter() + seconds)
                sequencing = max(sequencing, found)
            else:
                relaxed = max(relaxed, device_relaxation(problem, device, graph, heads, tails, seconds))
    return LowerBounds(critical, load, one_machine, memory, sequencing, relaxed, complete=complete)
