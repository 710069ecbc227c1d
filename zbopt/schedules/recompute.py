"""Schedules that recompute activations: Megatron-LM's full recomputation and Mario's.

Megatron-LM's `--recompute-granularity full` keeps only each layer block's input during the
forward and re-runs the forward inside the backward call (its `CheckpointFunction`), so every
(stage, microbatch) is recomputed, and a recompute starts once the backward may start: when the
gradient has arrived. These schedules carry those start times (the simulator verifies them); their
orders timed as soon as possible are what moving each recompute into the bubble before it gives.

Mario (Liu et al., PPoPP 2025, abstract): recomputation "overlapped in the bubbles by moving it
earlier", and, as checkpointing frees memory, "preposing more forward computation into the pipeline
bubbles". `mario-1f1b` applies both to 1F1B: every activation recomputed but the last stage's,
each R as early as its device is free, and eager 1F1B's 2(p - s - 1) warm-up forwards on device s
(ZB-H2's warm-up, Qi et al., ICLR 2024, Fig. 3) as far as the memory limit allows. Which
activations Mario checkpoints and how many forwards it preposes is searched by its scheduler; the
rules here are zbopt's choice: the last stage runs each backward right after its forward, so
recomputing it would save no memory (p = 4, m = 8, 1.5B costs: 629.2 recomputing it, 591.4 not).
"""

from __future__ import annotations

import math

from zbopt.core.errors import NotApplicableError
from zbopt.core.kinds import FORWARD, RECOMPUTE
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import simulate
from zbopt.core.tolerance import memory_ceiling
from zbopt.schedules.classic import one_f_one_b, warmup_then_alternate
from zbopt.schedules.common import backward_ops, iteration_microbatches, serial_peak
from zbopt.schedules.interleaved import interleaved_one_f_one_b
from zbopt.schedules.registry import register, require

__all__ = ["interleaved_one_f_one_b_recompute", "mario_one_f_one_b", "one_f_one_b_recompute", "recompute_everything",
           "serial_recompute"]

_NEEDS = "allow_recompute: true (and checkpoint_memory)"


def _base(name: str, build, problem: Problem, *options) -> Schedule:
    """The schedule `build` makes for `problem`, once recomputation is allowed; a precondition of
    the base schedule is reported under `name`, the schedule asked for."""
    require(problem.recomputation is not None, name, _NEEDS)
    try:
        return build(problem, *options)
    except NotApplicableError as error:
        raise NotApplicableError(f"{name}: {error}") from None


def recompute_everything(problem: Problem, schedule: Schedule, *, in_backward: bool,
                         but_last: bool = False) -> Schedule:
    """`schedule` with R(s, j) inserted directly before every B(s, j) (or BW): each activation
    recomputed (`but_last`: but the last stage's), nothing else moved. `in_backward`: with
    Megatron's start times, each R starting when its backward could have started without it (the
    schedule timed with every backward costing R more), its backward right after it."""
    last = problem.num_stages - 1 if but_last else None
    orders = []
    for order in schedule.orders:
        recomputing: list[Op] = []
        for op in order:
            if op.kind == problem.input_gradient_kind and op.stage != last:
                recomputing.append(Op(RECOMPUTE, op.stage, op.microbatch))
            recomputing.append(op)
        orders.append(recomputing)
    if not in_backward:
        return Schedule(orders)
    stages = range(problem.num_stages)
    with_recompute = problem.replace(
        backward_times=[problem.backward_times[s] + problem.recomputation.times[s] for s in stages],
        allow_recompute=False, recompute_times=None, checkpoint_memory=None, memory_limit=None)
    timed = simulate(with_recompute, schedule)
    times = []
    for order in orders:
        device_times = []
        for op in order:
            if op.kind == RECOMPUTE:
                device_times.append(timed.times_of(Op(problem.input_gradient_kind, op.stage, op.microbatch))[0])
            elif op.kind == problem.input_gradient_kind:
                device_times.append(timed.times_of(op)[0] + problem.recomputation.times[op.stage])
            else:
                device_times.append(timed.times_of(op)[0])
        times.append(device_times)
    return Schedule(orders, times)


def _one_f_one_b_memory(problem: Problem) -> list[float]:
    """Device s holds k = min(p - s, m) microbatches at once in 1F1B: with all recomputed, k - 1
    checkpoints and one whole activation (the one being recomputed; W follows its B at once)."""
    p = problem.num_devices
    m = problem.num_microbatches if problem.flush else problem.total_microbatches
    checkpoint = problem.recomputation.checkpoint_memory
    return [(min(p - s, m) - 1) * checkpoint[s] + problem.activation_memory[s] for s in range(p)]


