"""The published schedules built from their building blocks at the problem's own costs.

`block-NAME` repeats NAME's steady-state cycle with the tightest offsets and period for the
problem's per-stage costs and latency (`zbopt.blocks.published`) and squeezes it without raising
its peak. With uniform costs this is NAME itself (1F1B, ZB-H1, interleaved 1F1B op for op; V-ZB
in makespan and peak); with unequal costs it can be shorter than the hand-written order, whose
warm-up counts assume equal ones. Peak: at most the block's steady-state peak. One iteration.
"""

from __future__ import annotations

from zbopt.blocks import PUBLISHED, block_schedule, published_block, steady_peak
from zbopt.problem import Problem
from zbopt.schedule import Schedule
from zbopt.schedules import classic, interleaved, vshape, zero_bubble  # noqa: F401  (their names come first)
from zbopt.schedules.registry import register, require

BLOCK_PREFIX = "block-"


def _register(name: str) -> None:
    def steady(problem: Problem) -> list[float]:
        return steady_peak(published_block(name, problem))

    def build(problem: Problem) -> Schedule:
        require(problem.iterations == 1, f"{BLOCK_PREFIX}{name}", "iterations = 1 (a block schedule is one iteration)")
        return block_schedule(published_block(name, problem))

    build.__doc__ = f"{name}'s building block at the problem's costs, repeated and squeezed."
    register(f"{BLOCK_PREFIX}{name}", f"{name} built from its building block at the problem's own costs "
                                      "(Qi et al., NeurIPS 2024)", steady)(build)


for _name in PUBLISHED:
    _register(_name)
