"""V-Half as its authors generate it: a building block repeated, then reordered (their code does V-Min
the same way; zbopt's `v-min` still uses `slot_model`, which gave equal makespans on every case tried).

"Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024), section 4, and the
authors' repository (sail-sg/zero-bubble-pipeline-parallelism, `zerobubble/scheduler/zbv_greedy.py`):
in the slot model (every pass one slot, memory counted in chunk activations, F +1, W -1) the block
is repeated every 6 slots and its W's put in the free slots, oldest B first; the peak of the
worst device is the memory the schedule keeps. Then, in slot order, each warm-up and cool-down
pass moves to the earliest free slot after its inputs where its device stays within that peak
(the stable phase, from device 0's first chunk-0 B to the first F of the last microbatch, stays);
the plan is squeezed (every pass as early as its inputs and device allow); the cool-down is
reordered once more without its W's (W's counted as run in the free slots); squeezed again, and
the W's refilled, a chunk-1 B's W before a chunk-0 B's. This module is zbopt's own account of that
algorithm; `zbopt.schedules.slot_model` keeps zbopt's earlier reading of the same framework.
"""

from __future__ import annotations

from zbopt.core import interrupt
from zbopt.core.kinds import BACKWARD, FORWARD, WEIGHT
from zbopt.schedules.slot_model import PERIOD, Pass, PassSlots

__all__ = ["Plan", "reordered_passes"]

# A device's passes in slot order break ties in this order (one device never holds two per slot);
# W's are anonymous until the last step: (W, -1, k) is the device's k-th W, after its k-th B.
_RANK = {(FORWARD, 0): 0, (FORWARD, 1): 1, (BACKWARD, 1): 2, (BACKWARD, 0): 3, (WEIGHT, -1): 4,
         (WEIGHT, 1): 4, (WEIGHT, 0): 5}
_BEFORE = {(FORWARD, 1): (FORWARD, 0), (BACKWARD, 1): (FORWARD, 1), (BACKWARD, 0): (BACKWARD, 1)}

Plan = list[dict[Pass, int]]  # per device, pass -> slot


def _add_weights(slots: dict[Pass, int], split: bool = False) -> dict[Pass, int]:
    """The device's passes with a W in each free slot while a B's W is due (after the last pass,
    the rest in a row). Anonymous W's go oldest first; `split`, each is its chunk's next W, a
    chunk-1 B's W before a chunk-0 B's."""
    by_slot = {slot: step for step, slot in slots.items()}
    last = max(by_slot, default=-1)
    due = {0: 0, 1: 0, -1: 0}
    made = {0: 0, 1: 0, -1: 0}
    filled = dict(slots)

    def place(slot: int) -> bool:
        for chunk in ((1, 0) if split else (-1,)):
            if due[chunk]:
                filled[WEIGHT, chunk, made[chunk]] = slot
                due[chunk] -= 1
                made[chunk] += 1
                return True
        return False

    for slot in range(last + 1):
        step = by_slot.get(slot)
        if step is None:
            place(slot)
        elif step[0] == BACKWARD:
            due[step[1] if split else -1] += 1
    while place(last := last + 1):
        pass
    return filled


def _walk(by_slot: dict[int, Pass], first: int, last: int, held: int, due: int,
          weights_placed: bool) -> list[tuple[int, int]]:
    """(activations held, W's due) after each slot from `first` to `last`, starting from `held`
    and `due` before `first`: F +1, W -1; without W's placed, one W runs in each free slot while
    one is due."""
    states = []
    for slot in range(first, last + 1):
        step = by_slot.get(slot)
        if step is None:
            if due and not weights_placed:
                held, due = held - 1, due - 1
        elif step[0] == FORWARD:
            held += 1
        elif step[0] == WEIGHT:
            held -= 1
        else:
            due += 1
        states.append((held, due))
    return states


