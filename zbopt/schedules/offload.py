"""Schedules that offload activations to host memory: PipeOffload's rule, and a serial fallback.

PipeOffload (Wan et al., ICML 2025; the Zero Bubble repository's
`megatron/core/pipeline_parallel/zerobubble/scheduler/offloading.py`, `add_offload_in_schedule`)
adds copies to a schedule without moving its compute: each activation flagged for offload is
copied out once its F has ended and the device-to-host stream is free, in forward order, and
copied back, planned from the end in reverse backward order, to be in place one backward's
length before its B (the file's "buffer for robustness"). An activation whose B comes less than
3 (offload + reload) after that is not offloaded (the same file's rule for invalid keys). The
compute keeps its times, so the makespan is the base schedule's; only memory drops.

What zbopt chose where the file is not the rule: every activation is a candidate (the file takes
the flags a schedule generator set); one whose copies do not fit the lanes in time is kept (the
file asserts instead); with a shared host link, the pair's copies take turns on one lane each way
as they come (the file gives the pair fixed alternating slots, a period of offload + reload).
"""

from __future__ import annotations

from zbopt.errors import NotApplicableError
from zbopt.ops import Op
from zbopt.problem import FORWARD, OFFLOAD, RELOAD, Problem
from zbopt.schedule import Schedule
from zbopt.schedules.common import backward_ops, schedule_from_starts
from zbopt.schedules.registry import generate, register, require
from zbopt.simulate import simulate

_NEEDS = "allow_offload: true (and offload_times)"
ROBUSTNESS_COPIES = 3  # offloading.py: an activation is offloaded only if its gap exceeds 3 (offload + reload)


def _link(problem: Problem, device: int) -> int:
    """The host link a device's copies use: its own, or its pair's with a shared link."""
    return device // 2 if problem.shared_host_link else device


def _default_base(problem: Problem) -> str:
    return "1f1b" if problem.chunks_per_device == 1 else "interleaved-1f1b"


@register("pipeoffload", "PipeOffload (Wan et al., ICML 2025) on a base schedule (default 1f1b, interleaved-1f1b "
                         "for v > 1): its compute unchanged, activations copied out after F and back one B early")
def pipeoffload(problem: Problem, base: str | None = None) -> Schedule:
    """See the module docstring. `base`: the registered schedule whose compute is kept (timed
    without the memory limit, which the copies are there to meet). Needs allow_offload."""
    require(problem.allow_offload, "pipeoffload", _NEEDS)
    name = base or _default_base(problem)
    unlimited = problem.replace(memory_limit=None)
    try:
        timed = simulate(unlimited, generate(name, unlimited))
    except NotApplicableError as error:
        raise NotApplicableError(f"pipeoffload: {error}") from None
    if timed.table.recomputed or timed.table.offloaded:
        raise NotApplicableError(f"pipeoffload: base schedule '{name}' already recomputes or offloads")
    starts = {op: timed.times_of(op)[0] for op in timed.table.ops()}
    gradient = problem.input_gradient_kind
    candidates = []  # (forward end, backward start, backward length, stage, microbatch)
    for stage in range(problem.num_stages):
        for microbatch in range(problem.total_microbatches):
            forward_end = timed.times_of(Op(FORWARD, stage, microbatch))[1]
            backward_start, backward_end = timed.times_of(Op(gradient, stage, microbatch))
            copies = problem.offload_times[stage] + problem.reload_times[stage]
            if backward_start - (backward_end - backward_start) - forward_end > ROBUSTNESS_COPIES * copies:
                candidates.append((forward_end, backward_start, backward_end - backward_start, stage, microbatch))
    out_free: dict[int, float] = {}
    offloaded = {}  # (stage, microbatch) -> offload end
    for forward_end, _, _, stage, microbatch in sorted(candidates):
        lane = _link(problem, problem.device_of(stage))
        begin = max(forward_end, out_free.get(lane, 0.0))
        out_free[lane] = offloaded[stage, microbatch] = begin + problem.offload_times[stage]
        starts[Op(OFFLOAD, stage, microbatch)] = begin
    in_free: dict[int, float] = {}  # per link, the start of the earliest reload planned so far
    for _, backward_start, length, stage, microbatch in sorted(candidates, key=lambda c: c[1], reverse=True):
        lane = _link(problem, problem.device_of(stage))
        begin = min(backward_start - length, in_free.get(lane, backward_start)) - problem.reload_times[stage]
        if begin < offloaded[stage, microbatch]:  # no room for both copies in time: kept
            del starts[Op(OFFLOAD, stage, microbatch)]
            continue
        in_free[lane] = starts[Op(RELOAD, stage, microbatch)] = begin
    return schedule_from_starts(problem, starts, "pipeoffload", timed=True)


@register("serial-offload", "zbopt's fallback at the least limit with offload: one microbatch at a time, every "
                            "activation offloaded but the last stage's", lambda problem: problem.min_memory_limit)
def serial_offload(problem: Problem) -> Schedule:
    """Microbatch by microbatch, its forwards stage by stage, each activation but the last stage's
    offloaded before the device's next forward starts, then its backwards, each reloaded once the
    device has freed the one before: a device holds at most one stage's activation, the least
    limit with offload (`Problem.min_memory_limit`). Slow, but it fits where nothing else does, so
    the optimizer always has a warm start. Any v and placement; needs allow_offload."""
    require(problem.allow_offload, "serial-offload", _NEEDS)
    last = problem.num_stages - 1
    starts: dict[Op, float] = {}
    now = 0.0  # everything of the microbatches before has ended
    compute_free = [0.0] * problem.num_devices
    out_free: dict[int, float] = {}
    in_free: dict[int, float] = {}
    held_until = [0.0] * problem.num_devices  # when the device's last activation was freed

    def run(op: Op, ready: float) -> float:
        device = problem.device_of(op.stage)
        starts[op] = begin = max(ready, compute_free[device])
        compute_free[device] = begin + problem.cost(op.kind, op.stage)
        return compute_free[device]

    def copy(op: Op, ready: float, lanes: dict[int, float]) -> float:
        lane = _link(problem, problem.device_of(op.stage))
        starts[op] = begin = max(ready, lanes.get(lane, 0.0))
        lanes[lane] = begin + problem.cost(op.kind, op.stage)
        return lanes[lane]

    for microbatch in range(problem.total_microbatches):
        arrival = now
        for stage in range(problem.num_stages):
            device = problem.device_of(stage)
            if stage and problem.device_of(stage - 1) != device:
                arrival += problem.p2p_time
            arrival = run(Op(FORWARD, stage, microbatch), max(arrival, held_until[device]))
            if stage != last:
                held_until[device] = copy(Op(OFFLOAD, stage, microbatch), arrival, out_free)
        for stage in range(last, -1, -1):
            device = problem.device_of(stage)
            if stage != last:
                if problem.device_of(stage + 1) != device:
                    arrival += problem.p2p_time
                offload_end = starts[Op(OFFLOAD, stage, microbatch)] + problem.offload_times[stage]
                reloaded = copy(Op(RELOAD, stage, microbatch), max(offload_end, held_until[device]), in_free)
                arrival = max(arrival, reloaded)
            ops = backward_ops(problem, stage, microbatch)
            arrival = run(ops[0], arrival)
            held_until[device] = arrival
            for op in ops[1:]:
                held_until[device] = run(op, held_until[device])
        now = max(compute_free)
        compute_free = [now] * problem.num_devices
    return schedule_from_starts(problem, starts, "serial-offload", timed=True)
