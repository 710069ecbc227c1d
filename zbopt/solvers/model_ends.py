"""The full model's iteration ends (its step 7, `Problem.iteration_ends`), as the simulator times
them (`zbopt.core.simulation.ends`): per device and iteration a communication lane on which each
stage's reduction follows its gradient ops and the device's unshards, the optimizer step after the
reductions, every forward after its stage's unshard (fixed from time 0 in the first iteration,
after the device's step in a later one), and FSDP's gathered parameters held from each unshard
until the stage's last gradient op of that iteration ends; or, where a re-gather may pay
(`Problem.reshard_matters`) and the model chooses it, until the stage's last forward ends and
again from its G, an optional interval on the device's all-gather lane after the device's
unshards, before the stage's input gradients (and recomputes). The objective is then the last
step's end.

Any order of the reductions on the lane is allowed; the simulator's (as they become ready) ends
the lane no later, so its iteration time is at most the model's. The step follows the device's
compute: its last compute op of an iteration is a gradient op (every op leads to one on its device).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

from zbopt.core.kinds import FORWARD, RECOMPUTE, REGATHER
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshard_windows
from zbopt.core.ticks import memory_rounding, memory_scale
from zbopt.solvers.cp_parts import Lifetime, OpVars

__all__ = ["PlacedEnds", "fsdp_lifetimes", "placed_ends"]


class PlacedEnds(NamedTuple):
    """The ends' variables `fsdp_lifetimes` reads: per device, per iteration, its step's end; per
    iteration, per virtual stage, its reduction's end."""

    steps_done: list[list]
    reduced: list[list]


def placed_ends(model, problem: Problem, ops: dict[Op, OpVars], horizon: int, memory_counts: bool) -> PlacedEnds:
    """The ends' variables and constraints (`problem` in ticks): the makespan objective's goal is
    at least each device's last step's end. Where gradients are held until their reduction
    (`gradient_memory`) and the model counts memory (`memory_counts`: a limit, or the second
    phase's peak), a device's reductions run in the simulator's order (`_in_ready_order`)."""
    ends, gathered = problem.iteration_ends, _unshards_through(problem)
    steps_done = []
    reduced = [[None] * problem.num_stages for _ in range(problem.iterations)]
    for device, stages in enumerate(problem.stages_of_device):
        lane, done = [], [0]  # per iteration, the step's end before it (0 before the first)
        for iteration in range(problem.iterations):
            for stage in (stage for stage in stages if iteration or gathered[stage]):
                for microbatch in _iteration_microbatches(problem, stage, iteration):  # after its unshard
                    model.Add(ops[Op(FORWARD, stage, microbatch)].start >= done[-1] + gathered[stage])
            step = model.NewIntVar(0, horizon, f"step_{device}_{iteration}")
            reduces = {}
            for stage in stages:
                reduce = reduces[stage] = model.NewIntVar(0, horizon, f"reduce_{stage}_{iteration}")
                model.Add(reduce >= done[-1] + gathered[stages[-1]])
                for gradient_end in _gradient_ends(problem, ops, stage, iteration):
                    model.Add(reduce >= gradient_end)
                lane.append(model.NewFixedSizeIntervalVar(reduce, int(ends.reduce_times[stage]), f"reduce_{stage}"))
                model.Add(step >= reduce + int(ends.reduce_times[stage]))
                reduced[iteration][stage] = reduce + int(ends.reduce_times[stage])
            if memory_counts and any(ends.gradient_memory):
                _in_ready_order(model, problem, ops, reduces, iteration, horizon)
            done.append(step + int(ends.step_times[device]))
        model.AddNoOverlap(lane)
        steps_done.append(done[1:])
    return PlacedEnds(steps_done, reduced)


