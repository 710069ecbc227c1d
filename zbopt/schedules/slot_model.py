"""The Controllable Memory paper's framework in its slot model (Qi et al., NeurIPS 2024, section 4):
V placement, every pass one slot, memory in chunk activations. A building block gives each device's
chunk-0 and chunk-1 F and B of one microbatch a slot; repeated every PERIOD slots with the W's in
the free slots, squeezed, and its warm-up and cool-down reordered within a memory cap, it is the
order V-Min and V-Half run (`zbopt.schedules.vshape`), and the cycle the published V blocks repeat.
"""

from __future__ import annotations

from collections import deque

from zbopt.core import interrupt
from zbopt.core.kinds import BACKWARD, FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.timeline import Timeline

__all__ = ["PERIOD", "Pass", "PassSlots", "controllable_memory_passes", "v_half_block", "v_half_peak", "v_min_block",
           "v_min_peak", "weight_slots"]

PERIOD = 6
"""Repetition interval of the building blocks in slots: each op lasts one slot (F = B = W per
virtual stage) and a device runs six per microbatch (F, B, W on each of its two chunks)."""

Pass = tuple[str, int, int]
"""(kind F/B/W, device-local chunk 0/1, microbatch): one op in the slot model."""

PassSlots = list[dict[tuple[str, int], int]]
"""Per device, the slot of each of one microbatch's (kind, chunk) passes: a building block in the
slot model (F's and B's; `weight_slots` adds the W's)."""


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
        interrupt.check()
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
        interrupt.check()
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


def controllable_memory_passes(block: PassSlots, m: int, cap: int) -> list[list[Pass]]:
    """Repeat, squeeze, reorder (the paper's framework); per device, its passes in slot order.

    The stable phase runs from device 0's first chunk-0 backward to its last chunk-0 forward; it
    keeps the block's pattern. Warm-up and cool-down are reordered within `cap` activations."""
    plan = _squeeze(_SlotPlan(_slot_problem(len(block), m), _repeat(block, m)))
    first_backward = plan.slot_of(0, (BACKWARD, 0, 0))
    last_forward = plan.slot_of(0, (FORWARD, 0, m - 1))
    _reorder_outside_stable_phase(plan, cap, range(first_backward, last_forward + 1))
    plan = _reorder_cool_down(plan, cap, last_forward + 1)
    return [[by_slot[slot] for slot in sorted(by_slot)] for by_slot in plan.slots]


def v_min_peak(p: int) -> int:
    """V-Min's peak in chunk activations: 2·floor((p+4)/3), about 1/3 of 1F1B's 2p."""
    return 2 * ((p + 4) // 3)


def v_half_peak(p: int) -> int:
    """V-Half's peak in chunk activations: 2·floor((p+2)/2), about 1/2 of 1F1B's 2p."""
    return 2 * ((p + 2) // 2)
