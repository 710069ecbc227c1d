"""The full model's memory (its step 4): per activation the choice of the ways the problem allows
(kept, recomputed, offloaded), the lifetimes they hold, each device's limit (a cumulative or a
reservoir, the `memory_model` option), and the highest peak the driver's second phase lowers."""

from __future__ import annotations

from zbopt.core.kinds import FORWARD, OFFLOAD, RECOMPUTE, RELOAD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.ticks import memory_capacity, memory_scale
from zbopt.solvers.cp_parts import Choice, Lifetime, OpVars, lifetime_intervals

__all__ = ["activation_choice_literals", "limited_lifetimes", "peak_memory"]


def activation_choice_literals(model, problem: Problem, ops: dict[Op, OpVars],
                        horizon: int) -> tuple[dict[tuple[int, int], Choice], dict[Op, OpVars]]:
    """Per (stage, microbatch), its `Choice` of the ways the problem allows: recomputed, an optional
    R interval on the compute lane after F and before the input gradient; offloaded, optional O
    and L intervals on the copy lanes, F -> O -> L -> input gradient. And the optional ops'
    variables."""
    backward = problem.input_gradient_kind
    choices, optional = {}, {}

    def run(kind, stage, microbatch, chosen, after: OpVars) -> OpVars:
        op = Op(kind, stage, microbatch)
        size = int(problem.cost(kind, stage, microbatch))
        start = model.NewIntVar(0, horizon, f"start_{op}")
        optional[op] = OpVars(start, start + size, model.NewOptionalFixedSizeIntervalVar(start, size, chosen,
                                                                                         f"op_{op}"))
        model.Add(start >= after.end).OnlyEnforceIf(chosen)
        return optional[op]

    for forward in (op for op in ops if op.kind == FORWARD):
        stage, microbatch = forward.stage, forward.microbatch
        gradient = ops[Op(backward, stage, microbatch)]
        recomputed = offloaded = None
        if problem.recomputation_matters:
            recomputed = model.NewBoolVar(f"recompute_{stage}_{microbatch}")
            recompute = run(RECOMPUTE, stage, microbatch, recomputed, ops[forward])
            model.Add(gradient.start >= recompute.end).OnlyEnforceIf(recomputed)
        if problem.offload_matters:
            offloaded = model.NewBoolVar(f"offload_{stage}_{microbatch}")
            offload = run(OFFLOAD, stage, microbatch, offloaded, ops[forward])
            reload = run(RELOAD, stage, microbatch, offloaded, offload)
            model.Add(gradient.start >= reload.end).OnlyEnforceIf(offloaded)
        ways = [literal for literal in (recomputed, offloaded) if literal is not None]
        if len(ways) == 1:
            kept = ways[0].Not()
        else:
            kept = model.NewBoolVar(f"keep_{stage}_{microbatch}")
            model.AddExactlyOne([kept, *ways])
        choices[stage, microbatch] = Choice(kept, recomputed, offloaded)
    return choices, optional


def limited_lifetimes(model, problem: Problem, table_ops: list[Op], ops: dict[Op, OpVars], horizon: int, choices,
                      memory_model: str, gathered: list[list[Lifetime]]) -> list[list[Lifetime]]:
    """The lifetimes of the activations of `table_ops` (F allocates, see `lifetime_intervals`) and
    `gathered` (FSDP's gathered parameters per device, `model_ends`), each device's within its
    limit where it has one."""
    start = {op: variables.start for op, variables in ops.items()}
    end = {op: variables.end for op, variables in ops.items()}
    lifetimes = lifetime_intervals(model, problem, table_ops, start, end, horizon, choices=choices)
    for held, parameters in zip(lifetimes, gathered, strict=True):
        held.extend(parameters)
    if problem.memory_limit is not None:
        _limit_memory(model, problem, lifetimes, memory_model)
    return lifetimes


def _limit_memory(model, problem: Problem, lifetimes, memory_model: str) -> None:
    """Per device, the activations held at any moment within its limit."""
    unit = memory_scale(problem)
    for device, held in enumerate(lifetimes):
        capacity = memory_capacity(problem.memory_limit[device], unit)
        if capacity >= sum(life.amount for life in held):
            continue  # the limit can never bind on this device
        if memory_model == "cumulative":
            model.AddCumulative([life.interval for life in held], [life.amount for life in held], capacity)
        else:
            times = [moment for life in held for moment in (life.allocated, life.released)]
            changes = [change for life in held for change in (life.amount, -life.amount)]
            always = model.NewConstant(1)
            active = [always if life.presence is None else life.presence for life in held for _ in range(2)]
            model.AddReservoirConstraintWithActive(times, changes, active, 0, capacity)


def peak_memory(model, lifetimes: list[list[Lifetime]]):
    """The highest memory any device holds, as a variable bounding every device's cumulative."""
    peak = model.NewIntVar(0, max(sum(life.amount for life in held) for held in lifetimes), "peak")
    for held in lifetimes:
        model.AddCumulative([life.interval for life in held], [life.amount for life in held], peak)
    return peak
