"""Ops and their dependencies: every op of a problem numbered, with its duration, device and inputs.

The dependencies are defined once, in `OpTable`; the networkx graph (`zbopt.core.dag`), the
simulator and the solvers all read them from there.

Within one microbatch j, through the stages a..z of its route (`Problem.routes`: all S virtual
stages, or with the bidirectional placement half of them, one way):
    F(s, j) -> F(s+1, j);  F(z, j) -> B(z, j);  B(s+1, j) -> B(s, j);  B(s, j) -> W(s, j)
    fused:  F(z, j) -> BW(z, j);  BW(s+1, j) -> BW(s, j)
A recomputed activation adds R(s, j) (same device): F(s, j) -> R(s, j) -> B(s, j) (or BW).
Sequence slices (`zbopt.core.problem.slices`) add, on one stage, F(s, j-1) -> F(s, j) and B(s, j+1) -> B(s, j)
(or BW) between slices j-1, j, j+1 of one sequence.
An offloaded one adds O(s, j) and L(s, j) on the device's copy lanes: F(s, j) -> O(s, j) -> L(s, j)
-> B(s, j) (or BW).
A stage resharded after its forwards in iteration k (`allow_reshard`) adds G(s, k·m) on the device's
all-gather lane: every F(s, j) of iteration k -> G(s, k·m) -> every B(s, j) (or BW) and R(s, j) of it.
Every edge between ops on different devices carries the latency p2p_time.
With FSDP's unshards (the iteration's ends), a forward is released no sooner than its stage's unshard ends.
Between iterations, with a flush (a weight update on each stage): every F(s, j) of iteration k+1
waits for every gradient op (W or BW) of stage s in iteration k; same device, so no latency.
"""

from __future__ import annotations

import re
from functools import cached_property, lru_cache
from typing import NamedTuple

from zbopt.core.errors import ScheduleError, shorten
from zbopt.core.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, KINDS, OFFLOAD, RECOMPUTE, REGATHER, RELOAD
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshard_windows, unshards_done
from zbopt.core.problem.slices import neighbour

__all__ = ["COMPUTE_LANE", "GATHER_LANE", "LANE_OF_KIND", "OFFLOAD_LANE", "RELOAD_LANE", "Op", "OpTable", "op_table"]

# the longest letters first, so that "BW" is not read as "B"
_OP_PATTERN = re.compile(rf"^\s*(\d+)({'|'.join(sorted(KINDS, key=len, reverse=True))})(\d+)\s*$")
# Where an op runs on its device: compute, or beside it one of the two copy lanes or the all-gather lane.
COMPUTE_LANE, OFFLOAD_LANE, RELOAD_LANE, GATHER_LANE = 0, 1, 2, 3
LANE_OF_KIND = {OFFLOAD: OFFLOAD_LANE, RELOAD: RELOAD_LANE, REGATHER: GATHER_LANE}
_OPTIONAL_KINDS = (RECOMPUTE, OFFLOAD, RELOAD, REGATHER)  # a schedule's choice, numbered after the problem's ops