def _in_ready_order(model, problem: Problem, ops: dict[Op, OpVars], reduces: dict, iteration: int,
                    horizon: int) -> None:
    """A device's reductions of one iteration (`reduces`: stage -> start) in the order their stages'
    last gradient ops end, the lower stage first at a tie: the simulator's (`device_ends`). Any
    order ends the lane as late or later, so this loses no iteration time; it matters where a
    reduction's end frees gradients, whose memory then is the simulator's."""
    ready = {}
    for stage in reduces:
        ready[stage] = model.NewIntVar(0, horizon, f"ready_{stage}_{iteration}")
        model.AddMaxEquality(ready[stage], _gradient_ends(problem, ops, stage, iteration))
    for first, second in itertools.combinations(sorted(reduces), 2):
        before = model.NewBoolVar(f"reduce_{first}_before_{second}_{iteration}")
        model.Add(ready[first] <= ready[second]).OnlyEnforceIf(before)
        model.Add(ready[first] > ready[second]).OnlyEnforceIf(before.Not())
        times = problem.iteration_ends.reduce_times
        model.Add(reduces[second] >= reduces[first] + int(times[first])).OnlyEnforceIf(before)
        model.Add(reduces[first] >= reduces[second] + int(times[second])).OnlyEnforceIf(before.Not())


def fsdp_lifetimes(model, problem: Problem, ops: dict[Op, OpVars], horizon: int,
                   placed: PlacedEnds) -> tuple[list[list[Lifetime]], dict[Op, object]]:
    """Per device, FSDP's memory as `Lifetime`s, in each iteration: each stage's gathered parameters
    (`_gathered_parameters`) and its unsharded gradients, from its first gradient op's start until
    its reduction's end; and each chosen re-gather's literal."""
    held: list[list[Lifetime]] = [[] for _ in range(problem.num_devices)]
    chosen: dict[Op, object] = {}
    ends = problem.iteration_ends
    if ends is None:
        return held, chosen
    unit = memory_scale(problem)
    rounding = memory_rounding(problem, unit)

    def ticks(amount: float) -> int:
        return rounding(amount * unit)

    if any(ends.unshard_memory):
        _gathered_parameters(model, problem, ops, horizon, placed.steps_done, ticks, held, chosen)
    gradient = problem.gradient_kind
    for stage in (stage for stage in range(problem.num_stages) if ends.gradient_memory[stage]):
        size = ticks(ends.gradient_memory[stage])
        for iteration in range(problem.iterations):
            allocated = model.NewIntVar(0, horizon, f"gradients_{stage}_{iteration}")
            model.AddMinEquality(allocated, [ops[Op(gradient, stage, microbatch)].start
                                             for microbatch in _iteration_microbatches(problem, stage, iteration)])
            held[problem.device_of(stage)].append(_lifetime(model, allocated, placed.reduced[iteration][stage], size,
                                                            None, f"gradients_{stage}_{iteration}", horizon))
    return held, chosen


def _gathered_parameters(model, problem: Problem, ops: dict[Op, OpVars], horizon: int, steps_done: list[list],
                         ticks, held: list[list[Lifetime]], chosen: dict[Op, object]) -> None:
    """Into `held`, per device, FSDP's gathered parameters of each of its stages in each iteration:
    from the unshard's start (after the device's step before, `placed_ends`) until the stage's
    last gradient op of the iteration ends, or split around a chosen re-gather (`_regather`, whose
    variables join `ops` and whose literal joins `chosen`); `ticks` turns an amount into memory ticks."""
    ends = problem.iteration_ends
    gathered = _unshards_through(problem)
    for device, stages in enumerate(problem.stages_of_device):
        lane = []  # the device's re-gathers, one at a time
        for stage in (stage for stage in stages if ends.unshard_memory[stage]):
            size = ticks(ends.unshard_memory[stage])
            for iteration in range(problem.iterations):
                step_before = steps_done[device][iteration - 1] if iteration else 0
                allocated = model.NewIntVar(0, horizon, f"gather_{stage}_{iteration}")
                model.Add(allocated == step_before + gathered[stage] - int(ends.unshard_times[stage]))
                released = model.NewIntVar(0, horizon, f"reshard_{stage}_{iteration}")
                model.AddMaxEquality(released, _gradient_ends(problem, ops, stage, iteration))
                name = f"gathered_{stage}_{iteration}"
                if not problem.reshard_matters:
                    held[device].append(_lifetime(model, allocated, released, size, None, name, horizon))
                    continue
                regather = Op(REGATHER, stage, iteration * problem.num_microbatches)
                literal, forwards_done = _regather(model, problem, ops, regather, step_before + gathered[stages[-1]],
                                                   horizon)
                chosen[regather] = literal
                lane.append(ops[regather].interval)
                held[device] += [_lifetime(model, allocated, released, size, literal.Not(), name, horizon),
                                 _lifetime(model, allocated, forwards_done, size, literal, f"{name}_forwards", horizon),
                                 _lifetime(model, ops[regather].start, released, size, literal, f"{name}_again",
                                           horizon)]
        model.AddNoOverlap(lane)


