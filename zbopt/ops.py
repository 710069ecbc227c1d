"""Ops and their dependencies: the op DAG of a problem.

The dependencies are defined once, in `OpTable`; the networkx graph, the simulator and the
solvers all read them from there.

Within one microbatch j (S = number of virtual stages):
    F(s, j) -> F(s+1, j);  F(S-1, j) -> B(S-1, j);  B(s+1, j) -> B(s, j);  B(s, j) -> W(s, j)
    fused:  F(S-1, j) -> BW(S-1, j);  BW(s+1, j) -> BW(s, j)
A recomputed activation adds R(s, j) (same device): F(s, j) -> R(s, j) -> B(s, j) (or BW).
Every edge between ops on different devices carries the latency p2p_time.
Between iterations, with a flush (a weight update on each stage): every F(s, j) of iteration k+1
waits for every gradient op (W or BW) of stage s in iteration k; same device, so no latency.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import NamedTuple

import networkx as nx

from zbopt.errors import ScheduleError
from zbopt.problem import BACKWARD, FORWARD, FUSED_BACKWARD, RECOMPUTE, WEIGHT, Problem

_OP_PATTERN = re.compile(r"^\s*(\d+)(F|BW|B|W|R)(\d+)\s*$")


class Op(NamedTuple):
    """One unit of work: `kind` (F, B, W, BW or R) of virtual stage `stage` on microbatch `microbatch`.

    Its text form is "{stage}{kind}{microbatch}", as in torch.distributed.pipelining:

    >>> str(Op("B", 3, 1)), Op.from_str("3BW1")
    ('3B1', Op(kind='BW', stage=3, microbatch=1))
    """

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def from_str(cls, text: str) -> Op:
        """Parse "3F1" / "0BW12"; raises ScheduleError naming the text when it is not an op."""
        match = _OP_PATTERN.match(text) if isinstance(text, str) else None
        if match is None:
            raise ScheduleError(
                f"{text!r} is not an op: expected stage, kind (F, B, W, BW, R), microbatch, e.g. '3F1'")
        return cls(match.group(2), int(match.group(1)), int(match.group(3)))


class OpTable:
    """Every op of a problem numbered 0..N-1 with the flat arrays the simulator and solvers read.

    Index of Op(kind, s, j) = (kind_index · S + s) · M + j with M = m · iterations, so ops of one
    kind and stage are contiguous and in microbatch order. The recompute ops of the activations in
    `recomputed` ((stage, microbatch) pairs; a schedule's choice, empty by default) follow, in
    (stage, microbatch) order.
    """

    def __init__(self, problem: Problem, recomputed: frozenset[tuple[int, int]] = frozenset()):
        if recomputed and not problem.allow_recompute:
            stage, microbatch = min(recomputed)
            raise ScheduleError(f"op {Op(RECOMPUTE, stage, microbatch)}: recomputation is not allowed in this "
                                "problem (allow_recompute is false)")
        self.problem = problem
        self.kinds = problem.kinds
        self.num_stages = problem.num_stages
        self.num_microbatches = problem.total_microbatches
        self.core_size = problem.num_ops
        self.recomputed = tuple(sorted(recomputed))
        self.size = self.core_size + len(self.recomputed)
        self._kind_index = {kind: index for index, kind in enumerate(self.kinds)}
        self._recompute_index = {pair: self.core_size + k for k, pair in enumerate(self.recomputed)}

    def index(self, op: Op) -> int:
        """Number of `op`; raises ScheduleError when the op does not exist in this problem."""
        kind, stage, microbatch = op
        if not 0 <= stage < self.num_stages:
            raise ScheduleError(f"op {op}: stage {stage} out of range (the problem has {self.num_stages} stages)")
        if not 0 <= microbatch < self.num_microbatches:
            raise ScheduleError(
                f"op {op}: microbatch {microbatch} out of range (the problem has {self.num_microbatches})"
            )
        if kind == RECOMPUTE:
            index = self._recompute_index.get((stage, microbatch))
            if index is None:
                raise ScheduleError(f"op {op}: not among this table's recompute ops")
            return index
        kind_index = self._kind_index.get(kind)
        if kind_index is None:
            backward = "split (F, B, W)" if self.problem.split_backward else "fused (F, BW)"
            raise ScheduleError(f"op {op}: kind {kind} does not exist in this problem, whose backward is {backward}")
        return (kind_index * self.num_stages + stage) * self.num_microbatches + microbatch

    def op(self, index: int) -> Op:
        """Inverse of `index`."""
        if index >= self.core_size:
            return Op(RECOMPUTE, *self.recomputed[index - self.core_size])
        rest, microbatch = divmod(index, self.num_microbatches)
        kind_index, stage = divmod(rest, self.num_stages)
        return Op(self.kinds[kind_index], stage, microbatch)

    def ops(self) -> list[Op]:
        return [self.op(i) for i in range(self.size)]

    def _per_op(self, value_of) -> list:
        """A list over all ops of `value_of(kind, stage)`, built one (kind, stage) block at a time
        (then one value per recompute op)."""
        values: list = []
        for kind in self.kinds:
            for stage in range(self.num_stages):
                values.extend([value_of(kind, stage)] * self.num_microbatches)
        values.extend(value_of(RECOMPUTE, stage) for stage, _ in self.recomputed)
        return values

    @cached_property
    def kind(self) -> list[str]:
        return self._per_op(lambda kind, stage: kind)

    @cached_property
    def duration(self) -> list[float]:
        return self._per_op(self.problem.cost)

    @cached_property
    def device(self) -> list[int]:
        return self._per_op(lambda kind, stage: self.problem.device_of(stage))

    @cached_property
    def memory_delta(self) -> list[float]:
        """Per op, its memory change (`Problem.memory_delta`): a recomputed activation's F holds
        only the checkpoint."""
        deltas = self._per_op(self.problem.memory_delta)
        for stage, microbatch in self.recomputed:
            forward = self.index(Op(FORWARD, stage, microbatch))
            deltas[forward] = self.problem.memory_delta(FORWARD, stage, recomputed=True)
        return deltas

    @cached_property
    def allocates_at_start(self) -> list[bool]:
        """Per op, whether its memory change happens at its start (F, R) rather than its end."""
        return self._per_op(lambda kind, stage: kind in (FORWARD, RECOMPUTE))

    def _predecessor_stage_kind(self, kind: str, stage: int) -> tuple[str, int] | None:
        last = self.num_stages - 1
        if kind == RECOMPUTE:
            return (FORWARD, stage)
        if kind == FORWARD:
            return (FORWARD, stage - 1) if stage > 0 else None
        if kind in (BACKWARD, FUSED_BACKWARD):
            return (FORWARD, last) if stage == last else (kind, stage + 1)
        return (BACKWARD, stage)

    @cached_property
    def predecessor(self) -> list[int]:
        """Per op, the one op it directly depends on within its microbatch across stages (for R,
        its F), or -1."""
        result: list[int] = []
        for kind in self.kinds:
            for stage in range(self.num_stages):
                source = self._predecessor_stage_kind(kind, stage)
                if source is None:
                    result.extend([-1] * self.num_microbatches)
                else:
                    first = self.index(Op(source[0], source[1], 0))
                    result.extend(range(first, first + self.num_microbatches))
        result.extend(self.index(Op(FORWARD, stage, microbatch)) for stage, microbatch in self.recomputed)
        return result

    @cached_property
    def recompute_of(self) -> list[int]:
        """Per op, the recompute op it also waits for (same device, no latency): for the input
        gradient (B or BW) of a recomputed activation, its R; else -1."""
        result = [-1] * self.size
        backward = self.problem.input_gradient_kind
        for stage, microbatch in self.recomputed:
            result[self.index(Op(backward, stage, microbatch))] = self.index(Op(RECOMPUTE, stage, microbatch))
        return result

    @cached_property
    def latency(self) -> list[float]:
        """Per op, the latency on its edge from `predecessor` (0 when on the same device)."""
        problem = self.problem

        def edge_latency(kind: str, stage: int) -> float:
            source = self._predecessor_stage_kind(kind, stage)
            if source is None or problem.device_of(source[1]) == problem.device_of(stage):
                return 0.0
            return problem.p2p_time

        return self._per_op(edge_latency)

    @property
    def barrier_count(self) -> int:
        """Weight-update barriers per stage: iterations - 1 with a flush, none without."""
        return self.problem.iterations - 1 if self.problem.flush else 0

    @property
    def gradient_kind(self) -> str:
        """The op that finishes a stage's weight gradient: W when split, BW when fused."""
        return WEIGHT if self.problem.split_backward else FUSED_BACKWARD

    def iteration_barrier(self, stage: int, iteration: int) -> range:
        """Indices of the gradient ops of `stage` in `iteration`: the next iteration's forwards on
        that stage wait for all of them."""
        m = self.problem.num_microbatches
        first = self.index(Op(self.gradient_kind, stage, iteration * m))
        return range(first, first + m)


def op_graph(problem: Problem) -> nx.DiGraph:
    """The op DAG of the ops every schedule runs (F, B, W or BW; no optional recompute): nodes are
    Ops with `duration` and `device`; edges carry `latency`.

    With iterations > 1 the weight-update barrier is spelled out edge by edge (m² edges per stage
    and iteration boundary), which is fine for the problem sizes a solver takes.
    """
    table = OpTable(problem)
    graph = nx.DiGraph()
    for index in range(table.size):
        graph.add_node(table.op(index), duration=table.duration[index], device=table.device[index])
    for index, source in enumerate(table.predecessor):
        if source >= 0:
            graph.add_edge(table.op(source), table.op(index), latency=table.latency[index])
    m = problem.num_microbatches
    for iteration in range(1, table.barrier_count + 1):
        for stage in range(problem.num_stages):
            for gradient in table.iteration_barrier(stage, iteration - 1):
                for microbatch in range(iteration * m, (iteration + 1) * m):
                    graph.add_edge(table.op(gradient), Op(FORWARD, stage, microbatch), latency=0.0)
    return graph


def earliest_finish(graph: nx.DiGraph) -> dict[Op, float]:
    """Finish time of every op when each starts as soon as its predecessors (plus latency) allow,
    ignoring device contention: the longest path ending at that op (a "head" plus its duration)."""
    finish: dict[Op, float] = {}
    for node in nx.topological_sort(graph):
        ready = max((finish[pred] + data["latency"] for pred, _, data in graph.in_edges(node, data=True)), default=0.0)
        finish[node] = ready + graph.nodes[node]["duration"]
    return finish


def critical_path(problem: Problem) -> float:
    """Length of one microbatch's dependency chain, latencies included: a lower bound on any
    schedule's makespan. Computed on the DAG of a one-microbatch, one-iteration copy."""
    single = problem.replace(num_microbatches=1, iterations=1, memory_limit=None)
    return max(earliest_finish(op_graph(single)).values())


def device_work(problem: Problem) -> list[float]:
    """Per device, the total duration of its ops: another lower bound on the makespan."""
    table = OpTable(problem)
    work = [0.0] * problem.num_devices
    for kind in problem.kinds:
        for stage in range(problem.num_stages):
            work[problem.device_of(stage)] += problem.cost(kind, stage) * table.num_microbatches
    return work
