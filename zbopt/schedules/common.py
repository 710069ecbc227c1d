"""Small pieces every schedule family builds its orders from."""

from __future__ import annotations

from zbopt.ops import Op
from zbopt.problem import BACKWARD, FUSED_BACKWARD, WEIGHT, Problem
from zbopt.schedule import Schedule


def backward_ops(problem: Problem, stage: int, microbatch: int) -> list[Op]:
    """The backward of one microbatch on one stage: [B, W] back to back when split, else [BW]."""
    if problem.split_backward:
        return [Op(BACKWARD, stage, microbatch), Op(WEIGHT, stage, microbatch)]
    return [Op(FUSED_BACKWARD, stage, microbatch)]


def input_gradient(problem: Problem, stage: int, microbatch: int) -> Op:
    """The op that sends the gradient upstream: B when split, BW when fused."""
    return Op(BACKWARD if problem.split_backward else FUSED_BACKWARD, stage, microbatch)


def iteration_microbatches(problem: Problem) -> list[range]:
    """The microbatch ids of each iteration."""
    m = problem.num_microbatches
    return [range(k * m, (k + 1) * m) for k in range(problem.iterations)]


def repeat_per_iteration(problem: Problem, iteration_orders: list[list[Op]]) -> Schedule:
    """One iteration's per-device orders (microbatches 0..m-1) repeated for every iteration, the
    microbatch ids of iteration k being k·m + j."""
    orders: list[list[Op]] = [[] for _ in iteration_orders]
    for microbatches in iteration_microbatches(problem):
        for order, pattern in zip(orders, iteration_orders, strict=True):
            order += [Op(op.kind, op.stage, microbatches[op.microbatch]) for op in pattern]
    return Schedule(orders)
