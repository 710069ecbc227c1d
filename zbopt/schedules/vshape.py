"""V-shape schedules after zbopt's reading of the papers: two chunks per device in V placement.

Device d holds virtual stage d (its *chunk 0*) and stage 2p-1-d (its *chunk 1*), so a microbatch's
forward goes down the devices on chunk 0 and back up on chunk 1, and its backward the other way: a
device's chunk c is `problem.stages_of_device[d][c]`, read off the one placement map.

- `torch-zbv`: ZB-V as a fixed rule after Figure 8 of "Zero Bubble Pipeline Parallelism" (Qi et
  al., ICLR 2024), section 6, which torch 2.13's ScheduleZBVZeroBubble builds op for op (tested on
  every p, m torch takes); named after torch, where users meet it (it was `zb-v-rule`). `zb-v` is
  the authors' cost-aware greedy (`zbopt.schedules.vshape_greedy`); the rule is kept because on
  some problems it is the shorter of the two (p = 4 at the 1.5B model's costs,
  benchmarks/bench_authors.py).
- `v-min`, `v-half-squeezed`: "Pipeline Parallelism with Controllable Memory" (Qi et al.,
  NeurIPS 2024): one microbatch's passes laid out as a *building block*, repeated every T = 6
  slots, squeezed, and reordered in the warm-up and cool-down without raising the peak memory
  (`zbopt.schedules.slot_model`, zbopt's reading). `v-half` is the authors' own reordering
  (`zbopt.schedules.vshape_reorder`); zbopt's reading is kept as `v-half-squeezed`, shorter on
  most problems with equal costs per stage, the authors' on some with unequal ones.

Peak memory is stated in *chunk activations*: one microbatch's activation on one virtual stage
(zbopt's memory unit when activation_memory = 1). 1F1B holds p full stages, i.e. 2p of them.
"""

from __future__ import annotations

from zbopt.core.kinds import BACKWARD, FORWARD, WEIGHT
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.common import block_memory, chunk_activations, passes_to_schedule, require_v_shape
from zbopt.schedules.registry import register
from zbopt.schedules.slot_model import (
    Pass,
    PassSlots,
    controllable_memory_passes,
    v_half_block,
    v_half_peak,
    v_min_block,
    v_min_peak,
)

__all__ = ["v_half_squeezed", "v_min", "zero_bubble_v_rule"]

# --------------------------------------------------------------------------------------- ZB-V


def _zero_bubble_v_passes(p: int, device: int, m: int) -> list[Pass]:
    """Device `device`'s passes under the ZB-V rule, for microbatches 0..m-1.

    The rule is written for n = max(m, 2p-1) microbatches (device 0's warm-up alone holds 2p-1);
    the passes of microbatches >= m are then dropped, which keeps the order deadlock-free.
    """
    n = max(m, 2 * p - 1)
    next_microbatch = {(kind, chunk): 0 for kind in (FORWARD, BACKWARD, WEIGHT) for chunk in (0, 1)}
    passes: list[Pass] = []

    def run(*steps: tuple[str, int]) -> None:
        for kind, chunk in steps:
            passes.append((kind, chunk, next_microbatch[kind, chunk]))
            next_microbatch[kind, chunk] += 1

    forward0, forward1 = (FORWARD, 0), (FORWARD, 1)
    backward0, backward1 = (BACKWARD, 0), (BACKWARD, 1)
    weight0, weight1 = (WEIGHT, 0), (WEIGHT, 1)
    # warm-up: chunk-0 forwards, then chunk 1 joins, then chunk 1's first backwards
    run(*[forward0] * (2 * (p - device) - 1))
    run(*[forward1, forward0] * device)
    run(*[forward1, backward1, weight1] * (p - device))
    # steady: F0 B0 W0 F1 B1 W1 until every forward is done
    while next_microbatch[forward0] < n or next_microbatch[forward1] < next_microbatch[forward0]:
        if next_microbatch[forward0] < n:
            run(forward0)
        run(backward0, weight0, forward1, backward1, weight1)
    # cool-down: the remaining backwards first, W's in the gaps and at the end
    run(*[backward0, backward1] * device)
    run(*[backward0, weight0] * (p - device))
    run(*[weight1] * (next_microbatch[backward1] - next_microbatch[weight1]))
    run(*[weight0] * (next_microbatch[backward0] - next_microbatch[weight0]))
    return [step for step in passes if step[2] < m]


def _zero_bubble_v_memory(problem: Problem) -> list[float]:
    """ZB-V's peak per device d, chunk activations a0, a1: the forwards of the rule leave at most
    2p-d chunk-0 and d chunk-1 activations, or 2p-d-1 and d+1, alive at once (each capped by m).
    Uniform activation a: 2·min(p, m)·a, 1F1B's p full stages."""
    p, m = problem.num_devices, problem.num_microbatches
    bounds = []
    for device in range(p):
        first, second = chunk_activations(problem, device)
        bounds.append(max(min(m, 2 * p - device) * first + min(m, device) * second,
                          min(m, 2 * p - device - 1) * first + min(m, device + 1) * second))
    return bounds


