"""Megatron-LM's interleaved 1F1B (Narayanan et al., SC 2021, §2.2) for v >= 2 chunks per device."""

from __future__ import annotations

from zbopt.errors import ZboptError
from zbopt.kinds import FORWARD
from zbopt.ops import Op
from zbopt.problem import Problem
from zbopt.schedule import Schedule
from zbopt.schedules.common import backward_ops, iteration_microbatches
from zbopt.schedules.registry import register, require


def schedule_table(microbatches: int, chunks: int, group_size: int) -> list[tuple[int, int]]:
    """Megatron's schedule table: the (microbatch, chunk) order every device follows. Microbatches
    go in groups of `group_size`; each group runs through chunk 0, then chunk 1, ...; the last
    group takes whatever microbatches remain.

    >>> schedule_table(3, 2, 2)
    [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    """
    table = []
    for first in range(0, microbatches, group_size):
        group = range(first, min(first + group_size, microbatches))
        table += [(j, chunk) for chunk in range(chunks) for j in group]
    return table


def warmup_count(problem: Problem, device: int, group_size: int) -> int:
    """Megatron's warm-up forwards on a device: 2(p-r-1) + (v-1)·group, at most all m·v of them."""
    p, v = problem.num_devices, problem.chunks_per_device
    return min(2 * (p - device - 1) + (v - 1) * group_size, problem.num_microbatches * v)


def _memory_bound(problem: Problem, microbatch_group_size_per_vp_stage: int | None = None) -> list[float]:
    """Warm-up + 1 (microbatch, chunk) activations in flight, each at most the device's largest."""
    group = microbatch_group_size_per_vp_stage or problem.num_devices
    return [min(warmup_count(problem, d, group) + 1, problem.num_microbatches * problem.chunks_per_device)
            * max(problem.activation_memory[s] for s in stages)
            for d, stages in enumerate(problem.stages_of_device)]


@register("interleaved-1f1b", "Megatron-LM interleaved 1F1B (Narayanan et al., 2021): v chunks, depth-first groups",
          _memory_bound)
def interleaved_one_f_one_b(problem: Problem, microbatch_group_size_per_vp_stage: int | None = None) -> Schedule:
    """Interleaved 1F1B as Megatron-LM runs it: every device walks the schedule table (groups of
    `microbatch_group_size_per_vp_stage` microbatches, default p, through chunk 0, 1, ...) for its
    forwards, and the same table with chunks reversed for its backwards. Device r runs
    2(p-r-1) + (v-1)·group warm-up forwards, then one forward / one backward, then the remaining
    backwards. With m a multiple of p and uniform costs its bubble is (p-1)(F+B) per virtual stage
    cost, 1/v of 1F1B's. Needs v >= 2, loop placement, p <= group and m a multiple of the group
    (Megatron's original rule: with a short last group these orders can deadlock, e.g. p = 4,
    v = 3, m = 5).
    """
    p, v, m = problem.num_devices, problem.chunks_per_device, problem.num_microbatches
    given = microbatch_group_size_per_vp_stage
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise ZboptError(f"interleaved-1f1b option microbatch_group_size_per_vp_stage = {given!r}: "
                         "must be a positive whole number")
    group = given or p
    require(v >= 2, "interleaved-1f1b", "chunks_per_device >= 2 (use 1f1b for one chunk)")
    require(problem.placement == "loop", "interleaved-1f1b", "placement loop (chunk c of device r is stage c·p + r)")
    require(p <= group and m % group == 0, "interleaved-1f1b",
            f"m a multiple of microbatch_group_size_per_vp_stage >= p (got m = {m}, group = {group}, p = {p})")
    table = schedule_table(m, v, group)
    orders = []
    for device in range(p):
        warmup = warmup_count(problem, device, group)
        order: list[Op] = []
        for microbatches in iteration_microbatches(problem):
            first = microbatches.start

            def forward(k: int, device=device, first=first) -> Op:
                j, chunk = table[k]
                return Op(FORWARD, chunk * p + device, first + j)

            def backward(k: int, device=device, first=first) -> list[Op]:
                j, chunk = table[k]
                return backward_ops(problem, (v - 1 - chunk) * p + device, first + j)

            order += [forward(k) for k in range(warmup)]
            for k in range(len(table) - warmup):
                order.append(forward(warmup + k))
                order += backward(k)
            for k in range(len(table) - warmup, len(table)):
                order += backward(k)
        orders.append(order)
    return Schedule(orders)
