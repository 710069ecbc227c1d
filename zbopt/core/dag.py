"""The op DAG of a problem as a networkx graph (the dependencies `OpTable` defines, with each
op's duration, device and release), its longest paths, and the two measures every bound starts
from: the longest microbatch chain and each device's work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.problem.microbatches import EQUAL_MICROBATCHES

__all__ = ["critical_path", "device_work", "earliest_finish", "one_per_route", "op_graph"]

if TYPE_CHECKING:
    import networkx as nx  # imported where a graph is built: it takes some 0.4 s to load


def op_graph(problem: Problem) -> nx.DiGraph:
    """The op DAG of the ops every schedule runs (F, B, W or BW; no optional recompute).

    With iterations > 1 the weight-update barrier is spelled out edge by edge (m² edges per stage
    and iteration boundary), which is fine for the problem sizes a solver takes.

    Returns
    -------
    networkx.DiGraph : of `problem`'s ops (`OpTable`), with `duration` and `device` (and a forward
        waiting for FSDP's unshard, its `release`); edges carry `latency`.

    Examples
    --------
    Two stages, a fused backward: each microbatch's F0 -> F1 -> BW1 -> BW0, 4 ops and 3 edges:

    >>> from zbopt import Problem
    >>> graph = op_graph(Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2))
    >>> graph.number_of_nodes(), graph.number_of_edges(), [str(op) for op in graph.successors(Op("F", 0, 0))]
    (8, 6, ['1F0'])
    """
    import networkx as nx

    table = op_table(problem)
    graph = nx.DiGraph()
    for index in range(table.size):
        graph.add_node(table.op(index), duration=table.duration[index], device=table.device[index])
        if table.release[index]:
            graph.nodes[table.op(index)]["release"] = table.release[index]
    for index, source in enumerate(table.predecessor):
        if source >= 0:
            graph.add_edge(table.op(source), table.op(index), latency=table.latency[index])
        for other in table.same_device_inputs[index]:  # the table has no R or L: only slices
            graph.add_edge(table.op(other), table.op(index), latency=0.0)
    m = problem.num_microbatches
    for iteration in range(1, table.barrier_count + 1):
        for stage in range(problem.num_stages):
            for gradient in table.iteration_barrier(stage, iteration - 1):
                for microbatch in range(iteration * m, (iteration + 1) * m):
                    graph.add_edge(table.op(gradient), Op(FORWARD, stage, microbatch), latency=0.0)
    return graph


def earliest_finish(graph: nx.DiGraph) -> dict[Op, float]:
    """Finish time of every op when each starts as soon as its predecessors (plus latency) and its
    release allow, ignoring device contention: the longest path ending at that op (a "head" plus
    its duration)."""
    import networkx as nx

    finish: dict[Op, float] = {}
    for node in nx.topological_sort(graph):
        ready = max((finish[pred] + data["latency"] for pred, _, data in graph.in_edges(node, data=True)),
                    default=0.0)
        ready = max(ready, graph.nodes[node].get("release", 0.0))
        finish[node] = ready + graph.nodes[node]["duration"]
    return finish


def one_per_route(problem: Problem) -> Problem:
    """A copy with one microbatch on each route (`Problem.routes`), one iteration and no memory
    limit: what one microbatch's chain is computed on. Where microbatches differ (or are slices),
    of the uniform relaxation: each costs the least any does (rows that all agree: their value)."""
    return problem.uniform_relaxation().replace(num_microbatches=len(problem.routes), iterations=1,
                                                memory_limit=None, **EQUAL_MICROBATCHES)


def critical_path(problem: Problem) -> float:
    """Length of the longest microbatch's dependency chain, latencies included: a lower bound on
    any schedule's makespan. Computed on the DAG of `one_per_route`, or where microbatches
    differ on the whole DAG (every microbatch's chain).

    Returns
    -------
    float : the chain's length, in `problem`'s time unit.

    Examples
    --------
    One microbatch's F through 4 stages, then its backward back (F = 1, BW = 2): 4 · (1 + 2).

    >>> from zbopt import Problem
    >>> critical_path(Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2))
    12.0
    """
    return max(earliest_finish(op_graph(one_per_route(problem) if problem.microbatches_equal else problem)).values())


def device_work(problem: Problem) -> list[float]:
    """Per device, the total duration of its ops: another lower bound on the makespan.

    Returns
    -------
    list of float : per device, its ops' durations summed (no optional recompute or copy).

    Examples
    --------
    >>> from zbopt import Problem
    >>> device_work(Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2))
    [24.0, 24.0, 24.0, 24.0]
    """
    work = [0.0] * problem.num_devices
    for kind in problem.kinds:
        for stage in range(problem.num_stages):
            microbatches = problem.microbatches_of(stage)
            work[problem.device_of(stage)] += problem.cost(kind, stage) * len(microbatches) \
                if problem.microbatches_equal else sum(problem.cost(kind, stage, j) for j in microbatches)
    return work
