"""V-shape schedules: two chunks per device in V placement, a split backward filling the bubbles.

Device d holds virtual stage d (its *chunk 0*) and stage 2p-1-d (its *chunk 1*), so a microbatch's
forward goes down the devices on chunk 0 and back up on chunk 1, and its backward the other way: a
device's chunk c is `problem.stages_of_device[d][c]`, read off the one placement map.

- `zb-v`: ZB-V, "Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024), section 6 and Figure 8.
- `v-min`, `v-half`, `v-zb`: "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS
  2024): one microbatch's passes laid out as a *building block*, repeated every T = 6 slots,
  squeezed, and reordered in the warm-up and cool-down without raising the peak memory.

Peak memory is stated in *chunk activations*: one microbatch's activation on one virtual stage
(zbopt's memory unit when activation_memory = 1). 1F1B holds p full stages, i.e. 2p of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from zbopt.ops import Op
from zbopt.problem import BACKWARD, FORWARD, WEIGHT, Problem
from zbopt.schedule import Schedule
from zbopt.schedules.common import input_gradient, repeat_per_iteration
from zbopt.schedules.registry import register, require
from zbopt.timeline import Timeline

PERIOD = 6
"""Repetition interval of the building blocks in slots: each op lasts one slot (F = B = W per
virtual stage) and a device runs six per microbatch (F, B, W on each of its two chunks)."""

Pass = tuple[str, int, int]
"""(kind F/B/W, device-local chunk 0/1, microbatch): one op in the slot model."""

PassSlots = list[dict[tuple[str, int], int]]
"""Per device, the slot of each of one microbatch's (kind, chunk) passes: a building block in the
slot model (F's and B's; `weight_slots` adds the W's)."""


def require_v_shape(problem: Problem, name: str) -> None:
    """NotApplicableError unless the problem is what every V-shape schedule and block is written
    for: V placement, two chunks per device."""
    require(problem.placement == "v" and problem.chunks_per_device == 2, name,
            "placement v and chunks_per_device = 2")


def _to_schedule(problem: Problem, orders: list[list[Pass]]) -> Schedule:
    """Per-device passes of one iteration -> Ops of every iteration (microbatch ids k·m + j). With a
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


def _chunk_activations(problem: Problem, device: int) -> tuple[float, float]:
    """activation_memory of the device's chunk 0 and chunk 1."""
    first, second = problem.stages_of_device[device]
    return problem.activation_memory[first], problem.activation_memory[second]


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
        first, second = _chunk_activations(problem, device)
        bounds.append(max(min(m, 2 * p - device) * first + min(m, device) * second,
                          min(m, 2 * p - device - 1) * first + min(m, device + 1) * second))
    return bounds


@register("zb-v", "ZB-V (Qi et al., ICLR 2024, sec. 6): V placement, 1F1B's peak memory, zero bubble when F = B = W",
          _zero_bubble_v_memory)
def zero_bubble_v(problem: Problem) -> Schedule:
    """ZB-V, "Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024), section 6, Figure 8.

    Device d (chunk 0 = stage d, chunk 1 = stage 2p-1-d) runs
      warm-up:   2(p-d)-1 chunk-0 F; d times (chunk-1 F, chunk-0 F); p-d times (F1, B1, W1);
      steady:    F0 B0 W0 F1 B1 W1 (oldest microbatch of each kind) until all forwards are done;
      cool-down: d times (B0, B1); p-d times (B0, oldest W0); then the remaining W1, then W0.
    With F = B = W and no latency every device then works without a gap from its first forward
    (zero bubble, for m >= 2p-1) while holding at most 2p chunk activations, 1F1B's memory.
    A fused backward runs the same order with BW in B's place. Needs placement v and v = 2.
    """
    require_v_shape(problem, "zb-v")
    p, m = problem.num_devices, problem.num_microbatches
    return _to_schedule(problem, [_zero_bubble_v_passes(p, device, m) for device in range(p)])


# ----------------------------------------------------------------- controllable-memory blocks


def v_min_block(p: int) -> PassSlots:
    """V-Min: every pass one slot after the same pass on the previous device (offset 1 in both
    directions); a gap of 2 before the backward when 3 divides p keeps the repeats from colliding."""
    gap = 2 if p % 3 == 0 else 0
    return [{(FORWARD, 0): d, (FORWARD, 1): 2 * p - 1 - d,
             (BACKWARD, 1): 2 * p + gap + d, (BACKWARD, 0): 4 * p + gap - 1 - d} for d in range(p)]


def v_half_block(p: int) -> PassSlots:
    """V-Half: chunk-0 forward and chunk-1 backward advance 2 slots per device, the other two 1;
    a gap of 3 before the backward when p is even avoids collisions."""
    gap = 3 if p % 2 == 0 else 0
    return [{(FORWARD, 0): 2 * d, (FORWARD, 1): 3 * p - 2 - d,
             (BACKWARD, 1): 3 * p - 1 + gap + 2 * d, (BACKWARD, 0): 6 * p - 2 + gap - d} for d in range(p)]


def v_min_peak(p: int) -> int:
    """V-Min's peak in chunk activations: 2·floor((p+4)/3), about 1/3 of 1F1B's 2p."""
    return 2 * ((p + 4) // 3)


def v_half_peak(p: int) -> int:
    """V-Half's peak in chunk activations: 2·floor((p+2)/2), about 1/2 of 1F1B's 2p."""
    return 2 * ((p + 2) // 2)


def _slot_problem(p: int, m: int) -> Problem:
    """The slot model as a problem, so the shared `Timeline` and `Problem.memory_delta` time it: V
    placement, each pass one time unit (a slot), no latency; memory in chunk activations, held from
    F to W (weight_memory = activation_memory, so B frees nothing: an upper bound on any problem's
    own memory model, where B frees part of it)."""
    return Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="v", forward_times=1,
                   backward_times=1, weight_times=1, activation_memory=1, weight_memory=1)


class _SlotPlan:
    """A slot-model schedule: per device, slot -> pass; the passes' slots are start times on a
    `Timeline` of the slot problem, which says when each pass may start."""

    def __init__(self, problem: Problem, slots: list[dict[int, Pass]]):
        self.problem = problem
        self.slots = slots
        self.timeline = Timeline(problem)
        for device, by_slot in enumerate(slots):
            for slot, step in by_slot.items():
                self.timeline.put(self.op(device, step), slot)

    def op(self, device: int, step: Pass) -> Op:
        kind, chunk, microbatch = step
        return Op(kind, self.problem.stages_of_device[device][chunk], microbatch)

    def slot_of(self, device: int, step: Pass) -> int:
        return round(self.timeline.start_of(self.op(device, step)))

    def ready(self, device: int, step: Pass) -> int:
        """Earliest slot `step` may take: the end of the pass it waits for."""
        return round(self.timeline.ready(self.op(device, step)))

    def place(self, device: int, step: Pass, slot: int) -> None:
        self.slots[device][slot] = step
        self.timeline.put(self.op(device, step), slot)

    def move(self, device: int, old: int, new: int) -> None:
        self.place(device, self.slots[device].pop(old), new)

    def in_slot_order(self) -> list[tuple[int, int]]:
        """(slot, device) of every pass, earliest first: every pass after the passes it waits for."""
        return sorted((slot, device) for device, by_slot in enumerate(self.slots) for slot in by_slot)

    def change(self, device: int, step: Pass) -> float:
        """The memory a pass adds (F), frees (W) or leaves (B), in chunk activations."""
        return self.problem.memory_delta(step[0], self.problem.stages_of_device[device][step[1]])

    def held(self, device: int, passes: dict[int, Pass], length: int) -> list[float]:
        """Chunk activations the device holds after each slot 0..length-1 if it ran `passes`."""
        held, levels = 0.0, []
        for slot in range(length):
            step = passes.get(slot)
            held += 0.0 if step is None else self.change(device, step)
            levels.append(held)
        return levels


def _fill_weights(passes: dict[int, Pass], start: int = 0) -> dict[int, Pass]:
    """Place every missing W in the first free slot from `start` on after its B, oldest B first.
    Placing each as early as possible leaves the fewest activations held at every moment."""
    placed = {(chunk, microbatch) for kind, chunk, microbatch in passes.values() if kind == WEIGHT}
    filled = dict(passes)
    pending: deque[Pass] = deque()
    slot, last = 0, max(passes, default=-1)
    while slot <= last or pending:
        step = passes.get(slot)
        if step is not None:
            if step[0] == BACKWARD and step[1:] not in placed:
                pending.append((WEIGHT, *step[1:]))
        elif pending and slot >= start:
            filled[slot] = pending.popleft()
        slot += 1
    return filled


def weight_slots(block: PassSlots) -> list[dict[tuple[str, int], int]]:
    """The block with its W's: each device's F and B slots and the slots its W's take once the
    repeated block is in its steady state (a microbatch in the middle of a long run)."""
    span = max(slot for device_block in block for slot in device_block.values()) // PERIOD + 2
    middle = 2 * span
    slots = []
    for device, passes in enumerate(_repeat(block, 2 * middle + 1)):
        weights = {(kind, chunk): slot - PERIOD * middle for slot, (kind, chunk, j) in passes.items()
                   if kind == WEIGHT and j == middle}
        slots.append({**block[device], **weights})
    return slots


def _repeat(block: PassSlots, m: int) -> list[dict[int, Pass]]:
    """The block repeated every PERIOD slots for m microbatches, W's filling the free slots."""
    return [_fill_weights({slot + PERIOD * j: (kind, chunk, j)
                           for (kind, chunk), slot in device_block.items() for j in range(m)})
            for device_block in block]


def _squeeze(plan: _SlotPlan) -> _SlotPlan:
    """Every pass as early as its device order and its dependency allow (the paper's squeezing)."""
    squeezed = _SlotPlan(plan.problem, [{} for _ in plan.slots])
    free = [0] * len(plan.slots)
    for slot, device in plan.in_slot_order():
        step = plan.slots[device][slot]
        new = max(free[device], squeezed.ready(device, step))
        squeezed.place(device, step, new)
        free[device] = new + 1
    return squeezed


def _reorder_outside_stable_phase(plan: _SlotPlan, cap: int, stable: range) -> None:
    """Move each warm-up and cool-down pass, in slot order, to the earliest free slot after the
    pass it waits for, unless an F moved there would lift its device above `cap` activations."""
    length = max(max(by_slot, default=0) for by_slot in plan.slots) + 1
    levels = [plan.held(device, by_slot, length) for device, by_slot in enumerate(plan.slots)]
    for slot, device in plan.in_slot_order():
        if slot in stable:
            continue
        step = plan.slots[device][slot]
        for new in range(plan.ready(device, step), slot):
            if new in plan.slots[device]:
                continue
            change = plan.change(device, step)
            if change > 0 and max(levels[device][new:slot]) + change > cap:
                continue
            plan.move(device, slot, new)
            for moved in range(new, slot):
                levels[device][moved] += change
            break


def _reorder_cool_down(plan: _SlotPlan, cap: int, start: int) -> _SlotPlan:
    """Cool-down again with its W's taken out: F's and B's move to the earliest free slot (a W's
    slot included), then the W's refill the free slots, oldest first; a move is kept only if the
    refilled device stays within `cap`. B's go first, W's fill the gaps (the Zero Bubble idea)."""
    passes = [{slot: step for slot, step in by_slot.items() if slot < start or step[0] != WEIGHT}
              for by_slot in plan.slots]
    lean = _SlotPlan(plan.problem, passes)
    for slot, device in lean.in_slot_order():
        if slot < start:
            continue
        step = lean.slots[device][slot]
        for new in range(max(lean.ready(device, step), start), slot):
            if new in lean.slots[device]:
                continue
            lean.move(device, slot, new)
            refilled = _fill_weights(lean.slots[device], start)
            if max(lean.held(device, refilled, max(refilled) + 1)) <= cap:
                break
            lean.move(device, new, slot)
    return _SlotPlan(plan.problem, [_fill_weights(by_slot, start) for by_slot in lean.slots])


def _controllable_memory_passes(block: PassSlots, m: int, cap: int) -> list[list[Pass]]:
    """Repeat, squeeze, reorder (the paper's framework); per device, its passes in slot order.

    The stable phase runs from device 0's first chunk-0 backward to its last chunk-0 forward; it
    keeps the block's pattern. Warm-up and cool-down are reordered within `cap` activations."""
    plan = _squeeze(_SlotPlan(_slot_problem(len(block), m), _repeat(block, m)))
    first_backward = plan.slot_of(0, (BACKWARD, 0, 0))
    last_forward = plan.slot_of(0, (FORWARD, 0, m - 1))
    _reorder_outside_stable_phase(plan, cap, range(first_backward, last_forward + 1))
    plan = _reorder_cool_down(plan, cap, last_forward + 1)
    return [[by_slot[slot] for slot in sorted(by_slot)] for by_slot in plan.slots]


def _block_memory(peak: Callable[[int], int]) -> Callable[[Problem], list[float]]:
    """Peak bound of a building-block schedule: at most min(peak(p), 2m) chunk activations per
    device, each at most the larger activation_memory of its two chunks."""

    def bound(problem: Problem) -> list[float]:
        count = min(peak(problem.num_devices), 2 * problem.num_microbatches)
        return [count * max(_chunk_activations(problem, device)) for device in range(problem.num_devices)]

    return bound


def _controllable_memory_schedule(problem: Problem, name: str, block: PassSlots, peak: int) -> Schedule:
    require_v_shape(problem, name)
    return _to_schedule(problem, _controllable_memory_passes(block, problem.num_microbatches, peak))


@register("v-min", "V-Min (Qi et al., NeurIPS 2024): V-shape building block, about 1/3 of 1F1B's activation memory",
          _block_memory(v_min_peak))
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


@register("v-half", "V-Half (Qi et al., NeurIPS 2024): V-shape building block, about 1/2 of 1F1B's activation memory",
          _block_memory(v_half_peak))
def v_half(problem: Problem) -> Schedule:
    """V-Half, "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024).

    Building block (device d, slots; W's take the two free slots of each period of 6):
      chunk-0 F at 2d, chunk-1 F at 3p-2-d, chunk-1 B at 3p-1+g+2d, chunk-0 B at 6p-2+g-d,
      g = 3 if p is even else 0,
    repeated every T = 6 slots, squeezed, warm-up and cool-down reordered without raising the
    peak. Lifespans add up to about 6p slots: 2·floor((p+2)/2) chunk activations, about 1/2 of
    1F1B's (the authors' table: (p+2)//2 microbatches); bubble 6p-1-3·peak slots, about 3p,
    rate ~p/(2m). Block from the authors' repository (zbv_greedy.py). Needs placement v, v = 2.
    """
    return _controllable_memory_schedule(problem, "v-half", v_half_block(problem.num_devices),
                                         v_half_peak(problem.num_devices))


@register("v-zb", "V-ZB (Qi et al., NeurIPS 2024): the V-shape block with 1F1B's memory and zero bubble, run as ZB-V",
          _zero_bubble_v_memory)
def v_zb(problem: Problem) -> Schedule:
    """V-ZB, "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024): the V-shape
    building block with 1F1B's memory (2p chunk activations) and no bubble when F = B = W.

    Its block is ZB-V's stable phase: chunk-0 F and chunk-1 B advance 4 slots per device, chunk-1
    F and chunk-0 B 2 slots, repeated every T = 6 slots; its lifespans add up to 12p-4 slots, 2p
    activations. Repeated with ZB-V's warm-up and cool-down it is ZB-V, which is also how the
    authors' repository runs this memory setting ('zb'), so v-zb returns ZB-V's orders.
    """
    require_v_shape(problem, "v-zb")
    return zero_bubble_v(problem)
