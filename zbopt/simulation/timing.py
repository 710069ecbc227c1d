"""Timing per-device orders: each op starts as soon as its device is free and its inputs (plus
latency, iteration barriers, restores) have finished; a deadlock is named device by device."""

from __future__ import annotations

import numpy as np

from zbopt.errors import DeadlockError
from zbopt.kinds import FORWARD, KINDS
from zbopt.ops import Op, OpTable
from zbopt.schedule import pair_text
from zbopt.simulation.result import Pair


def barrier_groups(table: OpTable) -> tuple[list[int], list[int], int]:
    """Iteration barriers as (group each forward waits for, group each gradient op feeds, count);
    -1 where none. Group g = stage · barrier_count + iteration."""
    problem = table.problem
    waits = [-1] * table.size
    feeds = [-1] * table.size
    boundaries = table.barrier_count
    m = problem.num_microbatches
    for stage in range(problem.num_stages):
        for iteration in range(boundaries):
            group = stage * boundaries + iteration
            for index in table.iteration_barrier(stage, iteration):
                feeds[index] = group
            first_forward = table.index(Op(FORWARD, stage, (iteration + 1) * m))
            waits[first_forward:first_forward + m] = [group] * m
    return waits, feeds, problem.num_stages * boundaries


def time_orders(table: OpTable, orders: list[list[int]],
                 pairs: tuple[Pair, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Earliest start of every op given the device orders: a longest-path sweep in which a device
    advances until its next op waits on an unfinished op, and is woken when that op finishes. An
    overlapped pair starts once all its members could, and ends them all after its cost."""
    duration, predecessor, latency, restore_of = table.duration, table.predecessor, table.latency, table.restore_of
    lane = table.lane
    waits, feeds, group_count = barrier_groups(table)
    group_left = [table.problem.num_microbatches] * group_count
    group_end = [0.0] * group_count
    group_done: list[float | None] = [None] * group_count
    start = [0.0] * table.size
    end: list[float | None] = [None] * table.size
    position = [0] * len(orders)
    free = [0.0] * len(orders)
    copy_free = [[0.0, 0.0, 0.0] for _ in orders]  # per device, when each copy lane is free
    waiting: dict[int, list[int]] = {}  # op index (or ~group for a barrier) -> devices waiting on it
    ready = list(range(len(orders) - 1, -1, -1))
    pair_of = {pair.members[0]: pair for pair in pairs}

    def pair_start(pair: Pair, t: float) -> tuple[float, int | None]:
        """The pair's start given the device is free at `t`, or (t, what it waits for)."""
        for member in pair.members:
            source = predecessor[member]
            if source >= 0 and source not in pair.members:
                if end[source] is None:
                    return t, source
                t = max(t, end[source] + latency[member])
            source = restore_of[member]
            if source >= 0:
                if end[source] is None:
                    return t, source
                t = max(t, end[source])
            group = waits[member]
            if group >= 0:
                if group_done[group] is None:
                    return t, ~group
                t = max(t, group_done[group])
        return t, None

    while ready:
        device = ready.pop()
        order = orders[device]
        i, t = position[device], free[device]
        while i < len(order):
            op = order[i]
            pair = pair_of.get(op) if pair_of else None
            if pair is not None:
                begin, awaited = pair_start(pair, t)
                if awaited is not None:
                    waiting.setdefault(awaited, []).append(device)
                    break
                members, t = pair.members, begin + pair.cost
                finish = t
            else:
                copy_lane = lane[op]
                issued = t  # a compute op's start so far; a copy's issue point (the compute op before it ended)
                if copy_lane:
                    t = max(t, copy_free[device][copy_lane])
                source = predecessor[op]
                if source >= 0:
                    finish = end[source]
                    if finish is None:
                        waiting.setdefault(source, []).append(device)
                        t = issued
                        break
                    finish += latency[op]
                    if finish > t:
                        t = finish
                source = restore_of[op]
                if source >= 0:
                    finish = end[source]
                    if finish is None:
                        waiting.setdefault(source, []).append(device)
                        break
                    if finish > t:
                        t = finish
                group = waits[op]
                if group >= 0:
                    finish = group_done[group]
                    if finish is None:
                        waiting.setdefault(~group, []).append(device)
                        break
                    if finish > t:
                        t = finish
                members, begin, finish = (op,), t, t + duration[op]
                if copy_lane:
                    copy_free[device][copy_lane] = finish
                    t = issued
                else:
                    t = finish
            for member in members:
                start[member] = begin
                end[member] = finish
                woken = waiting.pop(member, None)
                if woken:
                    ready.extend(woken)
                group = feeds[member]
                if group >= 0:
                    group_left[group] -= 1
                    group_end[group] = max(group_end[group], finish)
                    if group_left[group] == 0:
                        group_done[group] = group_end[group]
                        ready.extend(waiting.pop(~group, ()))
            i += len(members)
        position[device], free[device] = i, t
    stuck = [device for device, order in enumerate(orders) if position[device] < len(order)]
    if stuck:
        raise DeadlockError(_describe_deadlock(table, orders, position, stuck, end, waits, pairs))
    return np.asarray(start), np.asarray(end, dtype=float)


def _describe_deadlock(table, orders, position, stuck, end, waits, pairs=()) -> str:
    """Which devices wait on which ops, e.g. 'device 0 is stuck at 0B0, waiting for 1B0 (device 1)'
    (at a pair, the member's input that is missing)."""
    pair_of = {pair.members[0]: pair.members for pair in pairs}
    parts = []
    for device in stuck[:6]:
        index = orders[device][position[device]]
        members = pair_of.get(index, (index,))
        for member in members:
            source, restore, barrier = table.predecessor[member], table.restore_of[member], waits[member]
            if restore >= 0 and end[restore] is None:
                awaited = f"its {KINDS[table.kind[restore]].word} {table.op(restore)} (device {device})"
            elif source >= 0 and source not in members and end[source] is None:
                awaited = f"{table.op(source)} (device {table.device[source]})"
            elif barrier >= 0:
                stage, iteration = divmod(barrier, table.barrier_count)
                pending = next((table.op(i) for i in table.iteration_barrier(stage, iteration) if end[i] is None),
                               None)
                if pending is None:
                    continue
                awaited = f"the weight update of stage {stage} after iteration {iteration} (still needs {pending})"
            else:
                continue
            stuck_at = table.op(index) if len(members) == 1 else pair_text([table.op(i) for i in members])
            parts.append(f"device {device} is stuck at {stuck_at}, waiting for {awaited}")
            break
    more = f"; and {len(stuck) - 6} more devices" if len(stuck) > 6 else ""
    return "deadlock: " + "; ".join(parts) + more
