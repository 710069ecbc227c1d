"""Megatron-LM's interleaved 1F1B (Narayanan et al., SC 2021, §2.2) for v >= 2 chunks per device."""

from __future__ import annotations

from collections.abc import Callable

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


def warmup_count(problem: Problem, device: int, group_size: int, extra: int = 0) -> int:
    """Megatron's warm-up forwards on a device: 2(p-r-1) + (v-1)·group (+ `extra`, one with its
    combined 1F1B), at most all m·v of them."""
    p, v = problem.num_devices, problem.chunks_per_device
    return min(2 * (p - device - 1) + (v - 1) * group_size + extra, problem.num_microbatches * v)


def memory_bound(extra: int = 0) -> Callable[..., list[float]]:
    """Peak bound of a table schedule with `extra` more warm-up forwards: warm-up + 1 (microbatch,
    chunk) activations in flight, each at most the device's largest."""

    def bound(problem: Problem, microbatch_group_size_per_vp_stage: int | None = None) -> list[float]:
        group = microbatch_group_size_per_vp_stage or problem.num_devices
        return [min(warmup_count(problem, d, group, extra) + 1, problem.num_microbatches * problem.chunks_per_device)
                * max(problem.activation_memory[s] for s in stages)
                for d, stages in enumerate(problem.stages_of_device)]

    return bound


def checked_group(problem: Problem, name: str, given: object) -> int:
    """The microbatch group size (default p) of a table schedule, once the problem is one it serves:
    v >= 2, loop placement, p <= group and m a multiple of the group."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise ZboptError(f"{name} option microbatch_group_size_per_vp_stage = {given!r}: "
                         "must be a positive whole number")
    p, v, m = problem.num_devices, problem.chunks_per_device, problem.num_microbatches
    group = given or p
    require(v >= 2, name, "chunks_per_device >= 2 (use 1f1b for one chunk)")
    require(problem.placement == "loop", name, "placement loop (chunk c of device r is stage c·p + r)")
    require(p <= group and m % group == 0, name,
            f"m a multiple of microbatch_group_size_per_vp_stage >= p (got m = {m}, group = {group}, p = {p})")
    return group


def table_passes(problem: Problem, device: int, group: int, microbatches: range) -> tuple[list[Op], list[list[Op]]]:
    """One iteration's forwards on `device` in schedule-table order, and its backwards (each one's
    ops) in the same table with the chunks reversed."""
    p, v = problem.num_devices, problem.chunks_per_device
    table = schedule_table(len(microbatches), v, group)
    forwards = [Op(FORWARD, chunk * p + device, microbatches[j]) for j, chunk in table]
    backwards = [backward_ops(problem, (v - 1 - chunk) * p + device, microbatches[j]) for j, chunk in table]
    return forwards, backwards


@register("interleaved-1f1b", "Megatron-LM interleaved 1F1B (Narayanan et al., 2021): v chunks, depth-first groups",
          memory_bound())
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
    group = checked_group(problem, "interleaved-1f1b", microbatch_group_size_per_vp_stage)
    orders = []
    for device in range(problem.num_devices):
        warmup = warmup_count(problem, device, group)
        order: list[Op] = []
        for microbatches in iteration_microbatches(problem):
            forwards, backwards = table_passes(problem, device, group, microbatches)
            order += forwards[:warmup]
            for forward, backward in zip(forwards[warmup:], backwards, strict=False):
                order += [forward, *backward]
            for backward in backwards[len(backwards) - warmup:]:
                order += backward
        orders.append(order)
    return Schedule(orders)
