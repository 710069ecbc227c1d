"""Chimera (Li and Hoefler, SC'21): two 1F1B pipelines in opposite directions on one set of devices.

The down pipeline runs the model's stages 0..p-1 on devices 0..p-1, the up pipeline the same stages
on devices p-1..0, each device holding one stage of each: zbopt's placement "bidirectional"
(`Problem.routes`: the first m/2 microbatches go down, the others up). Each pipeline runs 1F1B on
its half of the microbatches and the two are merged per device without conflict (the paper's
§3.1, Fig. 3, for D = p even and N = D microbatches: a *basic unit*). With more microbatches
(§3.4), zbopt builds the scheme of the authors' runtime for it, "direct concatenation"
(Shigangli/Chimera, chimera/chimera_bert/bert/main_with_runtime_direct.py): basic units of p
microbatches back to back, the first phase of each unit after the first running the previous
unit's backwards one for one with its own forwards. Forward doubling (the paper's other scheme,
two forwards fused into one of twice the size, with recomputation) is not built: zbopt's ops have
the size of one microbatch.
"""

from __future__ import annotations

from collections.abc import Iterator

from zbopt.core.kinds import BACKWARD, FORWARD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.common import backward_ops, require_two_ways
from zbopt.schedules.registry import register

__all__ = ["chimera", "chimera_roles"]


class _Streams:
    """Per stage, its microbatches in route order, one stream for forwards and one for backwards
    (both pipelines are 1F1B: each stage takes its forwards and its backwards in microbatch order)."""

    def __init__(self, problem: Problem, stages: tuple[int, ...]):
        self.problem = problem
        self.order: list[Op] = []
        self._forwards: dict[int, Iterator[int]] = {s: iter(problem.microbatches_of(s)) for s in stages}
        self._backwards: dict[int, Iterator[int]] = {s: iter(problem.microbatches_of(s)) for s in stages}

    def forward(self, stage: int) -> None:
        self.order.append(Op(FORWARD, stage, next(self._forwards[stage])))

    def backward(self, stage: int) -> None:
        self.order += backward_ops(self.problem, stage, next(self._backwards[stage]))

    def run(self, count: int, *steps: tuple[str, int]) -> None:
        """`count` times the (kind, stage) steps in turn, kind F or B (the full backward)."""
        for _ in range(count):
            for kind, stage in steps:
                (self.forward if kind == FORWARD else self.backward)(stage)


def chimera_roles(problem: Problem, device: int) -> tuple[int, int, int]:
    """(first, second, h) of `device`: its stage in the pipeline where it sits in the first half
    (device r < p/2: the down stage r; else the up stage, whose place p-1-r < p/2), its stage in the
    other, and h = min(r, p-1-r), its place in the first."""
    p = problem.num_devices
    down, up = problem.stages_of_device[device]
    return (down, up, device) if device < p // 2 else (up, down, p - 1 - device)


def _chimera_order(problem: Problem, device: int) -> list[Op]:
    """The runtime's five phases per basic unit, with a = p/2 - h and h forwards of the other
    pipeline let in: a F1 (or a times B1 F1 after the first unit), h times F2 F1, a times F2 B2,
    h times B1 B2; after the last unit a B1. Stage 1 is `first`, 2 is `second` (`chimera_roles`)."""
    p, m = problem.num_devices, problem.num_microbatches
    first, second, h = chimera_roles(problem, device)
    a = p // 2 - h
    streams = _Streams(problem, (first, second))
    for unit in range(m // p):
        streams.run(a, *([(BACKWARD, first)] if unit else []), (FORWARD, first))
        streams.run(h, (FORWARD, second), (FORWARD, first))
        streams.run(a, (FORWARD, second), (BACKWARD, second))
        streams.run(h, (BACKWARD, first), (BACKWARD, second))
    streams.run(a, (BACKWARD, first))
    return streams.order


def _chimera_memory(problem: Problem) -> list[float]:
    """The paper's activation memory, between (p/2 + 1) and p microbatches (Table 2, [(D/2+1)Ma,
    D·Ma]): device r holds at most p/2 on its first-half stage and h + 1 on the other at once."""
    p = problem.num_devices
    bounds = []
    for device in range(p):
        first, second, h = chimera_roles(problem, device)
        bounds.append(p // 2 * problem.activation_memory[first] + (h + 1) * problem.activation_memory[second])
    return bounds


@register("chimera", "Chimera (Li and Hoefler, SC'21): two 1F1B pipelines in opposite directions, bidirectional "
                     "placement", _chimera_memory, bidirectional=True, after="dualpipe")
def chimera(problem: Problem) -> Schedule:
    """Chimera: half the microbatches down the pipeline and half up, each way 1F1B, merged per
    device as the authors' runtime issues them (main_with_runtime_direct.py [1]_), basic unit by
    basic unit ("direct concatenation", §3.4 of [2]_).

    Needs the bidirectional placement, an even p (the paper's condition for a conflict-free
    merge) and m a multiple of p (whole basic units: p/2 microbatches each way per unit).

    Notes
    -----
    With F = B (the paper's unit slots) and m = p, the bubble is p - 2 slots per device, D/2 - 1
    in the forwards and as many in the backwards (§3.2, Table 2: ratio (D-2)/(2N+D-2)).
    Peak memory: p/2 microbatches of the device's first-half stage and h + 1 of the other, from
    p/2 + 1 at the ends to p in the middle (Table 2). A split backward runs W right after its B.

    References
    ----------
    .. [1] Shigangli/Chimera, chimera/chimera_bert/bert/main_with_runtime_direct.py (the schedule
       numbers a and b = p/2 - a of each rank, the five loops of one accumulation step).
    .. [2] S. Li and T. Hoefler, "Chimera: Efficiently Training Large-Scale Neural Networks with
       Bidirectional Pipelines", SC'21, arXiv:2107.06925, §3.1-3.4, Fig. 3.
    """
    require_two_ways(problem, "chimera", 2, "basic units")
    return Schedule([_chimera_order(problem, device) for device in range(problem.num_devices)])
