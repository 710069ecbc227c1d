"""Combined 1F1B: 1F1B whose steady state runs each forward overlapped with another microbatch's
backward as one op (an overlapped pair, `Problem.overlap_times`), to hide MoE all-to-all
communication of one behind the other's compute.

Megatron-LM runs it as `combined_1f1b.py` [1]_: with one pipeline stage, F0 alone, then each
F(j+1) with B(j), then B(m-1) alone; with more stages only interleaved (v >= 2), its
schedule-table order with one more warm-up forward, so that the forward and the backward of every
steady-state step are independent [2]_. The PP schedule visualizer [3]_ draws the same steady
state for plain 1F1B (`1f1b_overlap`: 2(p-r-1) + 1 warm-up forwards, eager 1F1B's plus one) and
for interleaved 1F1B (`1f1b_interleave_overlap`, as Megatron).

References
----------
.. [1] NVIDIA Megatron-LM, megatron/core/pipeline_parallel/combined_1f1b.py
   (`combined_1f1b_schedule_for_no_pipelining`, `combined_1f1b_schedule_for_interleaved_pipelining`).
.. [2] NVIDIA Megatron-LM, megatron/core/pipeline_parallel/schedules.py (`get_pp_rank_microbatches`:
   "we schedule one extra micro-batch forward step before the 1f1b stages ... to ensure the forward
   and backward computations are independent in all 1f1b steps"; the steady state pairs virtual
   microbatch k + warm-up's forward with virtual microbatch k's backward); transformer_config.py
   (EP A2A overlap with pipeline_model_parallel_size > 1 needs a virtual pipeline size).
.. [3] Victarry/PP-Schedule-Visualization, src/strategies.py (`generate_1f1b_overlap_schedule`,
   `generate_1f1b_interleave_overlap_schedule`) and README (examples p = 4, m = 8).
"""

from __future__ import annotations

from collections.abc import Callable

from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.classic import eager_warmup, in_flight_bound
from zbopt.schedules.common import alternate_passes, backward_ops, iteration_microbatches
from zbopt.schedules.interleaved import checked_group, memory_bound, schedule_table, table_passes, warmup_count
from zbopt.schedules.registry import register, require

__all__ = ["Passes", "combine", "interleaved_one_f_one_b_overlap", "one_f_one_b_overlap"]

Passes = Callable[[int, range], tuple[list[Op], list[list[Op]]]]  # (device, microbatches) -> forwards, backwards


def _pair_kind(problem: Problem, name: str) -> str:
    """The pair the steady state runs: FBW (a forward with a full backward) when `overlap_times`
    gives it, as both sources pair; else FB (with the input-gradient B, W right after the pair)."""
    given = list(problem.pairs.kinds if problem.pairs else ())
    require(bool(given), name, "overlap_times (the cost of a forward overlapped with another microbatch's "
                               "backward, e.g. {FBW: 2.5}): its steady state runs them as one op")
    return "FBW" if "FBW" in given else "FB"


def combine(forwards: list[Op], backwards: list[list[Op]], warmup: int, kind: str) -> tuple[list[Op], list[tuple]]:
    """One device's order and pairs for one iteration: min(warmup, all) forwards alone, then each
    further forward overlapped with the oldest backward not run yet (B and W, or BW, for FBW; B
    alone for FB, its W right after), then the remaining backwards alone."""
    count, members = min(warmup, len(forwards)), None if kind == "FBW" else 1
    pairs = [(forward, *backward[:members]) for forward, backward in zip(forwards[count:], backwards, strict=False)]
    return alternate_passes(forwards, backwards, warmup), pairs


def _build(problem: Problem, name: str, passes: Passes, warmup: Callable[[int], int]) -> Schedule:
    """Per device and iteration, `passes` combined after `warmup(device)` forwards alone."""
    kind = _pair_kind(problem, name)
    orders, pairs = [], []
    for device in range(problem.num_devices):
        order: list[Op] = []
        for microbatches in iteration_microbatches(problem):
            ops, device_pairs = combine(*passes(device, microbatches), warmup(device), kind)
            order += ops
            pairs += device_pairs
        orders.append(order)
    return Schedule(orders, pairs=pairs)


def _overlap_warmup(device: int, devices: int) -> int:
    """Eager 1F1B's 2(p-r-1) warm-up forwards and one more: the last device pairs F(j+1) with B(j),
    and each device upstream needs two more in flight for its pair's two inputs to be ready."""
    return eager_warmup(device, devices) + 1


@register("1f1b-overlap", "Combined 1F1B (Megatron-LM combined_1f1b; PP visualizer 1f1b_overlap): F&B pairs, "
                          "2(p-s-1)+1 warm-up forwards", in_flight_bound(_overlap_warmup))
def one_f_one_b_overlap(problem: Problem) -> Schedule:
    """1F1B with overlapped F&B [3]_: device s runs min(2(p-s-1) + 1, m) forwards, then each
    further forward overlapped with the oldest pending backward (one pair), then the remaining
    backwards. With p = 1 this is Megatron-LM's combined 1F1B without pipelining [1]_: F0,
    (F1&B0), ..., (F(m-1)&B(m-2)), B(m-1). Needs v = 1 and overlap_times; a pair is FBW when
    given (a full backward, as the sources pair), else FB with W right after it. Holds at most
    min(2(p-s), m) microbatches on device s.

    Unlike the visualizer (whose loop needs m >= 2p - 1), the warm-up is capped at m, as Megatron
    caps its own: with fewer microbatches the first devices run every forward before any pair.
    """
    name = "1f1b-overlap"
    require(problem.chunks_per_device == 1, name, "chunks_per_device = 1 (use interleaved-1f1b-overlap for more)")
    p = problem.num_devices

    def passes(device: int, microbatches: range) -> tuple[list[Op], list[list[Op]]]:
        return ([Op(FORWARD, device, j) for j in microbatches],
                [backward_ops(problem, device, j) for j in microbatches])

    return _build(problem, name, passes, lambda device: _overlap_warmup(device, p))


@register("interleaved-1f1b-overlap", "Megatron-LM combined 1F1B, interleaved: interleaved-1f1b with one more "
                                      "warm-up forward and F&B pairs", memory_bound(extra=1))
def interleaved_one_f_one_b_overlap(problem: Problem,
                                    microbatch_group_size_per_vp_stage: int | None = None) -> Schedule:
    """Interleaved 1F1B with overlapped F&B, as Megatron-LM runs it with
    overlap_moe_expert_parallel_comm [2]_ and the visualizer's 1f1b_interleave_overlap [3]_:
    interleaved-1f1b's schedule table, 2(p-r-1) + (v-1)·group + 1 warm-up forwards on device r
    (at most all m·v), then each further forward overlapped with the oldest pending backward (one
    pair, possibly of two chunks), then the remaining backwards. Needs what interleaved-1f1b
    needs (v >= 2, loop placement, m a multiple of the group >= p) and overlap_times; a pair is FBW
    when given, else FB with W right after it. Holds one more activation than interleaved-1f1b.
    """
    name = "interleaved-1f1b-overlap"
    group = checked_group(problem, name, microbatch_group_size_per_vp_stage)
    table = schedule_table(problem.num_microbatches, problem.chunks_per_device, group)
    return _build(problem, name, lambda device, microbatches: table_passes(problem, device, table, microbatches),
                  lambda device: warmup_count(problem, device, group, extra=1))
