"""Timing per-device orders: each op starts as soon as its device is free and its inputs (plus
latency, iteration barriers, restores) have finished; a deadlock is named device by device."""

from __future__ import annotations

import numpy as np

from zbopt.core import interrupt
from zbopt.core.errors import DeadlockError
from zbopt.core.kinds import FORWARD, KINDS, REGATHER
from zbopt.core.ops import COMPUTE_LANE, GATHER_LANE, Op, OpTable
from zbopt.core.problem.mechanisms import compute_slowed, unshard_windows, unshards_done
from zbopt.core.schedule import pair_text
from zbopt.core.simulation.ends import device_ends
from zbopt.core.simulation.result import Pair
from zbopt.core.simulation.slowdown import Slowdown

__all__ = ["barrier_groups", "same_device_input_name", "time_orders"]


def same_device_input_name(table: OpTable, index: int, other: int) -> str:
    """How a message names an op's same-device input: "its recompute 0R1", "its slice 0F2"."""
    word = "slice" if table.kind[other] == table.kind[index] else KINDS[table.kind[other]].word
    return f"its {word} {table.op(other)}"


def barrier_groups(table: OpTable) -> tuple[list[int], list[int], int]:
    """Iteration barriers as (group each forward waits for, group each op feeds, count); -1 where
    none. A forward of stage s in iteration k + 1 waits for group s · barrier_count + k. Without
    the iteration's ends group g is fed by stage s's gradient ops of iteration k (the weight
    update); with them by every compute op of device d in iteration k (its optimizer step), g =
    d · barrier_count + k; a re-gather (G) of iteration k + 1 waits for the group of its device's
    last stage (its all-gather lane is free once that stage's unshard has ended)."""
    problem = table.problem
    waits = [-1] * table.size
    feeds = [-1] * table.size
    boundaries = table.barrier_count
    m = problem.num_microbatches
    for stage in range(problem.num_stages):
        for iteration in range(boundaries):
            first_forward = table.index(Op(FORWARD, stage, (iteration + 1) * m))
            waits[first_forward:first_forward + m] = [stage * boundaries + iteration] * m
            if problem.iteration_ends is None:
                for index in table.iteration_barrier(stage, iteration):
                    feeds[index] = stage * boundaries + iteration
    if problem.iteration_ends is not None and boundaries:
        for index, (device, lane, iteration) in enumerate(zip(table.device, table.lane, table.iteration, strict=True)):
            if lane == COMPUTE_LANE and iteration < boundaries:
                feeds[index] = device * boundaries + iteration
        for stage, microbatch in table.regathered:
            if microbatch >= m:
                last = problem.stages_of_device[problem.device_of(stage)][-1]
                waits[table.index(Op(REGATHER, stage, microbatch))] = last * boundaries + microbatch // m - 1
    return waits, feeds, problem.num_stages * boundaries