@register("torch-zbv", "torch's ScheduleZBVZeroBubble: ZB-V as a fixed rule (Qi et al., ICLR 2024, Fig. 8), "
          "zero bubble when F = B = W", _zero_bubble_v_memory, after="zb-v")
def zero_bubble_v_rule(problem: Problem) -> Schedule:
    """ZB-V as a fixed rule after "Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024),
    section 6, Figure 8. torch 2.13's ScheduleZBVZeroBubble builds this order op for op (the same
    counts per phase), so it has one implementation, under torch's name.

    Device d (chunk 0 = stage d, chunk 1 = stage 2p-1-d) runs
      warm-up:   2(p-d)-1 chunk-0 F; d times (chunk-1 F, chunk-0 F); p-d times (F1, B1, W1);
      steady:    F0 B0 W0 F1 B1 W1 (oldest microbatch of each kind) until all forwards are done;
      cool-down: d times (B0, B1); p-d times (B0, oldest W0); then the remaining W1, then W0.
    With F = B = W and no latency every device then works without a gap from its first forward
    (zero bubble, for m >= 2p-1) while holding at most 2p chunk activations, 1F1B's memory.
    A fused backward runs the same order with BW in B's place, and several iterations repeat it
    (torch takes neither: a split backward, one step). Needs placement v and v = 2.
    """
    require_v_shape(problem, "torch-zbv")
    p, m = problem.num_devices, problem.num_microbatches
    return passes_to_schedule(problem, [_zero_bubble_v_passes(p, device, m) for device in range(p)])


# ------------------------------------ controllable-memory schedules (blocks and framework: slot_model)


def _controllable_memory_schedule(problem: Problem, name: str, block: PassSlots, peak: int) -> Schedule:
    require_v_shape(problem, name)
    return passes_to_schedule(problem, controllable_memory_passes(block, problem.num_microbatches, peak))


@register("v-min", "V-Min (Qi et al., NeurIPS 2024): V-shape building block, about 1/3 of 1F1B's activation memory",
          block_memory(v_min_peak), after="torch-zbv")
def v_min(problem: Problem) -> Schedule:
    """V-Min, "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024).

    Building block (device d, slots; W's take the two free slots of each period of 6):
      chunk-0 F at d, chunk-1 F at 2p-1-d, chunk-1 B at 2p+g+d, chunk-0 B at 4p+g-1-d,
      g = 2 if 3 divides p else 0,
    repeated every T = 6 slots (2(F+B+W) per virtual stage: no bubble in the stable phase with
    F = B = W), squeezed, warm-up and cool-down reordered without raising the peak. Each device's
    chunk lifespans add up to about 4p slots, so it holds 2·floor((p+4)/3) chunk activations,
    about 1/3 of 1F1B's 2p (the authors' table: (p+4)//3 microbatches), for a bubble of about
    4p slots, rate ~2p/(3m). Block from the authors' repository (zbv_greedy.py). Needs placement
    v and v = 2; a fused backward runs the same order with BW in B's place.
    """
    return _controllable_memory_schedule(problem, "v-min", v_min_block(problem.num_devices),
                                         v_min_peak(problem.num_devices))


@register("v-half-squeezed", "V-Half's block squeezed, then reordered (zbopt's reading of Qi et al., NeurIPS 2024)",
          block_memory(v_half_peak), after="v-half")
def v_half_squeezed(problem: Problem) -> Schedule:
    """V-Half, "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024), in
    zbopt's reading of its framework (`slot_model`: the repeated block squeezed first, its W's
    oldest first); `v-half` is the authors' own reordering of the same block.

    Building block (device d, slots; W's take the two free slots of each period of 6):
      chunk-0 F at 2d, chunk-1 F at 3p-2-d, chunk-1 B at 3p-1+g+2d, chunk-0 B at 6p-2+g-d,
      g = 3 if p is even else 0,
    repeated every T = 6 slots, squeezed, warm-up and cool-down reordered without raising the
    peak. Lifespans add up to about 6p slots: 2·floor((p+2)/2) chunk activations, about 1/2 of
    1F1B's (the authors' table: (p+2)//2 microbatches); bubble 6p-1-3·peak slots, about 3p,
    rate ~p/(2m). Block from the authors' repository (zbv_greedy.py). Needs placement v, v = 2.
    """
    return _controllable_memory_schedule(problem, "v-half-squeezed", v_half_block(problem.num_devices),
                                         v_half_peak(problem.num_devices))
