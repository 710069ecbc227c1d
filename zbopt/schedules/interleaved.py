"""Interleaved schedules, v >= 2 chunks per device in loop placement, every device walking one
schedule table of (microbatch, chunk) pairs.

- `interleaved-1f1b`: Megatron-LM's interleaved 1F1B (Narayanan et al., SC 2021, §2.2), with
  torch's flexible group (torch 2.13 `ScheduleInterleaved1F1B`): m need not be a multiple of p.
- `torch-zb-interleaved`: torch's `ScheduleInterleavedZeroBubble` (its ZB1P for v chunks, after
  "Zero Bubble Pipeline Parallelism", Qi et al., ICLR 2024): the same table with p-r-1 fewer
  warm-up forwards and device r's W's r backwards late, as ZB-H1 delays them.
"""

from __future__ import annotations

from collections.abc import Callable

from zbopt.core.errors import ZboptError
from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.common import backward_ops, iteration_microbatches
from zbopt.schedules.registry import register, require

__all__ = ["checked_group", "flexible_group", "interleaved_one_f_one_b", "memory_bound", "schedule_table",
           "table_memory", "table_order", "table_passes", "torch_zb_interleaved", "warmup_count"]


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


def flexible_group(problem: Problem) -> int:
    """torch's group size (its `microbatches_per_round`): m split into max(1, m // p) rounds, so
    p when p divides m, all m microbatches when m < p."""
    m = problem.num_microbatches
    return m // max(1, m // problem.num_devices)


def warmup_count(problem: Problem, device: int, group: int, hops: int = 2, extra: int = 0) -> int:
    """Warm-up forwards on a device: (v-1)·group + hops·(p-r-1) (+ `extra`, one with Megatron's
    combined 1F1B), at most all m·v of them (Megatron and torch's interleaved 1F1B: 2 per hop to
    the last device; torch's zero bubble: 1)."""
    p, v = problem.num_devices, problem.chunks_per_device
    return min((v - 1) * group + hops * (p - device - 1) + extra, problem.num_microbatches * v)


def memory_bound(extra: int = 0) -> Callable[..., list[float]]:
    """Peak bound of a table schedule with `extra` more warm-up forwards: warm-up + 1 (microbatch,
    chunk) activations in flight, each at most the device's largest."""

    def bound(problem: Problem, microbatch_group_size_per_vp_stage: int | None = None) -> list[float]:
        group = microbatch_group_size_per_vp_stage or flexible_group(problem)
        return table_memory(problem, [warmup_count(problem, d, group, extra=extra) for d in range(problem.num_devices)])

    return bound


def table_memory(problem: Problem, warmups: list[int]) -> list[float]:
    """Peak bound of a table order with `warmups[d]` warm-up forwards on device d: warm-up + 1
    (microbatch, chunk) activations in flight (at most all m·v), each at most the device's largest."""
    total = problem.num_microbatches * problem.chunks_per_device
    return [min(warmup + 1, total) * max(problem.activation_memory[s] for s in stages)
            for warmup, stages in zip(warmups, problem.stages_of_device, strict=True)]


