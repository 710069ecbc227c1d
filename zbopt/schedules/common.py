"""Small pieces every schedule family builds its orders from."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from zbopt.core.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, SIDE_KINDS, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.core.ticks import gradients_wait
from zbopt.schedules.registry import require

__all__ = [
    "alternate_passes",
    "backward_ops",
    "block_memory",
    "chunk_activations",
    "gradient_modes",
    "input_gradient",
    "iteration_microbatches",
    "passes_to_schedule",
    "repeat_per_iteration",
    "require_two_ways",
    "require_v_shape",
    "schedule_from_starts",
    "serial_peak",
]


def backward_ops(problem: Problem, stage: int, microbatch: int) -> list[Op]:
    """The backward of one microbatch on one stage: [B, W] back to back when split, else [BW]."""
    if problem.split_backward:
        return [Op(BACKWARD, stage, microbatch), Op(WEIGHT, stage, microbatch)]
    return [Op(FUSED_BACKWARD, stage, microbatch)]


def alternate_passes(forwards: list[Op], backwards: list[list[Op]], warmup: int) -> list[Op]:
    """1F1B's walk over one device's passes: min(warmup, all) forwards, then each further forward
    followed by the oldest backward (its ops) not run yet, then the remaining backwards."""
    count = min(warmup, len(forwards))
    order = list(forwards[:count])
    for forward, backward in zip(forwards[count:], backwards, strict=False):
        order += [forward, *backward]
    for backward in backwards[len(backwards) - count:]:
        order += backward
    return order


def require_two_ways(problem: Problem, name: str, chunks: int, group: str | None = None) -> None:
    """NotApplicableError unless `problem` has what two pipelines in opposite directions merged
    without conflict need (DualPipe, Chimera, BitPipe): the bidirectional placement with `chunks`
    chunks per device, an even p and, with a `group` named, m a multiple of p (whole groups of
    p/2 microbatches each way)."""
    require(problem.bidirectional, name, "placement 'bidirectional' (two pipelines in opposite directions)")
    require(problem.chunks_per_device == chunks, name, f"chunks_per_device = {chunks} ({chunks // 2} of each "
                                                       f"pipeline per device; got {problem.chunks_per_device})")
    p, m = problem.num_devices, problem.num_microbatches
    require(p % 2 == 0, name, f"an even num_devices (got p = {p})")
    require(group is None or m % p == 0, name, f"num_microbatches a multiple of num_devices ({group} of p; got "
                                               f"m = {m}, p = {p})")


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


def schedule_from_starts(problem: Problem, starts: dict[Op, float], name: str, timed: bool = False,
                         pairs: tuple[tuple[Op, ...], ...] = ()) -> Schedule:
    """Per device, its compute ops ordered by their start times (a device computes one op at a
    time; the members of an overlapped pair in `pairs` start together, the forward first), each
    op beside compute (a copy O or L, a re-gather G) after the compute ops that ended by its
    start, where a runtime issues it
    (`simulate`). `timed`: the schedule carries `starts`, which a wait for memory needs (a forward
    until an offload has freed room; the order alone starts it as soon as possible)."""
    compute: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    copies: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    place_in_pair = {op: place for members in pairs for place, op in enumerate(members)}
    for op in sorted(starts, key=lambda op: (starts[op], place_in_pair.get(op, 0))):
        (copies if op.kind in SIDE_KINDS else compute)[problem.device_of(op.stage)].append(op)
    orders = []
    for ops, device_copies in zip(compute, copies, strict=True):
        ends = [starts[op] + problem.cost(op.kind, op.stage) for op in ops]
        tolerance = 1e-9 * max(1.0, *ends) if ends else 0.0
        order, placed = [], 0
        for copy in device_copies:  # in start order; `ends` is increasing
            issued = bisect.bisect_right(ends, starts[copy] + tolerance)
            order.extend(ops[placed:issued])
            placed = max(placed, issued)
            order.append(copy)
        orders.append(order + ops[placed:])
    times = [[starts[op] for op in order] for order in orders] if timed else None
    return Schedule(orders, times, name=name, pairs=pairs)


def gradient_modes(problem: Problem) -> tuple[bool, ...]:
    """The ways a plan that caps its forwards only may count FSDP's unsharded gradients (`Timeline`'s
    `gradients_throughout`): from the start it stays within its caps; from each stage's first
    gradient op it leaves more room, which may pay, but may break a cap at a first W (it takes the
    gradients at its start). Both where they are held under a limit (`gradients_wait`): the plan
    tries each and the simulator judges; else the first."""
    return (True, False) if gradients_wait(problem) else (True,)


def serial_peak(problem: Problem, floor: Callable[[Problem], tuple[float, ...]]) -> tuple[float, ...]:
    """Per device, the peak a generator that runs one microbatch at a time and lists no G promises:
    the `floor` (`Problem.min_memory_limit` or `recomputation_floor`) of the problem without re-gathers
    (FSDP's parameters held from their unshard to their stage's last gradient op) and without
    gradients held until their reduction (the limit set aside, which may be below the floor
    then), plus all the device's gradients (`gradient_memory`): from a stage's first gradient op
    on, they stay through the later microbatches."""
    ends = problem.iteration_ends
    gradients = (0.0,) * problem.num_stages if ends is None else ends.gradient_memory
    plain = problem.replace(allow_reshard=False, memory_limit=None, gradient_memory=None) \
        if problem.allow_reshard or any(gradients) else problem
    return tuple(peak + sum(gradients[stage] for stage in stages)
                 for peak, stages in zip(floor(plain), problem.stages_of_device, strict=True))


def require_v_shape(problem: Problem, name: str) -> None:
    """NotApplicableError unless the problem is what every V-shape schedule and block is written
    for: V placement, two chunks per device."""
    require(problem.placement == "v" and problem.chunks_per_device == 2, name,
            "placement v and chunks_per_device = 2")


def passes_to_schedule(problem: Problem, orders: list[list[tuple[str, int, int]]]) -> Schedule:
    """V placement, two chunks per device: per-device passes (kind, device-local chunk, microbatch)
    of one iteration -> Ops of every iteration (microbatch ids k·m + j). With a
    fused backward, each B becomes BW and the W's are dropped: memory only falls earlier."""
    iteration_orders = []
    for device, passes in enumerate(orders):
        order = []
        for kind, chunk, microbatch in passes:
            stage = problem.stages_of_device[device][chunk]
            if kind == FORWARD:
                order.append(Op(FORWARD, stage, microbatch))
            elif kind == BACKWARD:
                order.append(input_gradient(problem, stage, microbatch))
            elif problem.split_backward:
                order.append(Op(WEIGHT, stage, microbatch))
        iteration_orders.append(order)
    return repeat_per_iteration(problem, iteration_orders)


def chunk_activations(problem: Problem, device: int) -> tuple[float, float]:
    """activation_memory of the device's chunk 0 and chunk 1."""
    first, second = problem.stages_of_device[device]
    return problem.activation_memory[first], problem.activation_memory[second]


def block_memory(peak: Callable[[int], int]) -> Callable[[Problem], list[float]]:
    """Peak bound of a building-block schedule: at most min(peak(p), 2m) chunk activations per
    device, each at most the larger activation_memory of its two chunks."""

    def bound(problem: Problem) -> list[float]:
        count = min(peak(problem.num_devices), 2 * problem.num_microbatches)
        return [count * max(chunk_activations(problem, device)) for device in range(problem.num_devices)]

    return bound
