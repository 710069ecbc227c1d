"""The implied graph: the op DAG plus the precedences every schedule with ops of one kind and stage
in microbatch order obeys, read by the CP-SAT model, the MILP and the lower bounds. Where
microbatches differ, the order is only among equal ones (`order_runs`).

Some optimal schedule has that order (see `full_model`'s Notes): same-device order per kind and
stage (`symmetric_successors`), and the memory precedences and disjunctions that the memory limit
then forces (`memory_precedences`, `memory_disjunctions`). Heads (earliest starts) and tails (the
time still needed after an op ends) are read from it (`heads_and_tails`).
"""

from __future__ import annotations

import math

import networkx as nx

from zbopt.core.dag import earliest_finish, op_graph
from zbopt.core.kinds import BACKWARD, FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem

__all__ = ["heads_and_tails", "implied_graph", "memory_disjunctions", "memory_precedences", "order_runs",
           "symmetric_successors"]


def order_runs(problem: Problem) -> dict[int, tuple[tuple[int, ...], int]]:
    """Per microbatch, (the microbatches symmetry breaking orders with it, in increasing order;
    its place among them): those of its class of equal microbatches (`Problem.microbatch_classes`,
    all of them where microbatches cost the same) on its route, within its iteration when
    iterations are separated by a flush, across all of them otherwise."""
    m, classes = problem.num_microbatches, problem.microbatch_classes
    runs: dict[tuple[int, int, int], list[int]] = {}
    for route, (_, microbatches) in enumerate(problem.routes):
        for microbatch in microbatches:
            group = microbatch // m if problem.flush else 0
            runs.setdefault((route, group, classes[microbatch % m]), []).append(microbatch)
    return {microbatch: (tuple(run), place) for run in runs.values() for place, microbatch in enumerate(run)}


def _later(runs: dict[int, tuple[tuple[int, ...], int]], microbatch: int, distance: int) -> int | None:
    """The microbatch `distance` places after `microbatch` in its run (`order_runs`), or None."""
    run, place = runs[microbatch]
    return run[place + distance] if place + distance < len(run) else None


def symmetric_successors(problem: Problem, ops) -> list[tuple[Op, Op]]:
    """Pairs (op, the same kind and stage on the next microbatch of its run, `order_runs`) that
    symmetry breaking orders: only equal microbatches are interchangeable.

    Where the columns are not interchangeable (`Problem.columns_interchangeable`: recomputation,
    offload or overlapped pairs allowed), only the forwards of each route's first stage:
    relabelling each column apart is no longer a symmetry, relabelling whole microbatches of one
    route (and one class) still is, and sorts one column. None with sequence slices: a slice is
    tied to its sequence, and a sequence's slices may interleave with another's."""
    if problem.sequence_slices > 1:
        return []
    present = set(ops)
    runs = order_runs(problem)
    firsts = {stages[0] for stages, _ in problem.routes}
    pairs = []
    for op in ops:
        if not (problem.columns_interchangeable or (op.kind == FORWARD and op.stage in firsts)):
            continue
        later = _later(runs, op.microbatch, 1)
        if later is not None and (following := Op(op.kind, op.stage, later)) in present:
            pairs.append((op, following))
    return pairs


def memory_precedences(problem: Problem, ops) -> list[tuple[Op, Op]]:
    """Pairs (gradient op, forward) where the gradient op must end before the forward starts, in
    every valid schedule whose ops of one kind and stage run in the order of `order_runs`.

    Notes
    -----
    M_B is a microbatch's activation memory on stage s and M_W the part of it that W keeps after
    B, as in Table 1 of the Zero Bubble paper [1]_. On a device with limit L, if B(s, i) (or BW)
    has not ended when F(s, i+k) starts (i+k the k-th microbatch after i in its run of equal
    microbatches), then B(s, j) has not ended for any j of the run from i on, so microbatches
    i..i+k of the run all hold their activation M_B: too much once (k+1)·M_B > L (the other
    microbatches hold >= 0). If W(s, i) has not ended, they hold at least M_W each and the new one
    M_B: too much once k·M_W + M_B > L. Each k is rounded up (a larger k is a weaker claim).

    References
    ----------
    .. [1] Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Table 1.

    None where the columns are not in microbatch order (`symmetric_successors`).
    """
    if problem.memory_limit is None or not problem.columns_interchangeable:
        return []
    present = set(ops)
    runs = order_runs(problem)
    pairs = []
    for op in ops:
        if op.kind == FORWARD:
            continue
        limit = problem.memory_limit[problem.device_of(op.stage)]
        activation = problem.memory_delta(FORWARD, op.stage, microbatch=op.microbatch)
        if op.kind == WEIGHT:
            kept = -problem.memory_delta(WEIGHT, op.stage, microbatch=op.microbatch)
            if kept <= 0:
                continue
            distance = math.floor((limit - activation) / kept + 1e-9) + 1
        elif activation > 0:
            distance = math.floor(limit / activation + 1e-9)
        else:
            continue  # a stage that holds nothing never fills the memory
        later = _later(runs, op.microbatch, distance)
        if later is not None and (forward := Op(FORWARD, op.stage, later)) in present:
            pairs.append((op, forward))
    return pairs


def memory_disjunctions(problem: Problem, ops) -> list[tuple[Op, Op, Op]]:
    """Triples (B(s, j), W(s, i), F(s, n)), i < j < n in one run (`order_runs`), where at least one
    of the first two must end before the forward starts, in every valid schedule in that order
    with a split backward.

    Notes
    -----
    The reasoning of `memory_precedences`, counted in places of the run: were neither ended,
    microbatches j..n would hold M_B each and i..j-1 at least M_W each: too much once
    (n-j+1)·M_B + (j-i)·M_W > L. For each j the latest such i is given (the strongest claim);
    j = n - k with (k+1)·M_B > L is a memory precedence instead. None where the columns are not in
    microbatch order (`memory_precedences`).
    """
    if problem.memory_limit is None or not problem.split_backward or not problem.columns_interchangeable:
        return []
    present = set(ops)
    runs = order_runs(problem)
    triples = []
    for forward in ops:
        if forward.kind != FORWARD:
            continue
        stage = forward.stage
        kept = -problem.memory_delta(WEIGHT, stage, microbatch=forward.microbatch)
        if kept <= 0:
            continue
        limit = problem.memory_limit[problem.device_of(stage)]
        activation = problem.memory_delta(FORWARD, stage, microbatch=forward.microbatch)
        run, newest = runs[forward.microbatch]
        for pending in range(newest - 1, -1, -1):
            room = limit - (newest - pending + 1) * activation
            if room < 0:
                break
            oldest = pending - math.floor(room / kept + 1e-9) - 1
            if oldest >= 0 and (weight := Op(WEIGHT, stage, run[oldest])) in present:
                triples.append((Op(BACKWARD, stage, run[pending]), weight, forward))
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
