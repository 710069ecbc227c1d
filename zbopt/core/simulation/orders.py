"""A schedule as the simulator reads it: per device, the op numbers of its order (every op once, on
its device), the activations it recomputes or offloads, the stages it gathers again, and its
overlapped pairs, each checked."""

from __future__ import annotations

from zbopt.core import interrupt
from zbopt.core.errors import ScheduleError
from zbopt.core.kinds import COPY_KINDS, PAIR_MEMBERS, RECOMPUTE, REGATHER
from zbopt.core.ops import OpTable
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule, pair_text
from zbopt.core.simulation.result import Pair

__all__ = ["activation_choices", "index_orders", "overlapped_pairs"]


def activation_choices(schedule: Schedule) -> tuple[frozenset, frozenset, frozenset]:
    """The (stage, microbatch) pairs a schedule recomputes (those of its R ops) and offloads (of
    its O or L ops: a missing partner is then reported missing), and the (stage, first microbatch
    of an iteration) pairs it gathers again (its G ops)."""
    recomputed, offloaded, regathered = set(), set(), set()
    for order in schedule.orders:
        for op in order:
            if op.kind == RECOMPUTE:
                recomputed.add((op.stage, op.microbatch))
            elif op.kind in COPY_KINDS:
                offloaded.add((op.stage, op.microbatch))
            elif op.kind == REGATHER:
                regathered.add((op.stage, op.microbatch))
    return frozenset(recomputed), frozenset(offloaded), frozenset(regathered)


def overlapped_pairs(problem: Problem, table: OpTable, schedule: Schedule, orders: list[list[int]]) -> tuple[Pair, ...]:
    """The schedule's overlapped pairs, checked: consecutive in one device's order, a forward then
    one microbatch's whole input-gradient backward (with its W for FBW), a pair kind the problem
    gives a cost for, each op in at most one pair."""
    if not schedule.pairs:
        return ()
    position = {}
    for device, indices in enumerate(orders):
        for place, index in enumerate(indices):
            position[index] = (device, place)
    kinds = {members: kind for (kind, split), members in PAIR_MEMBERS.items() if split == problem.split_backward}
    paired: set[int] = set()
    pairs = []
    for members in schedule.pairs:
        text = pair_text(members)
        indices = tuple(table.index(op) for op in members)
        kind = kinds.get(tuple(op.kind for op in members))
        backward = members[1:]
        if kind is None or any((op.stage, op.microbatch) != (backward[0].stage, backward[0].microbatch)
                               for op in backward):
            shapes = ", ".join(f"({';'.join(kinds_)})" for kinds_ in kinds)
            raise ScheduleError(f"pair {text}: expected a forward and one microbatch's backward, as {shapes}")
        if members[0].microbatch == backward[0].microbatch:
            raise ScheduleError(f"pair {text}: a forward and its own microbatch's backward cannot overlap (the "
                                "backward waits for the forward)")
        device, place = position[indices[0]]
        if [position[index] for index in indices] != [(device, place + k) for k in range(len(indices))]:
            raise ScheduleError(f"pair {text}: its ops must be consecutive in one device's order")
        cost = None if problem.pairs is None else problem.pairs.cost(kind, device)
        if cost is None:
            given = ", ".join(problem.pairs.kinds if problem.pairs else ()) or "none"
            raise ScheduleError(f"pair {text}: the problem's overlap_times gives no {kind} cost (it gives {given})")
        if paired & set(indices):
            raise ScheduleError(f"pair {text}: {table.op(min(paired & set(indices)))} is in another pair too")
        paired.update(indices)
        pairs.append(Pair(indices, cost))
    return tuple(pairs)


def index_orders(problem: Problem, table: OpTable, schedule: Schedule) -> list[list[int]]:
    """Per device, the op indices of its order; checks every op appears once, on its device."""
    if schedule.num_devices != problem.num_devices:
        raise ScheduleError(
            f"the schedule has orders for {schedule.num_devices} devices, the problem has {problem.num_devices}"
        )
    device_of = table.device
    placed: list[tuple[int, int] | None] = [None] * table.size
    orders = []
    for device, order in enumerate(schedule.orders):
        interrupt.check()  # one device's order at a time: a deadline (or Ctrl-C) stops the check between them
        indices = []
        for position, op in enumerate(order):
            index = table.index(op)
            if device_of[index] != device:
                raise ScheduleError(
                    f"op {op} is on device {device}, but stage {op.stage} runs on device {device_of[index]}"
                )
            if placed[index] is not None:
                raise ScheduleError(
                    f"op {op} appears twice on device {device} (positions {placed[index][1]} and {position})"
                )
            placed[index] = (device, position)
            indices.append(index)
        orders.append(indices)
    scheduled = sum(len(indices) for indices in orders)
    if scheduled != table.size:
        missing = [table.op(i) for i, where in enumerate(placed) if where is None]
        first = missing[0]
        raise ScheduleError(
            f"op {first} (device {device_of[table.index(first)]}) is missing from the schedule"
            + (f", and {len(missing) - 1} more ops" if len(missing) > 1 else "")
        )
    return orders
