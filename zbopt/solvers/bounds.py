"""Lower bounds on the makespan of any valid schedule, computed apart from every solver.

Each bound is a relaxation of the scheduling problem, so each is <= the optimum; the solvers'
answers are checked against them and `lower_bound` reports the best.

- critical path: the longest chain of dependencies and latencies (in the implied graph, below);
- device load: per device, the earliest any of its ops can start + its total work + the least
  time any of its ops still needs after it ends;
- one-machine (Jackson) relaxation: per device, its ops with heads (earliest start) and tails
  (time still needed after the op ends) on one machine, preemption allowed; the preemptive
  largest-tail-first schedule is optimal for that relaxation (Jackson's rule, Horn 1974);
- memory: activations held on a device integrate over time to at least m · Σ_s M · lifetime(s),
  where lifetime is the shortest time from a forward's start to the end of the op that frees it;
  the device can hold at most its limit at any moment, so makespan >= integral / limit.

Heads and tails come from `implied_graph`: the op DAG plus the precedences that every schedule
with ops of one kind and stage in microbatch order obeys (same-device order, and the memory
precedences of `memory_precedences`). Some optimal schedule has that order (see the CP-SAT
module), so bounds computed on the implied graph still bound the optimum.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import networkx as nx

from zbopt.ops import Op, earliest_finish, op_graph
from zbopt.problem import BACKWARD, FORWARD, WEIGHT, Problem


@dataclass(frozen=True)
class LowerBounds:
    """Every bound (problem units) and the best of them."""

    critical_path: float
    device_load: float
    one_machine: float
    memory: float

    @property
    def best(self) -> float:
        return max(self.critical_path, self.device_load, self.one_machine, self.memory)

    def as_dict(self) -> dict[str, float]:
        return {"critical_path": self.critical_path, "device_load": self.device_load,
                "one_machine": self.one_machine, "memory": self.memory, "best": self.best}


def _same_order_group(problem: Problem, microbatch: int, other: int) -> bool:
    """Whether symmetry breaking orders the two microbatches: within an iteration when iterations
    are separated by a flush, across all of them otherwise."""
    m = problem.num_microbatches
    return not problem.flush or microbatch // m == other // m


def symmetric_successors(problem: Problem, ops) -> list[tuple[Op, Op]]:
    """Pairs (op, the same kind and stage on the next microbatch) that symmetry breaking orders."""
    present = set(ops)
    return [(op, following) for op in ops
            if (following := Op(op.kind, op.stage, op.microbatch + 1)) in present
            and _same_order_group(problem, op.microbatch, following.microbatch)]


def memory_precedences(problem: Problem, ops) -> list[tuple[Op, Op]]:
    """Pairs (gradient op, forward) where the gradient op must end before the forward starts, in
    every valid schedule whose ops of one kind and stage run in microbatch order.

    On a device with limit L, if B(s, i) (or BW) has not ended when F(s, i+k) starts, then B(s, j)
    has not ended for any j >= i, so microbatches i..i+k of stage s all hold their activation M_B:
    too much once (k+1)·M_B > L. If W(s, i) has not ended, they hold at least M_W each and the new
    one M_B: too much once k·M_W + M_B > L. Each k is rounded up (a larger k is a weaker claim).
    """
    if problem.memory_limit is None:
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
        else:
            distance = math.floor(limit / activation + 1e-9)
        forward = Op(FORWARD, op.stage, op.microbatch + distance)
        if forward in present and _same_order_group(problem, op.microbatch, forward.microbatch):
            pairs.append((op, forward))
    return pairs


def memory_disjunctions(problem: Problem, ops) -> list[tuple[Op, Op, Op]]:
    """Triples (B(s, j), W(s, i), F(s, n)), i < j < n, where at least one of the first two must end
    before the forward starts, in every valid microbatch-ordered schedule with a split backward.

    Were neither ended, microbatches j..n of stage s would hold M_B each and i..j-1 at least M_W
    each: too much once (n-j+1)·M_B + (j-i)·M_W > L. For each j the latest such i is given (the
    strongest claim); j = n - k with (k+1)·M_B > L is a memory precedence instead.
    """
    if problem.memory_limit is None or not problem.split_backward:
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
    are (head, duration, tail). This is the optimum of 1 | r_j, pmtn | max(C_j + q_j).

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


def _activation_lifetimes(problem: Problem) -> list[tuple[float, float]]:
    """Per stage, the least time from F(s) start to the end of B(s) and of W(s) (or BW(s))."""
    single = problem.replace(num_microbatches=1, iterations=1, memory_limit=None)
    graph = op_graph(single)
    lifetimes = []
    for stage in range(problem.num_stages):
        forward = Op(FORWARD, stage, 0)
        finish = earliest_finish(graph.subgraph(nx.descendants(graph, forward) | {forward}))
        frees = [op for op in finish if op.stage == stage and op.kind != FORWARD]
        by_kind = {op.kind: finish[op] for op in frees}
        input_end = by_kind.get("B", by_kind.get("BW"))
        lifetimes.append((input_end, by_kind.get("W", input_end)))
    return lifetimes


def memory_bound(problem: Problem) -> float:
    """makespan >= (memory-time every device must integrate) / (its memory limit); 0 without limits."""
    if problem.memory_limit is None:
        return 0.0
    lifetimes = _activation_lifetimes(problem)
    best = 0.0
    for device, stages in enumerate(problem.stages_of_device):
        integral = 0.0
        for stage in stages:
            activation = problem.activation_memory[stage]
            kept = problem.weight_memory[stage] if problem.split_backward else 0.0
            to_input, to_weight = lifetimes[stage]
            integral += (activation - kept) * to_input + kept * to_weight
        best = max(best, problem.total_microbatches * integral / problem.memory_limit[device])
    return best


def lower_bounds(problem: Problem) -> LowerBounds:
    """All lower bounds of `problem` (see the module docstring)."""
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(graph)
    critical = max(heads[op] + graph.nodes[op]["duration"] + tails[op] for op in graph)
    per_device: list[list[tuple[float, float, float]]] = [[] for _ in range(problem.num_devices)]
    for op, data in graph.nodes(data=True):
        per_device[data["device"]].append((heads[op], data["duration"], tails[op]))
    load = max(min(j[0] for j in jobs) + sum(j[1] for j in jobs) + min(j[2] for j in jobs) for jobs in per_device)
    one_machine = max(jackson_preemptive(jobs) for jobs in per_device)
    return LowerBounds(critical, load, one_machine, memory_bound(problem))
