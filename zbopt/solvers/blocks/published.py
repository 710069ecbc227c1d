"""The published schedules' blocks, as the steady-state cycle each device repeats.

Each pattern below is read off its paper's steady state; `tightest_block` then gives its offsets
and period for the problem's own costs and latency (for F = B = W and no latency, the papers'
figures). Building the block (`block_schedule`) gives the schedule back: the tests say where that
equals zbopt's hand-written generator op for op and where only in makespan and peak.
"""

from __future__ import annotations

from collections.abc import Callable

from zbopt.core.kinds import BACKWARD, FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.schedules.common import backward_ops, input_gradient, require_v_shape
from zbopt.schedules.registry import require
from zbopt.schedules.slot_model import PERIOD, v_half_block, v_min_block, weight_slots
from zbopt.solvers.blocks.cyclic import Step, tightest_block
from zbopt.solvers.blocks.model import Block

__all__ = ["PUBLISHED", "Cycles", "interleaved_cycles", "one_f_one_b_cycles", "published_block", "v_half_cycles",
           "v_min_cycles", "v_zb_cycles", "zb_h1_cycles"]

Cycles = list[list[Step]]


def _backward(problem: Problem, stage: int, index: int, lag: int) -> list[Step]:
    return [(op, lag) for op in backward_ops(problem, stage, index)]


def one_f_one_b_cycles(problem: Problem) -> Cycles:
    """1F1B (Narayanan et al., SC 2021): stage s runs F of microbatch c + p-s-1, then the backward
    of c (B and W back to back when split)."""
    require(problem.chunks_per_device == 1, "block-1f1b", "chunks_per_device = 1")
    p = problem.num_devices
    return [[(Op(FORWARD, s, 0), -(p - s - 1)), *_backward(problem, s, 0, 0)] for s in range(p)]


def zb_h1_cycles(problem: Problem) -> Cycles:
    """ZB-H1 (Qi et al., ICLR 2024, Figure 3): stage s runs B of c, W of c - s, F of c + p - s."""
    require(problem.chunks_per_device == 1 and problem.split_backward, "block-zb-h1",
            "chunks_per_device = 1 and a split backward")
    p = problem.num_devices
    return [[(Op(BACKWARD, s, 0), 0), (Op(WEIGHT, s, 0), s), (Op(FORWARD, s, 0), -(p - s))] for s in range(p)]


def interleaved_cycles(problem: Problem) -> Cycles:
    """Megatron's interleaved 1F1B (Narayanan et al., SC 2021, section 2.2), loop placement, groups of
    p microbatches: device d walks the schedule table (the group through chunk 0, then chunk 1, ...)
    for its forwards, 2(p-d-1) + (v-1)·p entries ahead of the same table, chunks reversed, for its
    backwards; one forward and one backward alternate. One cycle is a group's p·v table entries."""
    p, v = problem.num_devices, problem.chunks_per_device
    require(v >= 2 and problem.placement == "loop", "block-interleaved-1f1b", "v >= 2 and placement loop")
    entries = p * v
    cycles = []
    for device in range(p):
        ahead = 2 * (p - device - 1) + (v - 1) * p
        cycle: list[Step] = []
        for entry in range(entries):
            groups_ahead, forward_entry = divmod(ahead + entry, entries)
            chunk, index = divmod(forward_entry, p)
            cycle.append((Op(FORWARD, chunk * p + device, index), -groups_ahead))
            chunk, index = divmod(entry, p)
            cycle += _backward(problem, (v - 1 - chunk) * p + device, index, 0)
        cycles.append(cycle)
    return cycles


def v_zb_cycles(problem: Problem) -> Cycles:
    """ZB-V / V-ZB (Qi et al., ICLR 2024, section 6): device d repeats F0 B0 W0 F1 B1 W1, each the
    oldest of its kind; after the warm-up that is chunk-0 F of c + 2p-d-1, chunk-0 B, W of c,
    chunk-1 F of c + p, chunk-1 B, W of c + p - d."""
    require_v_shape(problem, "block-v-zb")
    p = problem.num_devices
    cycles = []
    for d, (first, second) in enumerate(problem.stages_of_device):
        cycles.append([(Op(FORWARD, first, 0), -(2 * p - d - 1)), *_backward(problem, first, 0, 0),
                       (Op(FORWARD, second, 0), -p), *_backward(problem, second, 0, -(p - d))])
    return cycles


def _slot_cycles(problem: Problem, name: str, slot_block) -> Cycles:
    """A controllable-memory block given in slots of one op each, T = 6 (Qi et al., NeurIPS 2024,
    section 4): the op at slot o of microbatch j runs in cycle (o + 6j) // 6, so its lag is
    o // 6, and a cycle runs its ops in slot order."""
    require_v_shape(problem, f"block-{name}")
    cycles = []
    for d, slots in enumerate(weight_slots(slot_block(problem.num_devices))):
        steps = sorted(slots.items(), key=lambda item: item[1] % PERIOD)
        cycle: list[Step] = []
        for (kind, chunk), slot in steps:
            stage = problem.stages_of_device[d][chunk]
            if kind == WEIGHT and not problem.split_backward:
                continue
            op = input_gradient(problem, stage, 0) if kind == BACKWARD else Op(kind, stage, 0)
            cycle.append((op, slot // PERIOD))
        cycles.append(cycle)
    return cycles


def v_min_cycles(problem: Problem) -> Cycles:
    """V-Min (Qi et al., NeurIPS 2024): its slot block (`vshape`), W's in the free slots."""
    return _slot_cycles(problem, "v-min", v_min_block)


def v_half_cycles(problem: Problem) -> Cycles:
    """V-Half (Qi et al., NeurIPS 2024): its slot block (`vshape`), W's in the free slots."""
    return _slot_cycles(problem, "v-half", v_half_block)


PUBLISHED: dict[str, tuple[Callable[[Problem], Cycles], int | None]] = {
    "1f1b": (one_f_one_b_cycles, 1),
    "zb-h1": (zb_h1_cycles, 1),
    "interleaved-1f1b": (interleaved_cycles, None),
    "v-min": (v_min_cycles, 1),
    "v-half": (v_half_cycles, 1),
    "v-zb": (v_zb_cycles, 1),
}
"""Schedule name -> (its cycles, its group size; None: p microbatches)."""


def published_block(name: str, problem: Problem) -> Block:
    """The block of the published schedule `name` at the problem's costs (see the module doc)."""
    cycles, group = PUBLISHED[name]
    return tightest_block(problem, cycles(problem), group or problem.num_devices, name)