@register("1f1b-recompute", "1F1B with full recomputation (Megatron-LM --recompute-granularity full): "
                            "R before every backward", _one_f_one_b_memory)
def one_f_one_b_recompute(problem: Problem) -> Schedule:
    """1F1B (see `1f1b`) recomputing every activation. Needs v = 1 and allow_recompute."""
    return recompute_everything(problem, _base("1f1b-recompute", one_f_one_b, problem), in_backward=True)


@register("interleaved-1f1b-recompute", "Megatron-LM interleaved 1F1B with full recomputation: R before every "
                                        "backward")
def interleaved_one_f_one_b_recompute(problem: Problem, microbatch_group_size_per_vp_stage: int | None = None
                                      ) -> Schedule:
    """Interleaved 1F1B (see `interleaved-1f1b`) recomputing every activation. Needs
    allow_recompute."""
    base = _base("interleaved-1f1b-recompute", interleaved_one_f_one_b, problem, microbatch_group_size_per_vp_stage)
    return recompute_everything(problem, base, in_backward=True)


def _mario_warmups(problem: Problem) -> list[int]:
    """Warm-up forwards per device: eager 1F1B's 2(p - s - 1), fewer where the limit cannot hold
    that many checkpoints plus the activation being recomputed, and never more than the device
    before it (device s + 1 waits for w_(s+1) + 1 forwards before its first backward, which device
    s sends only if w_s >= w_(s+1))."""
    warmups: list[int] = []
    for stage in range(problem.num_devices):
        warmup = 2 * (problem.num_devices - stage - 1)
        checkpoint = problem.recomputation.checkpoint_memory[stage]
        room = memory_ceiling(problem.memory_caps[stage]) - problem.activation_memory[stage]
        if checkpoint > 0 and not math.isinf(room):
            warmup = max(0, min(warmup, math.floor(room / checkpoint + 1e-9)))
        warmups.append(min(warmup, warmups[-1]) if warmups else warmup)
    return warmups


def _mario_memory(problem: Problem) -> list[float]:
    """Device s holds at most its warm-up's checkpoints (fewer with fewer microbatches) and the
    activation being recomputed (the last, with no warm-up, one activation at a time)."""
    m = problem.num_microbatches
    return [min(warmup, m - 1) * problem.recomputation.checkpoint_memory[s] + problem.activation_memory[s]
            for s, warmup in enumerate(_mario_warmups(problem))]


@register("mario-1f1b", "Mario (Liu et al., PPoPP 2025) on 1F1B: every activation but the last stage's "
                        "recomputed, R in the bubbles, more warm-up forwards as memory allows", _mario_memory)
def mario_one_f_one_b(problem: Problem) -> Schedule:
    """See the module docstring. Needs v = 1 and allow_recompute. Device s holds at most
    w·c + M_B (w its warm-up forwards, c the checkpoint)."""
    require(problem.recomputation is not None, "mario-1f1b", _NEEDS)
    warmups = _mario_warmups(problem)
    base = warmup_then_alternate(problem, "mario-1f1b", lambda device, _: warmups[device],
                                 iteration_microbatches(problem))
    return recompute_everything(problem, base, in_backward=False, but_last=True)


@register("serial-recompute", "zbopt's fallback at the least limit with recomputation: one microbatch at a time, "
                              "every stage but the last recomputed",
          lambda problem: serial_peak(problem, lambda plain: plain.recomputation_floor))
def serial_recompute(problem: Problem) -> Schedule:
    """Each device runs microbatch j's forwards on its stages, then for each of its stages from the
    last down R (but on the last stage), B and W, before anything of microbatch j + 1: a device then
    holds at most one stage's activation and the checkpoints of its earlier stages, the least limit
    with recomputation (`Problem.recomputation_floor`; with FSDP, the least that keeps its parameters,
    and all its gradients held until their reductions: `serial_peak`). Slow, but it fits where nothing
    else does (V shapes near that limit), so the optimizer has a warm start at any limit from there
    up. Any v and placement; needs allow_recompute."""
    require(problem.recomputation is not None, "serial-recompute", _NEEDS)
    last = problem.num_stages - 1
    orders: list[list[Op]] = []
    for stages in problem.stages_of_device:
        order: list[Op] = []
        for microbatch in range(problem.total_microbatches):
            order += [Op(FORWARD, stage, microbatch) for stage in stages]
            for stage in reversed(stages):
                if stage != last:
                    order.append(Op(RECOMPUTE, stage, microbatch))
                order += backward_ops(problem, stage, microbatch)
        orders.append(order)
    return Schedule(orders)
