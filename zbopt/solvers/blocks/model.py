"""A building block: one group of microbatches' ops, each at an offset, repeated every period.

"Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024, section 3): most pipeline
schedules repeat one microbatch's passes on every device (the block) at a fixed interval T. A stage's
*lifespan* runs from its forward's start to the end of the op that frees the activation (B for the
part B frees, W for the rest; BW when fused); in the steady state a device holds about
Σ lifespan / T activations, so the lifespans set the memory and T the time per microbatch.

Here a block may hold a *group* of k microbatches repeated every `period` = k·T (Megatron's
interleaved 1F1B repeats groups of p); its ops are `Op(kind, stage, i)` with i the microbatch's
place in the group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from zbopt.core.errors import ZboptError
from zbopt.core.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, WEIGHT
from zbopt.core.ops import Op, OpTable, op_table
from zbopt.core.problem import Problem
from zbopt.core.problem.microbatches import every_microbatch_at
from zbopt.core.tolerance import RELATIVE_TOLERANCE

__all__ = ["Block", "BlockError", "Lifespan", "block_ops", "check_block", "group_table", "input_of", "lifespan_bound",
           "lifespans", "steady_peak"]


class BlockError(ZboptError):
    """A block that cannot repeat: a missing op, a broken dependency, an overlap modulo its period."""


@dataclass(frozen=True)
class Lifespan:
    """How long one microbatch's activation on one stage lives: from its F's start to the end of
    the op that frees each part (B and W; both the fused BW when the backward is not split)."""

    stage: int
    index: int
    to_backward: float
    to_weight: float


@dataclass(frozen=True)
class Block:
    """Offsets of one group of microbatches' ops, repeated every `period` (see the module doc).

    The group is numbered i = 0..group-1; microbatch g·group + i runs op (kind, stage, i) at
    offsets[op] + g·period. `name` says where the block comes from ("1f1b", "optimal", ...).
    """

    problem: Problem
    offsets: Mapping[Op, float]
    period: float
    group: int = 1
    name: str = ""
    ops: tuple[Op, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(sorted(self.offsets, key=self.offsets.__getitem__)))
        check_block(self)

    @property
    def interval(self) -> float:
        """T, the time per microbatch in the steady state: the period over the group size."""
        return self.period / self.group

    def end(self, op: Op) -> float:
        return self.offsets[op] + self.problem.cost(op.kind, op.stage)

    @property
    def length(self) -> float:
        """From the block's first op's start to its last op's end."""
        return max(map(self.end, self.ops)) - min(self.offsets.values())

    def to_dict(self) -> dict:
        """Name, period, group, T, length and every op's offset (keys in Op's text form, "0F0")."""
        return {"name": self.name, "period": self.period, "group": self.group, "interval": self.interval,
                "length": self.length, "offsets": {str(op): offset for op, offset in self.offsets.items()}}

    def repeated_span(self, microbatches: int) -> float:
        """The makespan of the block repeated for `microbatches` before any squeeze: the last group
        starts (groups - 1)·period after the first, then runs the block's length."""
        return (math.ceil(microbatches / self.group) - 1) * self.period + self.length


def block_ops(problem: Problem, group: int) -> list[Op]:
    """The ops one block of `group` microbatches must hold: every kind on every stage."""
    return [Op(kind, stage, i) for kind in problem.kinds for stage in range(problem.num_stages) for i in range(group)]


def group_table(problem: Problem, group: int) -> OpTable:
    """The op table of one group of `group` microbatches, one iteration, no memory limit: the ops,
    predecessors and latencies a block's offsets refer to. Microbatches given by their tokens or
    rows (all alike: a block repeats one) become per-stage values, which a shorter problem can hold."""
    alike = problem if problem.per_microbatch is None else every_microbatch_at(problem, min, sequence_slices=1)
    return op_table(alike.replace(num_microbatches=group, iterations=1, memory_limit=None))


def input_of(table: OpTable, op: Op) -> tuple[Op, float] | None:
    """The op whose output `op` waits for in `table` and the latency after that op's end; None for
    an op that waits for none (a first forward)."""
    index = table.index(op)
    source = table.predecessor[index]
    return None if source < 0 else (table.op(source), table.latency[index])


