"""The classic one-stage-per-device schedules and the breadth-first looped one.

GPipe, 1F1B and its eager and PipeDream-2BW variants, looped BFS. With a split backward they run
W right after its B, so the gradient travels upstream after B alone.
"""

from __future__ import annotations

from collections.abc import Callable

from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.common import alternate_passes, backward_ops, iteration_microbatches
from zbopt.schedules.registry import register, require

__all__ = ["WarmupRule", "alternate", "eager_one_f_one_b", "eager_one_f_one_b_2bw", "eager_warmup", "gpipe",
           "in_flight_bound", "looped_bfs", "one_f_one_b", "one_f_one_b_2bw", "warmup_then_alternate"]

WarmupRule = Callable[[int, int], int]  # (device, devices) -> warm-up forwards before the first backward


def _all_microbatches(problem: Problem) -> list[float]:
    """Per device: every microbatch of an iteration held on every one of its stages."""
    return [problem.num_microbatches * sum(problem.activation_memory[s] for s in stages)
            for stages in problem.stages_of_device]


def in_flight_bound(warmup: WarmupRule) -> Callable[[Problem], list[float]]:
    """Peak memory of a one-stage-per-device schedule: warm-up + 1 microbatches of its stage
    (capped by the microbatches of one stream: an iteration, or all of them without a flush)."""

    def bound(problem: Problem) -> list[float]:
        p = problem.num_devices
        m = problem.num_microbatches if problem.flush else problem.total_microbatches
        return [min(warmup(s, p) + 1, m) * problem.activation_memory[s] for s in range(p)]

    return bound


def _standard_warmup(device: int, devices: int) -> int:
    return devices - device - 1


def eager_warmup(device: int, devices: int) -> int:
    return 2 * (devices - device - 1)


def alternate(problem: Problem, stage: int, forwards: list[int], backwards: list[int], warmup: int) -> list[Op]:
    """One stage's 1F1B order: min(warmup, len) forwards, then a forward and a backward in turn,
    then the remaining backwards; the forwards and the backwards each in their given order."""
    return alternate_passes([Op(FORWARD, stage, j) for j in forwards],
                            [backward_ops(problem, stage, j) for j in backwards], warmup)


def warmup_then_alternate(problem: Problem, name: str, warmup: WarmupRule, streams: list[range],
                          backward_order: Callable[[range], list[int]] = list) -> Schedule:
    """Per stream of microbatches: `warmup(s, p)` forwards, then forward/backward pairs, then the
    remaining backwards, the backwards in `backward_order(stream)` (default: the stream's)."""
    require(problem.chunks_per_device == 1, name, "chunks_per_device = 1 (one stage per device)")
    p = problem.num_devices
    orders = []
    for stage in range(p):
        order: list[Op] = []
        for stream in streams:
            order += alternate(problem, stage, list(stream), backward_order(stream), warmup(stage, p))
        orders.append(order)
    return Schedule(orders)


def _without_flush(problem: Problem, name: str) -> list[range]:
    """All iterations as one stream: PipeDream-2BW keeps two weight versions, so microbatches of
    the next iteration need not wait for this iteration's update."""
    require(problem.iterations == 1 or not problem.flush, name,
            "flush = false with iterations > 1 (PipeDream-2BW double-buffers weights instead of flushing)")
    return [range(problem.total_microbatches)]


@register("gpipe", "GPipe (Huang et al., 2019): all forwards, then all backwards, per iteration",
          _all_microbatches)
def gpipe(problem: Problem) -> Schedule:
    """GPipe (Huang et al., NeurIPS 2019): each device runs every forward of the iteration, then
    every backward, both in microbatch order. Peak memory: all m microbatches. Needs v = 1."""
    require(problem.chunks_per_device == 1, "gpipe", "chunks_per_device = 1 (use looped-bfs for more chunks)")
    orders = []
    for stage in range(problem.num_devices):
        order: list[Op] = []
        for microbatches in iteration_microbatches(problem):
            order += [Op(FORWARD, stage, j) for j in microbatches]
            for j in microbatches:
                order += backward_ops(problem, stage, j)
        orders.append(order)
    return Schedule(orders)


@register("looped-bfs", "Breadth-first looped (Lamy-Poirier, 2023; torch ScheduleLoopedBFS): stage by stage",
          _all_microbatches)
def looped_bfs(problem: Problem) -> Schedule:
    """Breadth-first pipeline parallelism (Lamy-Poirier, arXiv:2211.05953), as torch.distributed.
    pipelining's ScheduleLoopedBFS orders it: each device runs all microbatches' forwards of its
    first stage, then of its next stage, and so on; then the backwards stage by stage in reverse,
    microbatches in reverse order. Any v and placement; peak memory: all m microbatches on every
    stage of the device."""
    orders: list[list[Op]] = []
    for stages in problem.stages_of_device:
        order: list[Op] = []
        for microbatches in iteration_microbatches(problem):
            order += [Op(FORWARD, s, j) for s in stages for j in microbatches]
            for stage in reversed(stages):
                for j in reversed(microbatches):
                    order += backward_ops(problem, stage, j)
        orders.append(order)
    return Schedule(orders)


@register("1f1b", "1F1B (PipeDream-Flush, Narayanan et al., 2021): p-s-1 warm-up forwards, then F/B alternating",
          in_flight_bound(_standard_warmup))
def one_f_one_b(problem: Problem) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al., SC 2021): device s runs min(p-s-1, m) warm-up
    forwards, then alternates one forward and one backward, then drains the remaining backwards.
    Holds at most min(p-s, m) microbatches on device s. Needs v = 1."""
    return warmup_then_alternate(problem, "1f1b", _standard_warmup, iteration_microbatches(problem))


@register("eager-1f1b", "1F1B with 2(p-s-1) warm-up forwards: earlier sends, more overlap of latency",
          in_flight_bound(eager_warmup))
def eager_one_f_one_b(problem: Problem) -> Schedule:
    """Eager 1F1B: as 1F1B, but device s runs min(2(p-s-1), m) warm-up forwards, so each forward
    is sent before the device needs the matching backward and p2p latency overlaps compute (the
    warm-up of ZB-H2, Qi et al., ICLR 2024, Fig. 3). Holds min(2(p-s)-1, m) microbatches. v = 1."""
    return warmup_then_alternate(problem, "eager-1f1b", eager_warmup, iteration_microbatches(problem))


@register("1f1b-2bw", "PipeDream-2BW (Narayanan et al., 2021): 1F1B streaming all iterations without flushes",
          in_flight_bound(_standard_warmup))
def one_f_one_b_2bw(problem: Problem) -> Schedule:
    """PipeDream-2BW (Narayanan et al., ICML 2021): 1F1B over all m·iterations microbatches as one
    stream, with no flush between iterations; needs `flush = false` when iterations > 1. The model
    does not capture 2BW's double-buffered weights (a second weight copy per stage) nor its
    one-step weight staleness: only the timing and activation memory."""
    return warmup_then_alternate(problem, "1f1b-2bw", _standard_warmup, _without_flush(problem, "1f1b-2bw"))


@register("eager-1f1b-2bw", "PipeDream-2BW with eager 1F1B's 2(p-s-1) warm-up forwards, without flushes",
          in_flight_bound(eager_warmup))
def eager_one_f_one_b_2bw(problem: Problem) -> Schedule:
    """Eager 1F1B streaming all iterations without flushes (see 1f1b-2bw and eager-1f1b)."""
    return warmup_then_alternate(problem, "eager-1f1b-2bw", eager_warmup,
                                     _without_flush(problem, "eager-1f1b-2bw"))