def _regather(model, problem: Problem, ops: dict[Op, OpVars], regather: Op, lane_free,
              horizon: int) -> tuple[object, object]:
    """A stage's optional re-gather in one iteration (its literal, and when the stage's last forward
    of the iteration ends): on the all-gather lane from `lane_free` (the device's unshards done),
    after those forwards, before the iteration's input gradients and recomputes on the stage."""
    stage, iteration = regather.stage, regather.microbatch // problem.num_microbatches
    literal = model.NewBoolVar(f"regather_{stage}_{iteration}")
    duration = int(problem.iteration_ends.unshard_times[stage])
    start = model.NewIntVar(0, max(0, horizon - duration), f"start_{regather}")
    ops[regather] = OpVars(start, start + duration,
                           model.NewOptionalFixedSizeIntervalVar(start, duration, literal, f"op_{regather}"))
    microbatches = _iteration_microbatches(problem, stage, iteration)
    forwards_done = model.NewIntVar(0, horizon, f"forwards_done_{stage}_{iteration}")
    model.AddMaxEquality(forwards_done, [ops[Op(FORWARD, stage, j)].end for j in microbatches])
    model.Add(start >= forwards_done).OnlyEnforceIf(literal)
    model.Add(start >= lane_free).OnlyEnforceIf(literal)
    for microbatch in microbatches:
        for kind in (problem.input_gradient_kind, RECOMPUTE):
            if Op(kind, stage, microbatch) in ops:
                model.Add(ops[Op(kind, stage, microbatch)].start >= start + duration).OnlyEnforceIf(literal)
    return literal, forwards_done


def _lifetime(model, allocated, released, size: int, presence, name: str, horizon: int) -> Lifetime:
    """Gathered parameters of `size` memory ticks held from `allocated` to `released` (while `presence`
    holds, or always where it is None)."""
    length = model.NewIntVar(0, horizon, f"held_{name}")
    if presence is None:
        interval = model.NewIntervalVar(allocated, length, released, name)
    else:
        interval = model.NewOptionalIntervalVar(allocated, length, released, presence, name)
    return Lifetime(allocated, released, size, interval, presence)


def _unshards_through(problem: Problem) -> list[int]:
    """Per stage, its unshard and the ones before it on its device's stream, in ticks: where its
    first iteration's unshard ends (`unshard_windows`), and how long after its device's step a
    later one's does."""
    return [int(end) for _, end in unshard_windows(problem)]


def _iteration_microbatches(problem: Problem, stage: int, iteration: int) -> list[int]:
    """The microbatches of `iteration` that visit `stage`."""
    return [j for j in problem.microbatches_of(stage) if j // problem.num_microbatches == iteration]


def _gradient_ends(problem: Problem, ops: dict[Op, OpVars], stage: int, iteration: int) -> list:
    """The end variables of `stage`'s gradient ops (W, or BW) in `iteration`, one per microbatch:
    its reduction and its reshard follow the last."""
    gradient = problem.gradient_kind
    return [ops[Op(gradient, stage, microbatch)].end
            for microbatch in _iteration_microbatches(problem, stage, iteration)]
