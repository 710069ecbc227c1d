"""GPipe and 1F1B: the classic flush schedules, with a split (B, W) or fused (BW) backward."""

from __future__ import annotations

from zbopt.ops import Op
from zbopt.problem import FORWARD, Problem
from zbopt.schedule import Schedule
from zbopt.schedules.common import backward_ops, iteration_microbatches
from zbopt.schedules.registry import register, require


def _all_microbatches(problem: Problem) -> list[float]:
    """Per device: every microbatch of an iteration held on every one of its stages."""
    return [problem.num_microbatches * sum(problem.activation_memory[s] for s in stages)
            for stages in problem.stages_of_device]


def _one_f_one_b_memory(problem: Problem) -> list[float]:
    """Device s holds at most min(p-s, m) microbatches' activations of its stage."""
    p, m = problem.num_devices, problem.num_microbatches
    return [min(p - s, m) * problem.activation_memory[s] for s in range(p)]


@register("gpipe", "GPipe (Huang et al., 2019): all forwards, then all backwards, per iteration",
          _all_microbatches)
def gpipe(problem: Problem) -> Schedule:
    """GPipe: each device runs every forward of the iteration, then every backward.

    Forwards go by (stage, microbatch), backwards by (stage descending, microbatch); with v > 1
    chunks this is the breadth-first looped order. Peak memory: m microbatches on every stage.
    """
    orders: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    for device, stages in enumerate(problem.stages_of_device):
        for microbatches in iteration_microbatches(problem):
            orders[device] += [Op(FORWARD, s, j) for s in stages for j in microbatches]
            for stage in reversed(stages):
                for j in microbatches:
                    orders[device] += backward_ops(problem, stage, j)
    return Schedule(orders)


@register("1f1b", "1F1B (PipeDream-Flush, Narayanan et al., 2021): p-s-1 warm-up forwards, then F/B alternating",
          _one_f_one_b_memory)
def one_f_one_b(problem: Problem) -> Schedule:
    """1F1B: device s runs min(p-s-1, m) warm-up forwards, then alternates one forward and one
    backward (B then W straight after when split), then drains the remaining backwards.

    Holds at most min(p-s, m) microbatches' activations on device s. Needs v = 1.
    """
    require(problem.chunks_per_device == 1, "1f1b", "chunks_per_device = 1 (one stage per device)")
    p = problem.num_devices
    orders = []
    for stage in range(p):
        order: list[Op] = []
        for microbatches in iteration_microbatches(problem):
            ids = list(microbatches)
            warmup = min(p - stage - 1, len(ids))
            order += [Op(FORWARD, stage, j) for j in ids[:warmup]]
            for step, j in enumerate(ids[warmup:]):
                order.append(Op(FORWARD, stage, j))
                order += backward_ops(problem, stage, ids[step])
            for j in ids[len(ids) - warmup:]:
                order += backward_ops(problem, stage, j)
        orders.append(order)
    return Schedule(orders)
