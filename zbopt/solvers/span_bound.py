"""A lower bound on the span objective: the longest per-device span (a device's last end less its
first start), which heads and tails do not bound, being absolute times.

What does bound a span is relative: the least time between two ops, through the implied graph.
Measured from device d's first start, an op has a relative head (its least lag after whichever op
of d is first) and a relative tail (the least time from its end to the end of whichever op of d
is last). With those in place of heads and tails, a one-machine bound on any device's ops
(`sequencing.jackson_preemptive`) bounds d's span: device e busy between d's first and last op
(say, the last device between the first device's first forward and its last W) lengthens d's
span. On d's own ops the single-device bounds on the makespan (`sequencing.device_sequencing`,
`cross_device.cross_device_bound` of the device alone) do too.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import networkx as nx

from zbopt.core import interrupt
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.solvers.cross_device import cross_device_bound
from zbopt.solvers.implied import implied_graph
from zbopt.solvers.pair_relaxation import pair_relaxed
from zbopt.solvers.sequencing import device_sequencing, jackson_preemptive

__all__ = ["RELAXATION_MAX_S", "RELAXATION_SHARE", "device_span", "relative_heads_and_tails", "span_bound"]

RELAXATION_SHARE = 0.5  # of the time left, for the CP-SAT relaxations (v >= 2) after the dynamic programs
RELAXATION_MAX_S = 10.0  # per device


def span_bound(problem: Problem, deadline: float = math.inf, graph: nx.DiGraph | None = None) -> float:
    """A lower bound on the longest device span of any valid schedule of `problem`, within
    `deadline` (`interrupt.now()`); `graph` is `implied_graph(pair_relaxed(problem))` where
    the caller has it. At least the busiest device's work.

    Notes
    -----
    Per device d, heads and tails relative to d (`relative_heads_and_tails`) in the preemptive
    one-machine bound of every device's ops that have both; then (where the single-device bounds
    hold: every activation kept, one route through every stage, one iteration) in the device
    sequencing dynamic program on d's ops and, with several stages per device, in the CP-SAT
    single-device relaxation, the devices in decreasing order of their bound so far, until the
    deadline. Every valid schedule, shifted so that d's first op starts at 0 and restricted to one
    device, satisfies all that those bounds assume, and d's span is at least max(end + relative
    tail) over any op: so each bounds the span. With overlapped pairs, those of
    `pair_relaxed(problem)` (it keeps every start and ends no op later, so no span grows). The
    symmetry the implied graph assumes (ops of one kind and stage in microbatch order) keeps every
    device's set of start and end times, so its span.
    """
    problem = pair_relaxed(problem)
    graph = implied_graph(problem) if graph is None else graph
    walk = _Walk.of(graph)
    own: list[tuple[dict[Op, float], dict[Op, float]]] = []  # per device, its own ops' relative heads and tails
    bound = [0.0] * problem.num_devices
    for device in range(problem.num_devices):
        bound[device], heads, tails = _preemptive_span(walk, device, problem.num_devices)
        own.append(({op: heads[op] for op in heads if walk.device[op] == device},
                     {op: tails[op] for op in tails if walk.device[op] == device}))
        if interrupt.past(deadline):
            return max(bound)
    if problem.mechanisms_matter or problem.bidirectional:
        return max(bound)
    return _single_device_bounds(problem, graph, own, bound, deadline)


def device_span(problem: Problem, device: int) -> float:
    """A lower bound on `device`'s span alone in any valid schedule of `problem` (the preemptive
    one-machine bound of every device's ops with heads and tails relative to it, as in
    `span_bound`): how long the device is held between its first start and its last end."""
    return _preemptive_span(_Walk.of(implied_graph(pair_relaxed(problem))), device, problem.num_devices)[0]


def _preemptive_span(walk: _Walk, device: int, devices: int) -> tuple[float, dict[Op, float], dict[Op, float]]:
    """(the bound on `device`'s span, the relative heads, the relative tails): per device the
    preemptive one-machine bound of its ops that have both, the best of them."""
    heads, tails = relative_heads_and_tails(walk, device)
    jobs: list[list[tuple[float, float, float]]] = [[] for _ in range(devices)]
    for op, head in heads.items():
        if op in tails:
            jobs[walk.device[op]].append((head, walk.duration[op], tails[op]))
    return max(jackson_preemptive(found) for found in jobs if found), heads, tails


def _single_device_bounds(problem: Problem, graph: nx.DiGraph, own: list, bound: list[float],
                          deadline: float) -> float:
    """The best of `bound` and, per device (the highest first), the device sequencing and CP-SAT
    relaxation with its own relative heads and tails `own`, until the deadline."""
    best = max(bound)
    devices = sorted(range(problem.num_devices), key=lambda device: -bound[device])
    for device in devices:
        if interrupt.past(deadline):
            return best
        best = max(best, device_sequencing(problem, device, *own[device], best, deadline))
    if problem.chunks_per_device == 1:
        return best
    until = interrupt.now() + RELAXATION_SHARE * (deadline - interrupt.now())
    for turn, device in enumerate(devices):
        seconds = min(until - interrupt.now(), interrupt.span(RELAXATION_MAX_S)) / min(2, problem.num_devices - turn)
        if seconds <= 0.01 or interrupt.requested.is_set():
            break
        best = max(best, cross_device_bound(problem, (device,), graph, *own[device], seconds, floor=best))
    return best


class _Walk(NamedTuple):
    """The graph as the longest-path walks read it: a topological order, each op's position, device
    and duration, and per op the devices of its ancestors and of its descendants (bit sets)."""

    graph: nx.DiGraph
    order: list[Op]
    position: dict[Op, int]
    device: dict[Op, int]
    duration: dict[Op, float]
    ancestors: dict[Op, int]
    descendants: dict[Op, int]

    @classmethod
    def of(cls, graph: nx.DiGraph) -> _Walk:
        order = list(nx.topological_sort(graph))
        device = {op: graph.nodes[op]["device"] for op in order}
        duration = {op: graph.nodes[op]["duration"] for op in order}
        return cls(graph, order, {op: index for index, op in enumerate(order)}, device, duration,
                   _devices_around(order, graph.predecessors, device),
                   _devices_around(order[::-1], graph.successors, device))


def relative_heads_and_tails(walk: _Walk, device: int) -> tuple[dict[Op, float], dict[Op, float]]:
    """Relative to `device`: the least start of each op after the device's first start, and the
    least time from each op's end to the device's last end, for the ops that have one.

    Notes
    -----
    The device's first op has no ancestor on the device (an ancestor starts earlier): a `first`
    candidate. An op o starts at least L(a, o) after candidate a, L the longest path from a's
    start to o's start; not knowing which candidate is first, o's relative head is the least of
    these, and it has none when some candidate does not reach it, unless it is on the device
    (then it starts at 0 at the earliest). Tails the same way, from o's end to the end of each op
    with no descendant on the device.
    """
    mine = [op for op in walk.order if walk.device[op] == device]
    bit = 1 << device
    heads = _least_over(walk, [op for op in mine if not walk.ancestors[op] & bit], forward=True)
    tails = _least_over(walk, [op for op in mine if not walk.descendants[op] & bit], forward=False)
    for op in mine:
        heads[op] = max(0.0, heads.get(op, 0.0))
        tails[op] = max(0.0, tails.get(op, 0.0))
    return heads, tails


def _least_over(walk: _Walk, sources: list[Op], forward: bool) -> dict[Op, float]:
    """Per op reached from every one of `sources`, the least over them of the longest path
    (`_longest_from`)."""
    least: dict[Op, float] | None = None
    for source in sources:
        lag = _longest_from(walk, source, forward)
        least = lag if least is None else {op: min(value, lag[op]) for op, value in least.items() if op in lag}
    return least or {}


def _devices_around(order: list[Op], neighbours, device: dict[Op, int]) -> dict[Op, int]:
    """Per op, the devices of its ancestors (`order` topological, `neighbours` the predecessors) or
    of its descendants (reversed, the successors), as a bit set."""
    found: dict[Op, int] = {}
    for op in order:
        bits = 0
        for other in neighbours(op):
            bits |= found[other] | 1 << device[other]
        found[op] = bits
    return found


def _longest_from(walk: _Walk, source: Op, forward: bool) -> dict[Op, float]:
    """forward: the longest path from `source`'s start to each descendant's start; else from each
    ancestor's end to `source`'s end."""
    graph, duration = walk.graph, walk.duration
    lag = {source: 0.0}
    at = walk.position[source]
    for op in walk.order[at:] if forward else walk.order[at::-1]:
        if op not in lag:
            continue
        if forward:
            for nxt in graph.successors(op):
                value = lag[op] + duration[op] + graph.edges[op, nxt]["latency"]
                if value > lag.get(nxt, -math.inf):
                    lag[nxt] = value
        else:
            for previous in graph.predecessors(op):
                value = lag[op] + duration[op] + graph.edges[previous, op]["latency"]
                if value > lag.get(previous, -math.inf):
                    lag[previous] = value
    return lag
