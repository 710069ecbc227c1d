"""Ops and their dependencies: the op DAG of a problem.

The dependencies are defined once, in `OpTable`; the networkx graph, the simulator and the
solvers all read them from there.

Within one microbatch j (S = number of virtual stages):
    F(s, j) -> F(s+1, j);  F(S-1, j) -> B(S-1, j);  B(s+1, j) -> B(s, j);  B(s, j) -> W(s, j)
    fused:  F(S-1, j) -> BW(S-1, j);  BW(s+1, j) -> BW(s, j)
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
from zbopt.problem import BACKWARD, FORWARD, FUSED_BACKWARD, WEIGHT, Problem

_OP_PATTERN = re.compile(r"^\s*(\d+)(F|BW|B|W)(\d+)\s*$")


class Op(NamedTuple):
    """One unit of work: `kind` (F, B, W or BW) of virtual stage `stage` on microbatch `microbatch`.

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
            raise ScheduleError(f"{text!r} is not an op: expected stage, kind (F, B, W, BW), microbatch, e.g. '3F1'")
        return cls(match.group(2), int(match.group(1)), int(match.group(3)))


class OpTable:
    """Every op of a problem numbered 0..N-1 with the flat arrays the simulator and solvers read.

    Index of Op(kind, s, j) = (kind_index · S + s) · M + j with M = m · iterations, so ops of one
    kind and stage are contiguous and in microbatch order.
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        self.kinds = problem.kinds
        self.num_stages = problem.num_stages
        self.num_microbatches = problem.total_microbatches
        self.size = problem.num_ops
        self._kind_index = {kind: index for index, kind in enumerate(self.kinds)}

    def index(self, op: Op) -> int:
        """Number of `op`; raises ScheduleError when the op does not exist in this problem."""
        kind, stage, microbatch = op
        kind_index = self._kind_index.get(kind)
        if kind_index is None:
            backward = "split (F, B, W)" if self.problem.split_backward else "fused (F, BW)"
            raise ScheduleError(f"op {op}: kind {kind} does not exist in this problem, whose backward is {backward}")
        if not 0 <= stage < self.num_stages:
            raise ScheduleError(f"op {op}: stage {stage} out of range (the problem has {self.num_stages} stages)")
        if not 0 <= microbatch < self.num_microbatches:
            raise ScheduleError(
                f"op {op}: microbatch {microbatch} out of range (the problem has {self.num_microbatches})"
            )
        return (kind_index * self.num_stages + stage) * self.num_microbatches + microbatch

    def op(self, index: int) -> Op:
        """Inverse of `index`."""
        rest, microbatch = divmod(index, self.num_microbatches)
        kind_index, stage = divmod(rest, self.num_stages)
        return Op(self.kinds[kind_index], stage, microbatch)

    def ops(self) -> list[Op]:
        return [self.op(i) for i in range(self.size)]

    def _per_op(self, value_of) -> list:
        """A list over all ops of `value_of(kind, stage)`, built one (kind, stage) block at a time."""
        values: list = []
        for kind in self.kinds:
            for stage in range(self.num_stages):
                values.extend([value_of(kind, stage)] * self.num_microbatches)
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
        return self._per_op(self.problem.memory_delta)

    def _predecessor_stage_kind(self, kind: str, stage: int) -> tuple[str, int] | None:
        last = self.num_stages - 1
        if kind == FORWARD:
            return (FORWARD, stage - 1) if stage > 0 else None
        if kind in (BACKWARD, FUSED_BACKWARD):
            return (FORWARD, last) if stage == last else (kind, stage + 1)
        return (BACKWARD, stage)

    @cached_property
    def predecessor(self) -> list[int]:
        """Per op, the one op it directly depends on within its microbatch, or -1."""
        result: list[int] = []
        for kind in self.kinds:
            for stage in range(self.num_stages):
                source = self._predecessor_stage_kind(kind, stage)
                if source is None:
                    result.extend([-1] * self.num_microbatches)
                else:
                    first = self.index(Op(source[0], source[1], 0))
                    result.extend(range(first, first + self.num_microbatches))
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
    """The op DAG: nodes are Ops with `duration` and `device`; edges carry `latency`.

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