def time_orders(table: OpTable, orders: list[list[int]], pairs: tuple[Pair, ...] = (),
                not_before: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Earliest start and end of every op given the device orders: a longest-path sweep in which a
    device advances until its next op waits on an unfinished op, and is woken when that op
    finishes. An overlapped pair starts once all its members could, and ends them all after its
    cost. With `comm_slowdown`, compute slows while its device communicates (`Slowdown`); no op
    starts before its `not_before` (given start times kept as the earliest). Raises DeadlockError
    naming the stuck devices when some order can never finish."""
    sweep = _Sweep(table, orders, pairs, not_before)
    sweep.run()
    stuck = [device for device, order in enumerate(orders) if sweep.position[device] < len(order)]
    if stuck:
        raise DeadlockError(sweep.describe_deadlock(stuck))
    return np.asarray(sweep.start), np.asarray(sweep.end[:table.size], dtype=float)  # without the barriers


class _Sweep:
    """The sweep's state: per op its start and end (None until timed), per device its place in its
    order and when its compute and copy lanes are free, and who waits on what.

    Besides its predecessor an op waits on its other inputs (`other_inputs`): those on its device
    (`OpTable.same_device_inputs`: a restore, a neighbouring slice) and, for a forward, its
    iteration's barrier. A barrier is timed as one more entry of `end` (number size + group): it
    ends when its group's last gradient op does or, with the iteration's ends, when its stage's
    next unshard does, after its device's step (`barrier_done`).

    `run` is one loop on purpose: its body runs once per op, where a function call per op would
    cost several percent of the simulator's time (benchmarks/bench_simulator.py); what runs once,
    or once per pair, is apart."""

    def __init__(self, table: OpTable, orders: list[list[int]], pairs: tuple[Pair, ...],
                 not_before: np.ndarray | None):
        self.table, self.orders, self.pairs = table, orders, pairs
        self.not_before = None if not_before is None else not_before.tolist()
        self.slowdown = Slowdown(table) if compute_slowed(table.problem) else None
        self.waits, self.feeds, groups = barrier_groups(table)
        self.other_inputs = table.same_device_inputs
        if groups:
            self.other_inputs = [(*inputs, table.size + group) if group >= 0 else inputs
                                 for inputs, group in zip(table.same_device_inputs, self.waits, strict=True)]
        fed = np.bincount([group for group in self.feeds if group >= 0], minlength=groups)
        self.left = fed.tolist()  # per barrier group, its feeding ops still to end
        self.latest = [0.0] * len(fed)  # per barrier group, the latest end of its feeding ops so far
        self.steps_done = [0.0] * len(orders)  # with the iteration's ends, per device its last step's end
        self.start = [0.0] * table.size
        self.end: list[float | None] = [None] * (table.size + groups)
        self._wait_for_releases(table)
        self.position = [0] * len(orders)  # per device, the place of its next op in its order
        self.free = [0.0] * len(orders)  # per device, when its compute lane is free
        self.copy_free = [[0.0] * 4 for _ in orders]  # per device, when each lane beside compute is free
        self.waiting: dict[int, list[int]] = {}  # number in `end` -> devices waiting on it
        self.ready = list(range(len(orders) - 1, -1, -1))  # devices to advance, device 0 first
        self.pair_of = {pair.members[0]: pair for pair in pairs}

    def _wait_for_releases(self, table: OpTable) -> None:
        """An op with a release time (`OpTable.release`: a forward waits for FSDP's unshard) also
        waits for an entry of `end` known from the start, one per distinct release time."""
        times = sorted(set(table.release) - {0.0})
        if not times:
            return
        entry = {time: len(self.end) + k for k, time in enumerate(times)}
        self.end.extend(times)
        self.other_inputs = [(*inputs, entry[release]) if release else inputs
                             for inputs, release in zip(self.other_inputs, table.release, strict=True)]

    def run(self) -> None:
        """Advance each ready device through its order until its next op waits on an unfinished op
        (or barrier); a copy (O, L) waits for its lane, not holding up compute."""
        table = self.table
        duration, predecessor, latency, lane = table.duration, table.predecessor, table.latency, table.lane
        other_inputs, feeds, left, latest = self.other_inputs, self.feeds, self.left, self.latest
        orders, start, end, position, free = self.orders, self.start, self.end, self.position, self.free
        copy_free, waiting, ready, pair_of = self.copy_free, self.waiting, self.ready, self.pair_of
        not_before, slow = self.not_before, self.slowdown
        while ready:
            interrupt.check()  # a deadline_scope's limit (the plan's heuristics at m in the thousands), or Ctrl-C
            device = ready.pop()
            order = orders[device]
            i, t = position[device], free[device]
            while i < len(order):
                op = order[i]
                pair = pair_of.get(op) if pair_of else None
                if pair is not None:
                    begin, awaited = self.pair_start(pair, t)
                    if awaited is not None:
                        waiting.setdefault(awaited, []).append(device)
                        break
                    if not_before is not None and not_before[op] > begin:
                        begin = not_before[op]
                    members = pair.members
                    finish = begin + pair.cost if slow is None else slow.finish(device, begin, pair.cost)
                    t = finish
                else:
                    copy_lane = lane[op]
                    begin = t  # a copy is issued when the compute op before it has ended
                    if copy_lane and copy_free[device][copy_lane] > begin:
                        begin = copy_free[device][copy_lane]
                    source = predecessor[op]
                    if source >= 0:
                        finish = end[source]
                        if finish is None:
                            waiting.setdefault(source, []).append(device)
                            break
                        finish += latency[op]
                        if finish > begin:
                            begin = finish
                    awaited = -1
                    for other in other_inputs[op]:
                        if end[other] is None:
                            awaited = other
                            break
                        if end[other] > begin:
                            begin = end[other]
                    if awaited >= 0:
                        waiting.setdefault(awaited, []).append(device)
                        break
                    if not_before is not None and not_before[op] > begin:
                        begin = not_before[op]
                    members, finish = (op,), begin + duration[op]
                    if copy_lane:
                        copy_free[device][copy_lane] = finish
                        if slow is not None and copy_lane == GATHER_LANE:
                            slow.add(device, begin, finish)
                    else:
                        if slow is not None:
                            finish = slow.finish(device, begin, duration[op])
                        t = finish
                for member in members:
                    start[member] = begin
                    end[member] = finish
                    if slow is not None:
                        slow.ended(device, member, finish)
                    woken = waiting.pop(member, None)
                    if woken:
                        ready.extend(woken)
                    group = feeds[member]
                    if group >= 0:
                        left[group] -= 1
                        if finish > latest[group]:
                            latest[group] = finish
                        if not left[group]:
                            self.barrier_done(group)
                i += len(members)
            position[device], free[device] = i, t

    def barrier_done(self, group: int) -> None:
        """A barrier group's feeding ops have all ended: time what its forwards wait for (the
        weight update: the group's last gradient op; with the iteration's ends, its device's
        reductions and step, then each stage's unshard of the next iteration) and wake them."""
        table, end, boundaries = self.table, self.end, self.table.barrier_count
        problem = table.problem
        if problem.iteration_ends is None:
            released = {group: self.latest[group]}
        else:
            device, iteration = divmod(group, boundaries)
            stages = problem.stages_of_device[device]
            gradients_done = {stage: max(end[index] for index in table.iteration_barrier(stage, iteration))
                              for stage in stages}
            stream_free = unshards_done(problem, tuple(self.steps_done))[device]
            placed = device_ends(problem, device, stream_free, self.latest[group], gradients_done)
            self.steps_done[device] = placed.step[1]
            if self.slowdown is not None:
                self.slowdown.next_iteration(device, tuple(self.steps_done))
            windows = unshard_windows(problem, tuple(self.steps_done))
            released = {stage * boundaries + iteration: windows[stage][1] for stage in stages}
        for entry, time in released.items():
            end[table.size + entry] = time
            self.ready.extend(self.waiting.pop(table.size + entry, ()))

    def pair_start(self, pair: Pair, t: float) -> tuple[float, int | None]:
        """The pair's start given its device is free at `t`, or (t, the number in `end` of what it
        waits for)."""
        predecessor, latency, other_inputs, end = (self.table.predecessor, self.table.latency, self.other_inputs,
                                                   self.end)
        for member in pair.members:
            source = predecessor[member]
            if source >= 0 and source not in pair.members:
                if end[source] is None:
                    return t, source
                t = max(t, end[source] + latency[member])
            for other in other_inputs[member]:
                if end[other] is None:
                    return t, other
                t = max(t, end[other])
        return t, None

    def barrier_pending(self, entry: int) -> str | None:
        """What a barrier still waits for, e.g. 'the weight update of stage 1 after iteration 0
        (still needs 1W3)', or None where nothing is missing."""
        table = self.table
        stage, iteration = divmod(entry, table.barrier_count)
        if table.problem.iteration_ends is None:
            feeding = table.iteration_barrier(stage, iteration)
            what = f"the weight update of stage {stage} after iteration {iteration}"
        else:
            device = table.problem.device_of(stage)
            group = device * table.barrier_count + iteration
            feeding = [index for index, fed in enumerate(self.feeds) if fed == group]
            what = f"the optimizer step of device {device} after iteration {iteration}"
        pending = next((table.op(index) for index in feeding if self.end[index] is None), None)
        return None if pending is None else f"{what} (still needs {pending})"

    def describe_deadlock(self, stuck: list[int]) -> str:
        """Which devices wait on which ops, e.g. 'device 0 is stuck at 0B0, waiting for 1B0 (device 1)'
        (at a pair, the member's input that is missing)."""
        table, end, waits = self.table, self.end, self.waits
        pair_of = {pair.members[0]: pair.members for pair in self.pairs}
        parts = []
        for device in stuck[:6]:
            index = self.orders[device][self.position[device]]
            members = pair_of.get(index, (index,))
            for member in members:
                source, barrier = table.predecessor[member], waits[member]
                local = next((other for other in table.same_device_inputs[member] if end[other] is None), None)
                if local is not None:
                    awaited = f"{same_device_input_name(table, member, local)} (device {device})"
                elif source >= 0 and source not in members and end[source] is None:
                    awaited = f"{table.op(source)} (device {table.device[source]})"
                elif barrier >= 0 and (pending := self.barrier_pending(barrier)) is not None:
                    awaited = pending
                else:
                    continue
                stuck_at = table.op(index) if len(members) == 1 else pair_text([table.op(i) for i in members])
                parts.append(f"device {device} is stuck at {stuck_at}, waiting for {awaited}")
                break
        more = f"; and {len(stuck) - 6} more devices" if len(stuck) > 6 else ""
        return "deadlock: " + "; ".join(parts) + more
