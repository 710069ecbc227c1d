"""Lower bounds from one device alone, without a solver: its ops on one machine with heads and tails
(preemptive, `jackson_preemptive`), and in sequence with the round trips of each microbatch's
chain and the memory limit (`device_sequencing`, a dynamic program)."""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Collection, Sequence
from typing import NamedTuple

from zbopt.core import interrupt
from zbopt.core.kinds import FORWARD, WEIGHT
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.tolerance import memory_ceiling

__all__ = ["chain_lags", "device_sequencing", "jackson_preemptive", "order_value"]


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


def chain_lags(problem: Problem, devices: int | Collection[int],
               durations: Sequence[float] | None = None) -> list[tuple[Op, Op, float]]:
    """(earlier op, later op, least time between the end of one and the start of the other) for
    consecutive ops of `devices` (one device, or a group) in each microbatch's dependency chain:
    the durations and latencies of the ops between them, which run on other devices.
    `durations` (per op, in `op_table` order) replaces the ops' own costs, e.g. by the least an
    op can take in an overlapped pair."""
    group = {devices} if isinstance(devices, int) else set(devices)
    table = op_table(problem)
    duration = table.duration if durations is None else durations
    lags = []
    for index in range(table.size):
        if table.device[index] not in group:
            continue
        gap, current = 0.0, index
        while True:
            gap += table.latency[current]
            source = table.predecessor[current]
            if source < 0:
                break
            if table.device[source] in group:
                lags.append((table.op(source), table.op(index), gap))
                break
            gap += duration[source]
            current = source
    return lags


def _chain(problem: Problem, device: int) -> list[tuple[str, int, float]]:
    """(kind, stage, lag) of the device's ops in one microbatch's dependency chain, in chain order
    (its forwards by stage, then its input backwards in reverse), each with the least time between
    the end of the one before it and its start (`chain_lags`; 0 for the first)."""
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

    0 for several iterations or microbatches that differ (its states count the ops done per kind
    and stage: run it on `Problem.uniform_relaxation`), 0 when one greedy order already reaches
    `needed` (the bound could not exceed it; this skips most devices of a long pipeline), and 0
    when `time.perf_counter()` passes `deadline` before the dynamic program ends.

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
    if problem.total_microbatches != problem.num_microbatches or not problem.microbatches_equal:
        return 0.0
    view = _device_view(problem, device, heads, tails)
    successors = _successors(view)
    start = (tuple(0 for _ in view.duration), (0.0, 0.0))
    upper = _one_order(successors, start, view.steps)
    if upper <= needed:
        return 0.0
    return _dynamic_program(view, successors, start, upper * (1 + 1e-9), deadline)


def order_value(problem: Problem, device: int, heads: dict[Op, float], tails: dict[Op, float]) -> float:
    """The objective of one order of `device`'s ops in `device_sequencing`'s relaxation (earliest
    start first), so at least that relaxation's optimum, and the single-device CP-SAT relaxation's
    (`cross_device` with the one device, whose constraints every such order meets): what a device's bounds can reach at
    most. Infinite where the order deadlocks, or with several iterations or microbatches that
    differ (not modelled here)."""
    if problem.total_microbatches != problem.num_microbatches or not problem.microbatches_equal:
        return math.inf
    view = _device_view(problem, device, heads, tails)
    return _one_order(_successors(view), (tuple(0 for _ in view.duration), (0.0, 0.0)), view.steps)


class _DeviceView(NamedTuple):
    """The device's ops as the dynamic program sees them: one position per kind and stage (its
    chain's `links` first, in chain order, then its W), and per position the lag after its chain
    predecessor, duration, heads and tails per microbatch, memory allocated and freed, the
    position whose count bounds its own (its chain predecessor, or for W its stage's B), and the
    order in which ties go (backwards, forwards, W)."""

    microbatches: int
    links: int
    lag: list[float]
    duration: list[float]
    heads: list[list[float]]
    tails: list[list[float]]
    allocates: list[float]
    frees: list[float]
    waits_for: list[int | None]
    order: list[int]
    limit: float

    @property
    def steps(self) -> int:
        return len(self.duration) * self.microbatches


def _device_view(problem: Problem, device: int, heads: dict[Op, float], tails: dict[Op, float]) -> _DeviceView:
    """`device`'s positions, read from the problem, its chain (`_chain`) and the heads and tails."""
    m = problem.num_microbatches
    chain = _chain(problem, device)
    links = len(chain)
    weights = [(WEIGHT, stage, 0.0) for stage in problem.stages_of_device[device]] if problem.split_backward else []
    positions = [(kind, stage) for kind, stage, _ in chain + weights]  # one per kind and stage of the device
    position = {pair: index for index, pair in enumerate(positions)}
    frees = [0.0] * len(positions)
    for stage in problem.stages_of_device[device]:
        for kind, amount in problem.releases(stage):
            frees[position[kind, stage]] = amount
    return _DeviceView(
        microbatches=m, links=links, lag=[lag for *_, lag in chain],
        duration=[problem.cost(kind, stage) for kind, stage in positions],
        heads=[[heads[Op(kind, stage, i)] for i in range(m)] for kind, stage in positions],
        tails=[[tails[Op(kind, stage, i)] for i in range(m)] for kind, stage in positions],
        allocates=[problem.activation_memory[stage] if kind == FORWARD else 0.0 for kind, stage in positions],
        frees=frees,
        waits_for=[None, *range(links - 1)] + [position[problem.kinds[1], stage] for _, stage, _ in weights],
        order=[*range(links - 1, -1, -1), *range(links, len(positions))],
        limit=memory_ceiling(problem.memory_caps[device]))


def _successors(view: _DeviceView):
    """successors(state, label): (start, rank, state, label) for each op that can run next, started
    as early as allowed. A label is (time, objective, releases...): the releases of chain position
    c's waiting ops (microbatches state[c] .. state[c-1]-1) in one flat run per position, in chain
    order."""
    m, links, lag, duration = view.microbatches, view.links, view.lag, view.duration
    op_heads, op_tails, allocates, frees = view.heads, view.tails, view.allocates, view.frees
    waits_for, order, limit = view.waits_for, view.order, view.limit

    def successors(state: tuple[int, ...], label: tuple[float, ...]):
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

    return successors


def _one_order(successors, start, steps: int) -> float:
    """The objective of one order (earliest start, then the tie order), infinite where it
    deadlocks: the dynamic program's result is at most it."""
    probe = start
    for _ in range(steps):
        options = list(successors(*probe))
        if not options:
            return math.inf
        probe = min(options)[2:]
    return probe[1][1]


def _dynamic_program(view: _DeviceView, successors, start, upper: float, deadline: float) -> float:
    """The least objective over the orders, state by state (see `device_sequencing`'s Notes); 0 past
    the deadline."""
    work = sum(view.duration) * view.microbatches
    layer = dict([start])
    for _ in range(view.steps):
        if interrupt.past(deadline):
            return 0.0
        following: dict[tuple[int, ...], tuple[float, ...]] = {}
        for state, label in layer.items():
            for _begin, _rank, reached, reached_label in successors(state, label):
                known = following.get(reached)
                following[reached] = reached_label if known is None else tuple(map(min, reached_label, known))
        # a state whose device time plus the work it has left passes one order's objective cannot be on
        # the best order's path (its labels there are at most that order's own): drop it
        layer = {state: label for state, label in following.items()
                 if label[0] + work - sum(map(operator.mul, state, view.duration)) <= upper}
    return layer[tuple(view.microbatches for _ in view.duration)][1]