def check_block(block: Block) -> None:
    """Raise BlockError unless the block can repeat forever: every op once, each after its
    predecessor's end plus latency, and no two ops of a device overlapping modulo the period."""
    problem, offsets = block.problem, block.offsets
    if not (block.period > 0 and math.isfinite(block.period)):
        raise BlockError(f"block period {block.period!r}: must be a positive number")
    expected = block_ops(problem, block.group)
    missing = [op for op in expected if op not in offsets]
    extra = sorted(set(offsets) - set(expected))
    if missing or extra:
        culprit = f"misses op {missing[0]}" if missing else f"has op {extra[0]}, which is not an op of its group"
        raise BlockError(f"block {block.name or '(unnamed)'} {culprit}")
    tolerance = RELATIVE_TOLERANCE * max(1.0, block.period, *map(abs, offsets.values()))
    table = group_table(problem, block.group)
    for op in expected:
        waited = input_of(table, op)
        if waited is not None:
            before, latency = waited
            ready = block.end(before) + latency
            if offsets[op] < ready - tolerance:
                raise BlockError(f"block op {op} starts at {offsets[op]:g}, before its input from {before} "
                                 f"arrives at {ready:g}")
    for device, stages in enumerate(problem.stages_of_device):
        busy = sorted(((offsets[op] % block.period, problem.cost(op.kind, op.stage), op) for op in expected
                       if op.stage in stages), key=lambda item: item[0])
        work = sum(duration for _, duration, _ in busy)
        if work > block.period + tolerance:
            raise BlockError(f"block period {block.period:g} is shorter than device {device}'s work per "
                             f"period ({work:g})")
        wrapped = (busy[0][0] + block.period, 0.0, busy[0][2])
        for (start, duration, op), (after, _, other) in zip(busy, [*busy[1:], wrapped], strict=True):
            if start + duration > after + tolerance:
                raise BlockError(f"block ops {op} and {other} overlap on device {device} when repeated every "
                                 f"{block.period:g}")


def lifespans(block: Block) -> list[Lifespan]:
    """Every stage's lifespan for every microbatch of the group (see `Lifespan`)."""
    problem, spans = block.problem, []
    for stage in range(problem.num_stages):
        for i in range(block.group):
            start = block.offsets[Op(FORWARD, stage, i)]
            if problem.split_backward:
                to_backward = block.end(Op(BACKWARD, stage, i)) - start
                to_weight = block.end(Op(WEIGHT, stage, i)) - start
            else:
                to_backward = to_weight = block.end(Op(FUSED_BACKWARD, stage, i)) - start
            spans.append(Lifespan(stage, i, to_backward, to_weight))
    return spans


def _held_intervals(block: Block) -> list[list[tuple[float, float, float]]]:
    """Per device, (start, end, amount) of every memory the block holds: each part lives from its
    F's start to the end of the op that frees it (`Problem.releases`)."""
    problem = block.problem
    held: list[list[tuple[float, float, float]]] = [[] for _ in range(problem.num_devices)]
    for stage in range(problem.num_stages):
        for i in range(block.group):
            start = block.offsets[Op(FORWARD, stage, i)]
            held[problem.device_of(stage)] += [(start, block.end(Op(kind, stage, i)), amount)
                                               for kind, amount in problem.releases(stage)]
    return held


def lifespan_bound(block: Block) -> list[float]:
    """The paper's rule, per device: each part of an activation is held by at most ⌈lifespan / T⌉
    microbatches at once (T = the period, k·T for a group of k), so the device holds at most the sum of those. An upper
    bound on the steady state's peak; `steady_peak` is exact."""
    return [sum(amount * math.ceil((end - start) / block.period - RELATIVE_TOLERANCE) for start, end, amount in held)
            for held in _held_intervals(block)]


def steady_peak(block: Block) -> list[float]:
    """Per device, the most memory it holds in the steady state (the block repeated forever).

    An interval [a, b) repeated every P covers the moment t in floor((t-a)/P) - floor((t-b)/P)
    copies; memory only rises when an interval starts, so the maximum over the period is taken at
    the starts (frees at the same moment come first, as in the simulator)."""
    return [max((_level(held, start, block.period) for start, _, _ in held), default=0.0)
            for held in _held_intervals(block)]


def _level(held: list[tuple[float, float, float]], moment: float, period: float) -> float:
    """Memory held at `moment` in the steady state: each interval's copies covering it."""
    return sum(amount * (_copies_started(moment - start, period) - _copies_started(moment - end, period))
               for start, end, amount in held)


def _copies_started(elapsed: float, period: float) -> int:
    """floor(elapsed / period), robust to float noise at whole multiples."""
    return math.floor(elapsed / period + RELATIVE_TOLERANCE)
