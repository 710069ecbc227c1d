"""The one simulator: the only place where times, makespan, bubble rates and memory are computed.

`simulate(problem, schedule)` either times the per-device orders (each op starts as soon as its
device is free and its predecessor, plus latency, has finished, keeping the given order) or, when
the schedule carries start times, verifies them. It names what is broken: a missing, duplicated or
misplaced op, a deadlock, a start time that breaks a dependency or overlaps, a memory violation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from zbopt import display
from zbopt.errors import DeadlockError, MemoryLimitError, ScheduleError
from zbopt.ops import COMPUTE_LANE, OFFLOAD_LANE, RELOAD_LANE, Op, OpTable
from zbopt.problem import COPY_KINDS, FORWARD, PAIR_MEMBERS, RECOMPUTE, RELOAD, Problem
from zbopt.schedule import Schedule, pair_text

RELATIVE_TOLERANCE = 1e-9
RESTORE_NAMES = {RECOMPUTE: "recompute", RELOAD: "reload"}  # the ops that make an activation whole again


def memory_ceiling(limit: float) -> float:
    """The most a device may hold under `limit`: the one memory tolerance (relative, as for times),
    shared by the simulator, the generators that plan within a limit and the bounds."""
    return limit + RELATIVE_TOLERANCE * max(1.0, limit)


@lru_cache(maxsize=16)
def op_table(problem: Problem, recomputed: frozenset[tuple[int, int]] = frozenset(),
             offloaded: frozenset[tuple[int, int]] = frozenset()) -> OpTable:
    """The op table of a problem (with the R ops of `recomputed`, the O and L ops of `offloaded`),
    cached: solvers and benchmarks simulate one problem many times."""
    return OpTable(problem, recomputed, offloaded)


@dataclass(frozen=True)
class MemoryViolation:
    """The first moment a device holds more than its memory limit."""

    device: int
    time: float
    amount: float
    limit: float

    def __str__(self) -> str:
        return f"device {self.device} holds {self.amount:g} at t={self.time:g}, over its memory limit {self.limit:g}"


@dataclass(frozen=True, eq=False)
class Simulation:
    """A timed schedule and its metrics. Build it with `simulate`, never by hand.

    Metrics (times in the problem's units, memory in its memory units):

    - `makespan`: last op end minus first op start, over all devices.
    - `busy[d]`: total duration of device d's compute ops (recomputes included: work, if
      repeated; copies excluded: they run on the copy lanes beside compute);
      `idle[d]` = makespan - busy[d].
    - `bubble_rate` = 1 - sum(busy) / (p · makespan): the idle share of all device time.
    - `span[d]`: from device d's first op start to its last op end.
    - `zb_bubble_rate` = 1 - max(busy) / max(span): the Zero Bubble paper's measure
      (span - m(F+B+W)) / span, where span is the longest per-device span. With uniform costs
      max(busy) = m·v·(F+B+W)·iterations, the paper's formula; with non-uniform costs the busiest
      device's work stands in for m(F+B+W).
    - `peak_memory[d]`: the most memory device d holds at any moment. F holds activation_memory
      from its start; B releases M_B - M_W at its end, W releases M_W at its end, BW releases M_B
      at its end. A recomputed activation's F holds only checkpoint_memory, its R the rest from
      R's start. An offloaded one is freed when its O ends and held again from its L's start.
      Releases at a moment count before allocations at the same moment.
    - `memory_steps[d]`: (times, levels): from times[i] on, device d holds levels[i].
    - `violations`: per device over its limit, the first such moment; `valid` when there is none.
    - `table.recomputed`, `table.offloaded`: the (stage, microbatch) pairs the schedule recomputes
      (its R ops) and offloads (its O and L ops).

    `device_ops[d]` are the op numbers of device d in schedule order.
    """

    problem: Problem
    schedule: Schedule
    table: OpTable  # numbers the ops; start, end are indexed by op number
    device_ops: tuple[np.ndarray, ...]
    start: np.ndarray
    end: np.ndarray
    memory_steps: tuple[tuple[np.ndarray, np.ndarray], ...]
    violations: tuple[MemoryViolation, ...]
    pairs: tuple[Pair, ...] = ()
    memory_after: np.ndarray | None = None  # per op, what its device holds right after the op's own change

    @property
    def valid(self) -> bool:
        return not self.violations

    @cached_property
    def origin(self) -> float:
        """The first op's start: time 0 of the charts, the report and the traces."""
        return float(self.start.min())

    @cached_property
    def makespan(self) -> float:
        return float(self.end.max()) - self.origin

    @cached_property
    def busy(self) -> tuple[float, ...]:
        work = np.where(np.asarray(self.table.lane) == COMPUTE_LANE, self.table.duration, 0.0)
        for pair in self.pairs:  # one op of the pair's cost
            work[list(pair.members)] = 0.0
            work[pair.members[0]] = pair.cost
        return tuple(float(work[indices].sum()) for indices in self.device_ops)

    @property
    def idle(self) -> tuple[float, ...]:
        return tuple(self.makespan - busy for busy in self.busy)

    @cached_property
    def span(self) -> tuple[float, ...]:
        return tuple(float(self.end[i].max() - self.start[i].min()) for i in self.device_ops)

    @property
    def bubble_rate(self) -> float:
        return 1.0 - sum(self.busy) / (self.problem.num_devices * self.makespan)

    @property
    def zb_bubble_rate(self) -> float:
        return 1.0 - max(self.busy) / max(self.span)

    @cached_property
    def peak_memory(self) -> tuple[float, ...]:
        return tuple(float(levels.max()) for _, levels in self.memory_steps)

    def times_of(self, op: Op) -> tuple[float, float]:
        """(start, end) of one op."""
        index = self.table.index(op)
        return float(self.start[index]), float(self.end[index])

    def to_dataframe(self):
        """One row per device: busy, idle, span, peak memory, as a pandas DataFrame (pandas is optional)."""
        return display.dataframe([{"device": device, "busy": self.busy[device], "idle": self.idle[device],
                                   "span": self.span[device], "peak_memory": self.peak_memory[device]}
                                  for device in range(self.problem.num_devices)])
    def __str__(self) -> str:
        """The CLI's table (`zbopt.display`)."""
        return display.text(self)

    def _repr_html_(self) -> str:
        """Jupyter: the table and its chart (`zbopt.display`)."""
        return display.rich(self)

    def timed_orders(self) -> Schedule:
        """The schedule with the simulated start times filled in."""
        times = [self.start[indices].tolist() for indices in self.device_ops]
        return dataclasses.replace(self.schedule, start_times=times)

    def to_dict(self) -> dict:
        """Every metric as JSON-able values, plus the problem and the timed schedule."""
        problem = self.problem
        return {
            "schedule": self.schedule.name,
            "num_stages": problem.num_devices,
            "num_devices": problem.num_devices,
            "num_virtual_stages": problem.num_stages,
            "num_microbatches": problem.num_microbatches,
            "chunks_per_device": problem.chunks_per_device,
            "placement": problem.placement,
            "iterations": problem.iterations,
            "split_backward": problem.split_backward,
            "makespan": self.makespan,
            "bubble_rate": self.bubble_rate,
            "zb_bubble_rate": self.zb_bubble_rate,
            "busy": list(self.busy),
            "idle": list(self.idle),
            "span": list(self.span),
            "peak_memory": list(self.peak_memory),
            "memory_limit": None if problem.memory_limit is None else list(problem.memory_limit),
            "valid": self.valid,
            "recomputed": [list(pair) for pair in self.table.recomputed],
            "offloaded": [list(pair) for pair in self.table.offloaded],
            "violations": [str(violation) for violation in self.violations],
            "orders": [[str(op) for op in order] for order in self.schedule.orders],
            "start_times": [self.start[indices].tolist() for indices in self.device_ops],
            "pairs": [pair_text(members) for members in self.schedule.pairs],
        }


