"""The tightest block for given per-device cyclic orders: a linear program.

A published schedule's steady state fixes, on every device, the cycle of ops it repeats and which
group of microbatches each op serves (1F1B: F of microbatch c + p-s-1, then B and W of c). Given
those cycles, the block's offsets o and its period P only have to satisfy difference constraints:
    o[y] - o[x] >= duration[x] + latency          (y needs x, same microbatch)
    o[y] - o[x] >= duration[x] + (lag[y] - lag[x]) * P   (y after x in a device's cycle)
and one more per device for the wrap into the next cycle. The smallest P is a linear program
(GLOP, OR-Tools' own: highspy and OR-Tools 9.15 clash in one process, each bundling its HiGHS);
with P fixed, every op as early as the constraints allow is the squeezed block.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.ticks import tick_scale
from zbopt.solvers.blocks.model import Block, BlockError, block_ops, group_table, input_of

__all__ = ["Step", "tightest_block"]

Step = tuple[Op, int]
"""An op of the block (its microbatch field is its place i in the group) and its lag: in cycle c
the device runs it for group c - lag."""


def tightest_block(problem: Problem, cycles: Sequence[Sequence[Step]], group: int = 1, name: str = "") -> Block:
    """The block with the smallest period whose devices repeat `cycles` (one per device, see
    `Step`), every op then as early as it may start; BlockError when the cycles deadlock."""
    ops = block_ops(problem, group)
    lags = {op: lag for cycle in cycles for op, lag in cycle}
    if sorted(lags) != sorted(ops) or sum(map(len, cycles)) != len(ops):
        raise BlockError(f"block {name}: the cycles must hold every op of the group exactly once")
    from ortools.linear_solver import pywraplp  # here: the MILP's child process must not load OR-Tools

    solver = pywraplp.Solver.CreateSolver("GLOP")
    period = solver.NumVar(0, solver.infinity(), "P")
    offset = {op: solver.NumVar(0, solver.infinity(), str(op)) for op in ops}
    for later, earlier, (constant, per_period) in _precedences(problem, cycles, group, lags):
        solver.Add(offset[later] - offset[earlier] - per_period * period >= constant)
    solver.Minimize(period)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise BlockError(f"block {name}: its cycles deadlock (no period lets every op wait for its input)")
    best = period.solution_value()
    period.SetBounds(best, best)
    solver.Minimize(sum(offset.values()))
    solver.Solve()
    scale = tick_scale(problem)

    def snapped(value: float) -> float:
        """Offsets and P add up costs (over a cycle's lags): whole ticks, bar the LP's float noise."""
        ticks = value * scale.ticks_per_unit
        return scale.units(round(ticks)) if abs(ticks - round(ticks)) < 1e-6 else value

    return Block(problem, {op: snapped(offset[op].solution_value()) for op in ops}, snapped(best), group, name)


def _precedences(problem: Problem, cycles, group: int, lags: dict[Op, int]):
    """(later, earlier, (constant, per-period)) for o[later] - o[earlier] >= constant + per-period·P."""
    table = group_table(problem, group)
    for op in lags:
        waited = input_of(table, op)
        if waited is not None:
            before, latency = waited
            yield op, before, (problem.cost(before.kind, before.stage) + latency, 0)
    for cycle in cycles:
        for position, (op, lag) in enumerate(cycle):
            before, before_lag = cycle[position - 1]
            wrap = 1 if position == 0 else 0
            yield op, before, (problem.cost(before.kind, before.stage), lag - before_lag - wrap)