def checked_group(problem: Problem, name: str, given: object = None) -> int:
    """The group size asked for (or torch's flexible one) once the shape is one the table serves:
    loop placement, v >= 2, m a multiple of the group and a group of at least p or of all m."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise ZboptError(f"{name} option microbatch_group_size_per_vp_stage = {given!r}: "
                         "must be a positive whole number")
    p, v, m = problem.num_devices, problem.chunks_per_device, problem.num_microbatches
    group = given or flexible_group(problem)
    require(v >= 2, name, "chunks_per_device >= 2 (use 1f1b for one chunk)")
    require(problem.placement == "loop", name, "placement loop (chunk c of device r is stage c·p + r)")
    require(m % group == 0 and (group >= p or group == m), name,
            f"m a multiple of microbatch_group_size_per_vp_stage, a group >= p or of all m (got m = {m}, "
            f"group = {group}, p = {p}; shorter groups can deadlock, e.g. p = 4, v = 3, m = 5, group = 4)")
    return group


def table_passes(problem: Problem, device: int, table: list[tuple[int, int]],
                 microbatches: range) -> tuple[list[Op], list[list[Op]]]:
    """One iteration's forwards on `device` in the order of `table` ((microbatch, device-local
    chunk) pairs, e.g. `schedule_table`), and its backwards (each one's ops) in the same table
    with the chunks reversed."""
    stages, v = problem.stages_of_device[device], problem.chunks_per_device
    forwards = [Op(FORWARD, stages[chunk], microbatches[j]) for j, chunk in table]
    backwards = [backward_ops(problem, stages[v - 1 - chunk], microbatches[j]) for j, chunk in table]
    return forwards, backwards


def table_order(problem: Problem, device: int, table: list[tuple[int, int]], warmup: int,
                weight_lag: int | None = None) -> list[Op]:
    """Device `device`'s order, every iteration: `warmup` forwards in `table` order, then one forward
    / one backward, then the remaining backwards (`table_passes`). `weight_lag` None: each backward
    whole; k: each W runs after the backward k later (ZB-H1's lag), the last k W's at the end."""
    order: list[Op] = []
    for microbatches in iteration_microbatches(problem):
        forwards, backwards = table_passes(problem, device, table, microbatches)
        order += forwards[:warmup]
        for k, ops in enumerate(backwards):
            order += forwards[warmup + k:warmup + k + 1]
            if weight_lag is None:
                order += ops
                continue
            order.append(ops[0])
            if k >= weight_lag:
                order.append(backwards[k - weight_lag][1])
        if weight_lag is not None:
            order += [ops[1] for ops in backwards[max(len(backwards) - weight_lag, 0):]]
    return order


@register("interleaved-1f1b", "Megatron-LM interleaved 1F1B (Narayanan et al., 2021): v chunks, depth-first groups",
          memory_bound())
def interleaved_one_f_one_b(problem: Problem, microbatch_group_size_per_vp_stage: int | None = None) -> Schedule:
    """Interleaved 1F1B as Megatron-LM runs it: every device walks the schedule table (groups of
    `microbatch_group_size_per_vp_stage` microbatches through chunk 0, 1, ...) for its forwards, and
    the same table with chunks reversed for its backwards. Device r runs 2(p-r-1) + (v-1)·group
    warm-up forwards, then one forward / one backward, then the remaining backwards. With m a
    multiple of p and uniform costs its bubble is (p-1)(F+B) per virtual stage cost, 1/v of 1F1B's.

    The default group is torch's flexible one (`flexible_group`: p when p divides m, m/⌊m/p⌋ when
    that divides m, all m when m < p), so this is torch 2.13's ScheduleInterleaved1F1B op for op
    wherever torch builds it. Needs v >= 2, loop placement, m a multiple of the group and a group of
    at least p or of all m (with a short last group these orders can deadlock, e.g. p = 4, v = 3,
    m = 5, group 4).
    """
    group = checked_group(problem, "interleaved-1f1b", microbatch_group_size_per_vp_stage)
    table = schedule_table(problem.num_microbatches, problem.chunks_per_device, group)
    return Schedule([table_order(problem, d, table, warmup_count(problem, d, group))
                     for d in range(problem.num_devices)])


def _zero_bubble_memory(problem: Problem) -> list[float]:
    """Device r: at most its warm-up + 1 activations between F and B and r pending W's, each at most
    the device's largest M_B / M_W (torch's ZB1P, like ZB-H1, keeps 1F1B's in-flight count)."""
    group, total = flexible_group(problem), problem.num_microbatches * problem.chunks_per_device
    in_flight = table_memory(problem, [warmup_count(problem, d, group, hops=1) for d in range(problem.num_devices)])
    return [held + min(d, total) * max(problem.weight_memory[s] for s in stages)
            for d, (held, stages) in enumerate(zip(in_flight, problem.stages_of_device, strict=True))]


@register("torch-zb-interleaved", "torch's ScheduleInterleavedZeroBubble (ZB1P for v chunks): interleaved table, "
          "(v-1)·group + p-r-1 warm-up, W's r backwards late", _zero_bubble_memory, after="interleaved-1f1b")
def torch_zb_interleaved(problem: Problem) -> Schedule:
    """torch 2.13's ScheduleInterleavedZeroBubble ("ZB1P" of Qi et al., ICLR 2024, §3, on torch's
    interleaved table), in zbopt's words: device r walks the table of `interleaved-1f1b` with
    torch's flexible group g, runs (v-1)·g + p-r-1 warm-up forwards (one per hop where Megatron
    has two: B is shorter than a fused backward), then one forward / one B, then the remaining
    B's; the W of its k-th backward runs after its (k+r)-th, the last r W's at the end (ZB-H1's
    delay on device r). Device r holds at most its warm-up + 1 activations and r pending W's.
    Needs a split backward, v >= 2 (with one chunk this is `zb-h1`), loop placement and m a
    multiple of g (torch's rule: e.g. not p = 4, m = 9).
    """
    require(problem.split_backward, "torch-zb-interleaved", "a split backward (weight_times given)")
    group = checked_group(problem, "torch-zb-interleaved")
    table = schedule_table(problem.num_microbatches, problem.chunks_per_device, group)
    return Schedule([table_order(problem, d, table, warmup_count(problem, d, group, hops=1), weight_lag=d)
                     for d in range(problem.num_devices)])