def simulate(problem: Problem, schedule: Schedule, *, strict: bool = False) -> Simulation:
    """Time (or verify) `schedule` on `problem` and compute its metrics.

    Parameters
    ----------
    problem : the problem the schedule is for.
    schedule : per-device orders; with start times, those are verified instead of computed.
    strict : raise MemoryLimitError on a memory violation instead of reporting it.

    Returns
    -------
    Simulation with start/end times and every metric (see `Simulation`).

    Raises
    ------
    ScheduleError : an op is missing, duplicated, unknown or on the wrong device, or a given start
        time overlaps another op on its device or starts before a dependency allows.
    DeadlockError : the orders wait on each other in a cycle; names each stuck device.
    MemoryLimitError : with strict=True, the first memory violation (device, time, amount).

    Notes
    -----
    An O or L runs on its device's copy lane (`Problem.allow_offload`); it is issued when the
    compute op listed before it has ended (a runtime reaches it in its program there), and starts
    once its lane is free and its F (for O) or O (for L) has ended; compute does not wait for it,
    only the backward waits for its L. With a shared host link, two copies of a device pair that
    overlap on a lane are a ScheduleError.

    Examples
    --------
    >>> from zbopt.schedules import generate
    >>> problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    >>> simulate(problem, generate("1f1b", problem)).makespan
    33.0
    """
    table = op_table(problem, *activation_choices(schedule))
    orders = _index_orders(problem, table, schedule)
    pairs = _pairs(problem, table, schedule, orders)
    device_ops = tuple(np.asarray(indices, dtype=np.int64) for indices in orders)
    if schedule.start_times is None:
        start, end = _time_orders(table, orders, pairs)
    else:
        start, end = _verify_times(table, orders, schedule.start_times, pairs)
    if problem.shared_host_link:
        _check_shared_links(table, start, end, as_soon_as_possible=schedule.start_times is None)
    memory_steps, memory_after = _memory_steps(problem, table, start, end)
    violations = _memory_violations(problem, memory_steps)
    if strict and violations:
        raise MemoryLimitError(str(violations[0]))
    return Simulation(problem, schedule, table, device_ops, start, end, memory_steps, violations, pairs, memory_after)


