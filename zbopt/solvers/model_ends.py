"""The full model's iteration ends (its step 7, `Problem.iteration_ends`), as the simulator times
them (`zbopt.core.simulation.ends`): per device a communication lane with its unshards fixed from
time 0 and one reduction per stage after the stage's gradient ops, the optimizer step after the
reductions, every forward after its stage's unshard, and FSDP's gathered parameters held until
the stage's last gradient op ends. The objective is then the iteration's end.

Any order of the reductions on the lane is allowed; the simulator's (as they become ready) ends
the lane no later, so its iteration time is at most the model's.
"""

from __future__ import annotations

from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshard_windows
from zbopt.core.ticks import memory_rounding, memory_scale
from zbopt.solvers.cp_parts import Lifetime, OpVars

__all__ = ["gathered_parameters", "iteration_end"]


def iteration_end(model, problem: Problem, ops: dict[Op, OpVars], horizon: int, goal) -> None:
    """`goal` (the model's objective) at least every device's step end; `problem` in ticks."""
    ends = problem.iteration_ends
    table = op_table(problem)
    for op, variables in ops.items():
        release = table.release[table.index(op)]
        if release:
            model.Add(variables.start >= int(release))
    unshard = unshard_windows(problem)
    for device, stages in enumerate(problem.stages_of_device):
        lane = [model.NewFixedSizeIntervalVar(int(unshard[stage][0]), int(ends.unshard_times[stage]),
                                              f"unshard_{stage}") for stage in stages]
        step = model.NewIntVar(0, horizon, f"step_{device}")
        for stage in stages:
            reduce = model.NewIntVar(0, horizon, f"reduce_{stage}")
            for gradient_end in _gradient_ends(problem, ops, stage):
                model.Add(reduce >= gradient_end)
            lane.append(model.NewFixedSizeIntervalVar(reduce, int(ends.reduce_times[stage]), f"reduce_{stage}"))
            model.Add(step >= reduce + int(ends.reduce_times[stage]))
        model.AddNoOverlap(lane)
        model.Add(goal >= step + int(ends.step_times[device]))


def gathered_parameters(model, problem: Problem, ops: dict[Op, OpVars], horizon: int) -> list[list[Lifetime]]:
    """Per device, FSDP's gathered parameters of each of its stages as a `Lifetime`: from the
    unshard's start until the stage's last gradient op ends."""
    held: list[list[Lifetime]] = [[] for _ in range(problem.num_devices)]
    ends = problem.iteration_ends
    if ends is None or not any(ends.unshard_memory):
        return held
    unit = memory_scale(problem)
    amount = memory_rounding(problem, unit)
    unshard = unshard_windows(problem)
    for stage, memory in enumerate(ends.unshard_memory):
        if memory:
            allocated = model.NewConstant(int(unshard[stage][0]))
            released = model.NewIntVar(0, horizon, f"reshard_{stage}")
            model.AddMaxEquality(released, _gradient_ends(problem, ops, stage))
            size = model.NewIntVar(0, horizon, f"gathered_{stage}")
            interval = model.NewIntervalVar(allocated, size, released, f"gathered_{stage}")
            held[problem.device_of(stage)].append(Lifetime(allocated, released, amount(memory * unit), interval, None))
    return held


def _gradient_ends(problem: Problem, ops: dict[Op, OpVars], stage: int) -> list:
    """The end variables of `stage`'s gradient ops (W, or BW), one per microbatch: its reduction
    and its reshard follow the last."""
    gradient = op_table(problem).gradient_kind
    return [ops[Op(gradient, stage, microbatch)].end for microbatch in problem.microbatches_of(stage)]