class _Device:
    """One device's passes in their slots and the activations held after each slot, kept up to
    date as passes move earlier: a move is tried against the worst device's peak by walking only
    the slots it changes (with the W's placed, a pass moved from slot s to e shifts the levels of
    [e, s) alone), not the whole plan again (quadratic in m at p = 32)."""

    def __init__(self, own: dict[Pass, int], weights_placed: bool):
        self.own, self.weights_placed = own, weights_placed
        self.by_slot = {slot: step for step, slot in own.items()}
        self.last = max(self.by_slot, default=-1)  # passes only move earlier: later slots stay free
        self.states = _walk(self.by_slot, 0, self.last, 0, 0, weights_placed)

    @property
    def peak(self) -> int:
        return max((held for held, _ in self.states), default=0)

    def move(self, step: Pass, earlier: int, peak: int) -> bool:
        """Move `step` to the free slot `earlier` if the device stays within `peak`."""
        slot = self.own[step]
        if self.weights_placed:
            change = {FORWARD: 1, WEIGHT: -1}.get(step[0], 0)
            if change > 0 and max(held for held, _ in self.states[earlier:slot]) + change > peak:
                return False
            self.states[earlier:slot] = [(held + change, due) for held, due in self.states[earlier:slot]]
            self._relocate(step, slot, earlier)
            return True
        self._relocate(step, slot, earlier)
        held, due = self.states[earlier - 1] if earlier else (0, 0)
        tail = _walk(self.by_slot, earlier, self.last, held, due, False)
        if max(held for held, _ in tail) > peak:
            self._relocate(step, earlier, slot)
            return False
        self.states[earlier:] = tail
        return True

    def _relocate(self, step: Pass, old: int, new: int) -> None:
        del self.by_slot[old]
        self.by_slot[new] = step
        self.own[step] = new


def _inputs(plan: Plan, device: int, step: Pass) -> list[int]:
    """Slots of the passes `step` must follow: its input on the neighbouring device (F0 and B1
    from the device above, F1 and B0 from the one below), the pass before it on this device, the
    same lane's previous microbatch; a W follows the device's B of the same rank."""
    kind, chunk, microbatch = step
    own = plan[device]
    found = [own[kind, chunk, microbatch - 1]] if microbatch else []
    if kind == WEIGHT:
        return [*found, sorted(slot for other, slot in own.items() if other[0] == BACKWARD)[microbatch]]
    neighbour = device - 1 if (kind == FORWARD) == (chunk == 0) else device + 1
    if 0 <= neighbour < len(plan):
        found.append(plan[neighbour][step])
    if (kind, chunk) in _BEFORE:
        found.append(own[(*_BEFORE[kind, chunk], microbatch)])
    return found


def _in_slot_order(plan: Plan) -> list[tuple[int, int, Pass]]:
    return sorted(((slot, device, step) for device, own in enumerate(plan) for step, slot in own.items()),
                  key=lambda item: (item[0], item[1], _RANK[item[2][:2]], item[2][2]))


def _reorder(plan: Plan, m: int, weights_placed: bool) -> None:
    """Move each pass outside the stable phase (only the cool-down's when the W's are not placed),
    in slot order, to the earliest free slot after its inputs where its device stays within the
    worst device's peak."""
    devices = [_Device(own, weights_placed) for own in plan]
    peak = max(device.peak for device in devices)
    taken: list[set[int]] = [set() for _ in plan]
    phase = 0  # 0 warm-up, 1 stable, 2 cool-down
    for slot, device, step in _in_slot_order(plan):
        interrupt.check()
        if phase == 0 and device == 0 and step[:2] == (BACKWARD, 0):
            phase = 1
        if phase == 1 or (phase == 0 and not weights_placed):
            phase += phase == 1 and step[:2] == (FORWARD, 0) and step[2] == m - 1
            taken[device].add(slot)
            continue
        for earlier in range(max(_inputs(plan, device, step), default=-1) + 1, slot):
            if earlier not in taken[device] and devices[device].move(step, earlier, peak):
                break
        taken[device].add(plan[device][step])


def _squeeze(plan: Plan) -> Plan:
    """Every pass, in slot order, in the first slot after its inputs and its device's last pass
    (a W after the device's last pass only)."""
    squeezed: Plan = [{} for _ in plan]
    free = [0] * len(plan)
    for _, device, step in _in_slot_order(plan):
        inputs = [] if step[0] == WEIGHT else _inputs(squeezed, device, step)
        squeezed[device][step] = free[device] = max([free[device], *(slot + 1 for slot in inputs)])
        free[device] += 1
    return squeezed


def _without_weights(plan: Plan) -> Plan:
    return [{step: slot for step, slot in own.items() if step[0] != WEIGHT} for own in plan]


def reordered_passes(block: PassSlots, m: int) -> list[list[Pass]]:
    """The authors' order for `block` repeated for m microbatches: per device, its passes."""
    plan: Plan = [_add_weights({(kind, chunk, j): slot + PERIOD * j for (kind, chunk), slot in own.items()
                                for j in range(m)}) for own in block]
    _reorder(plan, m, weights_placed=True)
    plan = _without_weights(_squeeze(plan))
    _reorder(plan, m, weights_placed=False)
    plan = _without_weights(_squeeze([_add_weights(own) for own in plan]))
    return [sorted(steps, key=steps.get) for steps in (_add_weights(own, split=True) for own in plan)]