def activation_choices(schedule: Schedule) -> tuple[frozenset, frozenset]:
    """The (stage, microbatch) pairs a schedule recomputes (those of its R ops) and offloads (of
    its O or L ops: a missing partner is then reported missing)."""
    recomputed, offloaded = set(), set()
    for order in schedule.orders:
        for op in order:
            if op.kind == RECOMPUTE:
                recomputed.add((op.stage, op.microbatch))
            elif op.kind in COPY_KINDS:
                offloaded.add((op.stage, op.microbatch))
    return frozenset(recomputed), frozenset(offloaded)


class Pair(NamedTuple):
    """An overlapped pair as the simulator runs it: its members' op numbers (the forward first),
    in its device's order, and its cost."""

    members: tuple[int, ...]
    cost: float


def _pairs(problem: Problem, table: OpTable, schedule: Schedule, orders: list[list[int]]) -> tuple[Pair, ...]:
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
        cost = problem.overlap_cost(kind, device)
        if cost is None:
            given = ", ".join(k for k, _ in problem.overlap_times or ()) or "none"
            raise ScheduleError(f"pair {text}: the problem's overlap_times gives no {kind} cost (it gives {given})")
        if paired & set(indices):
            raise ScheduleError(f"pair {text}: {table.op(min(paired & set(indices)))} is in another pair too")
        paired.update(indices)
        pairs.append(Pair(indices, cost))
    return tuple(pairs)


def _index_orders(problem: Problem, table: OpTable, schedule: Schedule) -> list[list[int]]:
    """Per device, the op indices of its order; checks every op appears once, on its device."""
    if schedule.num_devices != problem.num_devices:
        raise ScheduleError(
            f"the schedule has orders for {schedule.num_devices} devices, the problem has {problem.num_devices}"
        )
    device_of = table.device
    placed: list[tuple[int, int] | None] = [None] * table.size
    orders = []
    for device, order in enumerate(schedule.orders):
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


