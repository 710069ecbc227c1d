"""The implied graph: the op DAG plus the precedences every schedule with ops of one kind and stage
in microbatch order obeys, read by the CP-SAT model, the MILP and the lower bounds.

Some optimal schedule has that order (see `full_model`'s Notes): same-device order per kind and
stage (`symmetric_successors`), and the memory precedences and disjunctions that the memory limit
then forces (`memory_precedences`, `memory_disjunctions`). Heads (earliest starts) and tails (the
time still needed after an op ends) are read from it (`heads_and_tails`).
"""

from __future__ import annotations

import math

import networkx as nx

from zbopt.kinds import BACKWARD, FORWARD, WEIGHT
from zbopt.ops import Op, earliest_finish, op_graph
from zbopt.problem import Problem


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
    route still is, and sorts one column. None with sequence slices: a slice is tied to its
    sequence, and a sequence's slices may interleave with another's."""
    if problem.sequence_slices > 1:
        return []
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
