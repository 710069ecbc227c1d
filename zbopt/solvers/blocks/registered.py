"""The published schedules built from their building blocks at the problem's own costs, registered
as schedules (the registry is on the floor below and never names this one: `zbopt/__init__` has
it load this module before its first lookup).

`block-NAME` repeats NAME's steady-state cycle with the tightest offsets and period for the
problem's per-stage costs and latency (`zbopt.solvers.blocks.published`) and squeezes it without raising
its peak. With uniform costs this is NAME itself (1F1B, ZB-H1, interleaved 1F1B op for op; V-ZB
in makespan and peak); with unequal costs it can be shorter than the hand-written order, whose
warm-up counts assume equal ones. Peak: at most the block's steady-state peak. One iteration.
Where microbatches differ, the block is built and squeezed at the per-stage values (what every
heuristic plans with) and its orders are timed with each microbatch's own costs.
"""

from __future__ import annotations

from zbopt.core.problem import Problem
from zbopt.core.problem.microbatches import EQUAL_MICROBATCHES
from zbopt.core.schedule import Schedule
from zbopt.schedules.registry import get, register, registered, require
from zbopt.solvers.blocks.build import block_schedule
from zbopt.solvers.blocks.model import steady_peak
from zbopt.solvers.blocks.published import PUBLISHED, published_block

__all__ = ["BLOCK_PREFIX"]

BLOCK_PREFIX = "block-"


def _last_of_their_families() -> str:
    """The schedule the block-built ones are listed after: the last one registered by the modules
    of the published schedules they build."""
    modules = {get(name).generator.__module__ for name in PUBLISHED}
    return [entry.name for entry in registered() if entry.generator.__module__ in modules][-1]


def _register(name: str, after: str) -> str:
    """Register block-`name` right after the schedule `after`; its name."""

    def steady(problem: Problem) -> list[float]:
        return steady_peak(published_block(name, problem))

    def build(problem: Problem) -> Schedule:
        require(problem.iterations == 1, f"{BLOCK_PREFIX}{name}", "iterations = 1 (a block schedule is one iteration)")
        if problem.microbatches_equal:
            return block_schedule(published_block(name, problem))
        planned = problem.replace(**EQUAL_MICROBATCHES)  # a block's offsets hold for equal costs only
        return block_schedule(published_block(name, planned)).without_times()

    build.__doc__ = f"{name}'s building block at the problem's costs, repeated and squeezed."
    register(f"{BLOCK_PREFIX}{name}", f"{name} built from its building block at the problem's own costs "
                                      "(Qi et al., NeurIPS 2024)", steady, after=after)(build)
    return f"{BLOCK_PREFIX}{name}"


_after = _last_of_their_families()
for _name in PUBLISHED:
    _after = _register(_name, _after)