def _barrier_groups(table: OpTable) -> tuple[list[int], list[int], int]:
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


def _time_orders(table: OpTable, orders: list[list[int]],
                 pairs: tuple[Pair, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Earliest start of every op given the device orders: a longest-path sweep in which a device
    advances until its next op waits on an unfinished op, and is woken when that op finishes. An
    overlapped pair starts once all its members could, and ends them all after its cost."""
    duration, predecessor, latency, restore_of = table.duration, table.predecessor, table.latency, table.restore_of
    lane = table.lane
    waits, feeds, group_count = _barrier_groups(table)
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
                awaited = f"its {RESTORE_NAMES[table.kind[restore]]} {table.op(restore)} (device {device})"
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


def _verify_times(table: OpTable, orders: list[list[int]], start_times,
                  pairs: tuple[Pair, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Check given start times: ops on a device in order without overlap, dependencies and latency
    (and iteration barriers) respected, up to a relative tolerance; an overlapped pair's members
    start together and end after its cost."""
    start = np.zeros(table.size)
    for indices, times in zip(orders, start_times, strict=True):
        start[indices] = times
    end = start + np.asarray(table.duration)
    pair_of = np.full(table.size, -1)
    for number, pair in enumerate(pairs):
        members = list(pair.members)
        if np.ptp(start[members]) > 0:
            names = ", ".join(f"{table.op(i)} at {start[i]:g}" for i in members)
            text = pair_text([table.op(i) for i in members])
            raise ScheduleError(f"pair {text}: its ops start together, not {names}")
        end[members] = start[members[0]] + pair.cost
        pair_of[members] = number
    tolerance = RELATIVE_TOLERANCE * max(1.0, float(np.abs(end).max()))
    for device, indices in enumerate(orders):
        for before, after in _listed_before(table, indices):
            if pair_of[before] >= 0 and pair_of[before] == pair_of[after]:
                continue  # one op
            if start[after] < end[before] - tolerance:
                raise ScheduleError(
                    f"device {device}: {table.op(after)} starts at {start[after]:g}, before {table.op(before)} "
                    f"(listed before it) ends at {end[before]:g}"
                )
    predecessor = np.asarray(table.predecessor)
    has_source = (predecessor >= 0) & ((pair_of < 0) | (pair_of[predecessor] != pair_of))  # W after its B in a pair
    ready = np.full(table.size, -np.inf)
    ready[has_source] = end[predecessor[has_source]] + np.asarray(table.latency)[has_source]
    restore_of = np.asarray(table.restore_of)
    restored = restore_of >= 0
    ready[restored] = np.maximum(ready[restored], end[restore_of[restored]])
    waits, _, _ = _barrier_groups(table)
    for index in np.flatnonzero(np.asarray(waits) >= 0):
        stage, iteration = divmod(waits[index], table.barrier_count)
        ready[index] = max(ready[index], end[list(table.iteration_barrier(stage, iteration))].max())
    early = np.flatnonzero(start < ready - tolerance)
    if early.size:
        index = int(early[0])
        source = table.predecessor[index]
        op = table.op(index)
        restore = table.restore_of[index]
        if restore >= 0 and start[index] < end[restore] - tolerance:
            raise ScheduleError(f"{op} starts at {start[index]:g}, before its {RESTORE_NAMES[table.kind[restore]]} "
                                f"{table.op(restore)} ends at {end[restore]:g}")
        if source >= 0 and start[index] < end[source] + table.latency[index] - tolerance:
            latency = f" plus latency {table.latency[index]:g}" if table.latency[index] else ""
            raise ScheduleError(
                f"{op} starts at {start[index]:g}, before its dependency {table.op(source)} "
                f"(device {table.device[source]}) ends at {end[source]:g}{latency}"
            )
        raise ScheduleError(f"{op} starts at {start[index]:g}, before its stage's weight update at {ready[index]:g}")
    return start, end


def _listed_before(table: OpTable, indices):
    """(before, after) pairs of one device's order that may not overlap: each op and the compute op
    listed last before it (a copy is issued once that has ended), and each copy and the copy listed
    last before it on its lane."""
    lane = table.lane
    if not any(lane[index] for index in indices):
        yield from pairwise(indices)
        return
    last = {}  # lane -> the op listed last on it so far
    for index in indices:
        if COMPUTE_LANE in last:
            yield last[COMPUTE_LANE], index
        if lane[index] != COMPUTE_LANE and lane[index] in last:
            yield last[lane[index]], index
        last[lane[index]] = index


def _check_shared_links(table: OpTable, start: np.ndarray, end: np.ndarray, as_soon_as_possible: bool) -> None:
    """With devices 2k and 2k+1 sharing a host link, no two copies of a pair overlap on a lane.
    Which of a pair's copies goes first is in neither device's order, so orders timed as soon as
    possible may clash here: the message then asks for start times."""
    lane = np.asarray(table.lane)
    device = np.asarray(table.device)
    link = np.asarray([table.problem.host_link(d) for d in table.device])
    tolerance = RELATIVE_TOLERANCE * max(1.0, float(np.abs(end).max()))
    for copy_lane in (OFFLOAD_LANE, RELOAD_LANE):
        copies = np.flatnonzero(lane == copy_lane)
        order = copies[np.lexsort((start[copies], link[copies]))]
        for before, after in pairwise(order):
            if link[before] == link[after] and start[after] < end[before] - tolerance:
                direction = "device-to-host" if copy_lane == OFFLOAD_LANE else "host-to-device"
                hint = "; whose copy goes first is in neither order: give start times" if as_soon_as_possible else ""
                raise ScheduleError(
                    f"{table.op(after)} (device {device[after]}) starts at {start[after]:g}, while "
                    f"{table.op(before)} (device {device[before]}) holds their shared host link "
                    f"({direction}) until {end[before]:g}{hint}")


def _memory_steps(problem: Problem, table: OpTable, start: np.ndarray, end: np.ndarray):
    """Per device, the memory step function (times, levels) from the alloc/free events; and per op,
    the level right after its own event (changes at one moment counted in the steps' order)."""
    device = np.asarray(table.device)
    delta = np.asarray(table.memory_delta)
    allocates = np.asarray(table.allocates_at_start)
    when = np.where(allocates, start, end)
    # a free that ends within the time tolerance after an allocation starts counts as before it:
    # float noise (a period of 25/3 repeated) must not make two activations overlap
    settled = np.where(allocates, when, when - RELATIVE_TOLERANCE * np.maximum(1.0, np.abs(when)))
    order = np.lexsort((allocates, settled, device))
    levels = np.cumsum(delta[order])
    times = when[order]
    counts = np.bincount(device, minlength=problem.num_devices)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    steps = []
    after = np.empty(table.size)
    for d in range(problem.num_devices):
        lo, hi = bounds[d], bounds[d + 1]
        device_levels = levels[lo:hi] - (levels[lo - 1] if lo else 0.0)
        after[order[lo:hi]] = device_levels
        device_times = times[lo:hi]
        last_at_time = np.append(device_times[1:] != device_times[:-1], True)
        steps.append((device_times[last_at_time], device_levels[last_at_time]))
    return tuple(steps), after


def _memory_violations(problem: Problem, memory_steps) -> tuple[MemoryViolation, ...]:
    if problem.memory_limit is None:
        return ()
    violations = []
    for device, ((times, levels), limit) in enumerate(zip(memory_steps, problem.memory_limit, strict=True)):
        over = np.flatnonzero(levels > memory_ceiling(limit))
        if over.size:
            i = over[0]
            violations.append(MemoryViolation(device, float(times[i]), float(levels[i]), limit))
    return tuple(violations)