class Op(NamedTuple):
    """One unit of work: `kind` (F, B, W, BW, R, O, L or G) of virtual stage `stage` on microbatch `microbatch`
    (for G, the first microbatch of its iteration).

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
                f"{shorten(text)} is not an op: expected stage, kind ({', '.join(KINDS)}), microbatch, e.g. '3F1'")
        return cls(match.group(2), int(match.group(1)), int(match.group(3)))


class OpTable:
    """Every op of a problem numbered 0..N-1 with the flat arrays the simulator and solvers read.

    Index of Op(kind, s, j) = (kind_index · P + position) · M + j with M = m · iterations, P the
    stages a microbatch visits and position the place of s on j's route (s itself unless
    bidirectional), so ops of one kind and stage are contiguous and in microbatch order (with the
    bidirectional placement, the block of a route position holds the down stage's ops, then the
    up stage's). The optional ops follow, a schedule's
    choice per (stage, microbatch) pair, each in (stage, microbatch) order: the R of each pair in
    `recomputed`, then the O and then the L of each pair in `offloaded`, then the G of each
    (stage, first microbatch of an iteration) in `regathered`.
    """

    def __init__(self, problem: Problem, recomputed: frozenset[tuple[int, int]] = frozenset(),
                 offloaded: frozenset[tuple[int, int]] = frozenset(),
                 regathered: frozenset[tuple[int, int]] = frozenset()):
        for pairs, kind, allowed, key in ((recomputed, RECOMPUTE, problem.recomputation is not None, "allow_recompute"),
                                          (offloaded, OFFLOAD, problem.offload is not None, "allow_offload"),
                                          (regathered, REGATHER, problem.allow_reshard, "allow_reshard")):
            if pairs and not allowed:
                what = {RECOMPUTE: "recomputation", OFFLOAD: "offload", REGATHER: "a re-gather"}[kind]
                raise ScheduleError(f"op {Op(kind, *min(pairs))}: {what} is not allowed in this problem "
                                    f"({key} is false)")
        _check_regathers(problem, regathered)
        both = recomputed & offloaded
        if both:
            stage, microbatch = min(both)
            raise ScheduleError(f"ops {Op(RECOMPUTE, stage, microbatch)} and {Op(OFFLOAD, stage, microbatch)}: an "
                                "activation is kept, recomputed or offloaded, not both")
        self.problem = problem
        self.kinds = problem.kinds
        self.num_stages = problem.num_stages
        self.route_length = problem.route_length
        self._bidirectional = problem.bidirectional
        self.num_microbatches = problem.total_microbatches
        self.core_size = problem.num_ops
        self.recomputed = tuple(sorted(recomputed))
        self.offloaded = tuple(sorted(offloaded))
        self.regathered = tuple(sorted(regathered))
        self.size = self.core_size + len(self.recomputed) + 2 * len(self.offloaded) + len(self.regathered)
        self._kind_index = {kind: index for index, kind in enumerate(self.kinds)}
        self._optional = [(RECOMPUTE, pair) for pair in self.recomputed] + \
            [(OFFLOAD, pair) for pair in self.offloaded] + [(RELOAD, pair) for pair in self.offloaded] + \
            [(REGATHER, pair) for pair in self.regathered]
        self._optional_index = {(kind, *pair): self.core_size + k for k, (kind, pair) in enumerate(self._optional)}

    def index(self, op: Op) -> int:
        """Number of `op`; raises ScheduleError when the op does not exist in this problem."""
        kind, stage, microbatch = op
        if not 0 <= stage < self.num_stages:
            raise ScheduleError(f"op {op}: stage {stage} out of range (the problem has {self.num_stages} stages)")
        if not 0 <= microbatch < self.num_microbatches:
            raise ScheduleError(
                f"op {op}: microbatch {microbatch} out of range (the problem has {self.num_microbatches})"
            )
        if kind in _OPTIONAL_KINDS:
            index = self._optional_index.get((kind, stage, microbatch))
            if index is None:
                raise ScheduleError(f"op {op}: not among this table's optional ops")
            return index
        kind_index = self._kind_index.get(kind)
        if kind_index is None:
            backward = "split (F, B, W)" if self.problem.split_backward else "fused (F, BW)"
            raise ScheduleError(f"op {op}: kind {kind} does not exist in this problem, whose backward is {backward}")
        if self._bidirectional:
            stages, microbatches = self.problem.routes[self.problem.route_of_stage(stage)]
            if microbatch not in microbatches:
                way = self.problem.routes[1 - self.problem.route_of_stage(stage)][0]
                raise ScheduleError(f"op {op}: microbatch {microbatch} goes through stages {way[0]}..{way[-1]}, "
                                    f"never stage {stage}")
            stage -= stages[0]  # its position on the route
        return (kind_index * self.route_length + stage) * self.num_microbatches + microbatch

    def op(self, index: int) -> Op:
        """Inverse of `index`."""
        if index >= self.core_size:
            kind, pair = self._optional[index - self.core_size]
            return Op(kind, *pair)
        rest, microbatch = divmod(index, self.num_microbatches)
        kind_index, position = divmod(rest, self.route_length)
        return Op(self.kinds[kind_index], self._stage_at(position, microbatch), microbatch)

    def _stage_at(self, position: int, microbatch: int) -> int:
        """The stage at `position` on the route of `microbatch`."""
        for stages, microbatches in self.problem.routes:
            if microbatch in microbatches:
                return stages[position]
        raise AssertionError(microbatch)  # every microbatch has a route

    def ops(self) -> list[Op]:
        return [self.op(i) for i in range(self.size)]

    def _per_op(self, value_of) -> list:
        """A list over all ops of `value_of(kind, stage)`, built one (kind, stage) run at a time
        (then one value per optional op)."""
        values: list = []
        for kind in self.kinds:
            for position in range(self.route_length):
                for stages, microbatches in self.problem.routes:
                    values.extend([value_of(kind, stages[position])] * len(microbatches))
        values.extend(value_of(kind, stage) for kind, (stage, _) in self._optional)
        return values

    @cached_property
    def kind(self) -> list[str]:
        return self._per_op(lambda kind, stage: kind)

    def _per_microbatch_op(self, value_of) -> list:
        """A list over all ops of `value_of(kind, stage, microbatch)`: `_per_op`'s runs where every
        microbatch costs the same, else one op at a time."""
        if self.problem.microbatches_equal:
            return self._per_op(value_of)
        return [value_of(op.kind, op.stage, op.microbatch) for op in self.ops()]

    @cached_property
    def duration(self) -> list[float]:
        """Per op, how long it runs: its own microbatch's cost (`Problem.cost`)."""
        return self._per_microbatch_op(self.problem.cost)

    @cached_property
    def device(self) -> list[int]:
        return self._per_op(lambda kind, stage: self.problem.device_of(stage))

    @cached_property
    def stage(self) -> list[int]:
        """Per op, its virtual stage."""
        return self._per_op(lambda kind, stage: stage)

    @cached_property
    def iteration(self) -> list[int]:
        """Per op, the iteration it belongs to: its microbatch // m."""
        m = self.problem.num_microbatches
        return [op.microbatch // m for op in self.ops()]

    @cached_property
    def release(self) -> list[float]:
        """Per op, the earliest start the iteration's ends allow before any op has run: a forward
        waits for its stage's FSDP unshard (`mechanisms.unshard_windows`), a first iteration's
        re-gather for its device's (`mechanisms.unshards_done`); 0 for every other op and without
        unshards. A later iteration's forwards and re-gathers wait longer, for their device's step
        before and the unshards after it, which depend on the times (`simulation.ends`)."""
        ends = self.problem.iteration_ends
        if ends is None or not any(ends.unshard_times):
            return [0.0] * self.size
        windows = unshard_windows(self.problem)
        released = self._per_op(lambda kind, stage: windows[stage][1] if kind == FORWARD else 0.0)
        lane_free = unshards_done(self.problem)
        for k, (kind, (stage, microbatch)) in enumerate(self._optional):
            if kind == REGATHER and microbatch < self.problem.num_microbatches:
                released[self.core_size + k] = lane_free[self.problem.device_of(stage)]
        return released

    @cached_property
    def memory_delta(self) -> list[float]:
        """Per op, its memory change (`Problem.memory_delta`): a recomputed activation's F holds
        only the checkpoint."""
        deltas = self._per_microbatch_op(lambda kind, stage, microbatch=None: 0.0 if kind == REGATHER else
                                         self.problem.memory_delta(kind, stage, microbatch=microbatch))
        for stage, microbatch in self.recomputed:
            forward = self.index(Op(FORWARD, stage, microbatch))
            deltas[forward] = self.problem.memory_delta(FORWARD, stage, recomputed=True, microbatch=microbatch)
        return deltas  # a G's parameters are counted with the ends' (`simulation.memory`)

    @cached_property
    def allocates_at_start(self) -> list[bool]:
        """Per op, whether its memory change happens at its start (F, R, L) rather than its end."""
        return self._per_op(lambda kind, stage: kind in (FORWARD, RECOMPUTE, RELOAD))

    @cached_property
    def lane(self) -> list[int]:
        """Per op, where it runs on its device: COMPUTE_LANE, the copy lane of an O or L, or GATHER_LANE (a G)."""
        return self._per_op(lambda kind, stage: LANE_OF_KIND.get(kind, COMPUTE_LANE))

    def _predecessor_stage_kind(self, kind: str, stage: int) -> tuple[str, int] | None:
        route = self.problem.routes[self.problem.route_of_stage(stage)][0]
        if kind == REGATHER:
            return None  # its forwards feed it on its device (`same_device_inputs`)
        if kind in (RECOMPUTE, OFFLOAD):
            return (FORWARD, stage)
        if kind == RELOAD:
            return (OFFLOAD, stage)
        if kind == FORWARD:
            return (FORWARD, stage - 1) if stage > route[0] else None
        if kind in (BACKWARD, FUSED_BACKWARD):
            return (FORWARD, stage) if stage == route[-1] else (kind, stage + 1)
        return (BACKWARD, stage)

    @cached_property
    def predecessor(self) -> list[int]:
        """Per op, the one op it directly depends on within its microbatch across stages (for R
        and O, its F; for L, its O), or -1 (a G's inputs are all on its device)."""
        result: list[int] = []
        first_route = self.problem.routes[0][0]  # every route's position has the same kind of predecessor
        for kind in self.kinds:
            for position in range(self.route_length):
                source = self._predecessor_stage_kind(kind, first_route[position])
                if source is None:
                    result.extend([-1] * self.num_microbatches)
                else:
                    first = self.index(Op(source[0], source[1], 0))
                    result.extend(range(first, first + self.num_microbatches))
        result.extend(-1 if kind == REGATHER else self.index(Op(*self._predecessor_stage_kind(kind, stage), microbatch))
                      for kind, (stage, microbatch) in self._optional)
        return result

    @cached_property
    def same_device_inputs(self) -> list[tuple[int, ...]]:
        """Per op, the ops on its device it also waits for besides `predecessor` (no latency): for
        the input gradient (B or BW) of a recomputed activation its R, of an offloaded one its L;
        with sequence slices (`zbopt.core.problem.slices`), for a forward the slice before it on its stage, for
        an input gradient the slice after it; for a G, its stage's forwards of its iteration, and for
        those microbatches' input gradients and recomputes there, the G."""
        result: list[tuple[int, ...]] = [()] * self.size
        backward = self.problem.input_gradient_kind
        for kind, (stage, microbatch) in self._optional:
            if kind in (RECOMPUTE, RELOAD):
                result[self.index(Op(backward, stage, microbatch))] = (self.index(Op(kind, stage, microbatch)),)
        recomputed, m = set(self.recomputed), self.problem.num_microbatches
        for stage, first in self.regathered:
            regather = self.index(Op(REGATHER, stage, first))
            microbatches = [j for j in self.problem.microbatches_of(stage) if 0 <= j - first < m]
            result[regather] = tuple(self.index(Op(FORWARD, stage, j)) for j in microbatches)
            for j in microbatches:
                for kind in (backward, RECOMPUTE) if (stage, j) in recomputed else (backward,):
                    result[self.index(Op(kind, stage, j))] += (regather,)
        if self.problem.sequence_slices > 1:
            for index in range(self.core_size):
                kind, stage, microbatch = self.op(index)
                if kind in (FORWARD, backward):
                    other = neighbour(self.problem, kind == FORWARD, microbatch)
                    if other is not None:
                        result[index] += (self.index(Op(kind, stage, other)),)
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

    def iteration_barrier(self, stage: int, iteration: int) -> range:
        """Indices of the gradient ops of `stage` in `iteration`: the next iteration's forwards on
        that stage wait for all of them."""
        m = self.problem.num_microbatches
        first = self.index(Op(self.problem.gradient_kind, stage, iteration * m))
        return range(first, first + m)


def _check_regathers(problem: Problem, regathered: frozenset[tuple[int, int]]) -> None:
    """A G names its stage and its iteration's first microbatch ("3G8": stage 3, microbatch 8 = k·m)."""
    m = problem.num_microbatches
    for stage, microbatch in sorted(regathered):
        op = Op(REGATHER, stage, microbatch)
        if not 0 <= stage < problem.num_stages:
            raise ScheduleError(f"op {op}: stage {stage} out of range (the problem has {problem.num_stages} stages)")
        if microbatch % m or not 0 <= microbatch < problem.total_microbatches:
            firsts = ", ".join(str(k * m) for k in range(min(problem.iterations, 4)))
            raise ScheduleError(f"op {op}: a re-gather names its iteration by the iteration's first microbatch "
                                f"({firsts}{', ...' if problem.iterations > 4 else ''})")


@lru_cache(maxsize=16)
def op_table(problem: Problem, recomputed: frozenset[tuple[int, int]] = frozenset(),
             offloaded: frozenset[tuple[int, int]] = frozenset(),
             regathered: frozenset[tuple[int, int]] = frozenset()) -> OpTable:
    """The op table of a problem (with the R ops of `recomputed`, the O and L ops of `offloaded`,
    the G ops of `regathered`), cached: solvers and benchmarks simulate one problem many times."""
    return OpTable(problem, recomputed, offloaded, regathered)
