"""Schedules that offload activations to host memory: PipeOffload's rule, full offload fitted to
the memory limit, and a serial fallback.

PipeOffload (Wan et al., ICML 2025; the Zero Bubble repository's
`megatron/core/pipeline_parallel/zerobubble/scheduler/offloading.py`, `add_offload_in_schedule`)
adds copies to a schedule without moving its compute: each activation flagged for offload is
copied out once its F has ended and the device-to-host stream is free, in forward order, and
copied back, planned from the end in reverse backward order, to be in place one backward's
length before its B (the file's "buffer for robustness"). An activation whose B comes less than
3 (offload + reload) after that is not offloaded (the same file's rule for invalid keys). The
compute keeps its times, so the makespan is the base schedule's; only memory drops.

What zbopt chose where the file is not the rule: every activation is a candidate (the file takes
the flags a schedule generator set); one whose copies do not fit the lanes in time is kept (the
file asserts instead); with a shared host link, the pair's copies take turns on one lane each way
as they come (the file gives the pair fixed alternating slots, a period of offload + reload).
`full-offload` and `serial-offload` are zbopt's, for limits where fixed compute does not fit.
"""

from __future__ import annotations

import bisect

import numpy as np

from zbopt.core.errors import NotApplicableError
from zbopt.core.kinds import COPY_KINDS, FORWARD, FUSED_BACKWARD, OFFLOAD, RELOAD, WEIGHT
from zbopt.core.ops import Op, OpTable
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshards_done
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import activation_choices, simulate
from zbopt.core.simulation.ends import device_ends, held_throughout
from zbopt.core.tolerance import memory_ceiling
from zbopt.schedules.common import backward_ops, schedule_from_starts, serial_peak
from zbopt.schedules.registry import generate, register, require

__all__ = ["ROBUSTNESS_COPIES", "full_offload", "pipeoffload", "serial_offload"]

_NEEDS = "allow_offload: true (and offload_times)"
ROBUSTNESS_COPIES = 3  # offloading.py: an activation is offloaded only if its gap exceeds 3 (offload + reload)


def _base_schedule(problem: Problem, base: str | None, name: str) -> Schedule:
    """The schedule of the registered `base` (default 1f1b, interleaved-1f1b for
    v > 1) built without the memory limit, which the copies are there to meet; a precondition of
    the base, or a base that already recomputes or offloads, is reported under `name`."""
    base = base or ("1f1b" if problem.chunks_per_device == 1 else "interleaved-1f1b")
    try:
        schedule = generate(base, problem.replace(memory_limit=None))
    except NotApplicableError as error:
        raise NotApplicableError(f"{name}: {error}") from None
    if any(op.kind not in problem.kinds for order in schedule.orders for op in order):
        raise NotApplicableError(f"{name}: base schedule '{base}' already recomputes or offloads")
    if schedule.pairs:
        raise NotApplicableError(f"{name}: base schedule '{base}' runs overlapped pairs, which {name} does not "
                                 "keep (give a base without pairs, or no overlap_times)")
    return schedule


@register("pipeoffload", "PipeOffload (Wan et al., ICML 2025) on a base schedule (default 1f1b, interleaved-1f1b "
                         "for v > 1): its compute unchanged, activations copied out after F and back one B early")
def pipeoffload(problem: Problem, base: str | None = None) -> Schedule:
    """See the module docstring. `base`: the registered schedule whose compute is kept (timed
    without the memory limit, which the copies are there to meet). Needs allow_offload."""
    require(problem.offload is not None, "pipeoffload", _NEEDS)
    schedule = _base_schedule(problem, base, "pipeoffload")
    timed = simulate(problem.replace(memory_limit=None), schedule)
    starts = {op: timed.times_of(op)[0] for op in timed.table.ops()}
    gradient = problem.input_gradient_kind
    candidates = []  # (forward end, backward start, backward length, stage, microbatch)
    for stage in range(problem.num_stages):
        for microbatch in range(problem.total_microbatches):
            forward_end = timed.times_of(Op(FORWARD, stage, microbatch))[1]
            backward_start, backward_end = timed.times_of(Op(gradient, stage, microbatch))
            copies = problem.offload.offload_times[stage] + problem.offload.reload_times[stage]
            if backward_start - (backward_end - backward_start) - forward_end > ROBUSTNESS_COPIES * copies:
                candidates.append((forward_end, backward_start, backward_end - backward_start, stage, microbatch))
    offloaded = _place_offloads(problem, candidates, starts)
    in_free: dict[int, float] = {}  # per link, the start of the earliest reload planned so far
    kept = set()
    for _, backward_start, length, stage, microbatch in sorted(candidates, key=lambda c: c[1], reverse=True):
        lane = problem.host_link(problem.device_of(stage))
        begin = min(backward_start - length, in_free.get(lane, backward_start)) - problem.offload.reload_times[stage]
        if begin < offloaded[stage, microbatch]:  # no room for both copies in time: kept
            kept.add((stage, microbatch))
            continue
        in_free[lane] = starts[Op(RELOAD, stage, microbatch)] = begin
    if kept:  # the offloads left move up into the lane time the kept ones gave back (ending earlier)
        for stage, microbatch in offloaded:
            del starts[Op(OFFLOAD, stage, microbatch)]
        _place_offloads(problem, [c for c in candidates if (c[3], c[4]) not in kept], starts)
    return schedule_from_starts(problem, starts, "pipeoffload", timed=True)


def _place_offloads(problem: Problem, candidates: list[tuple], starts: dict[Op, float]) -> dict:
    """Each candidate's O once its F has ended and its lane is free, in forward order, into
    `starts`; per (stage, microbatch), the O's end."""
    out_free: dict[int, float] = {}
    offloaded = {}
    for forward_end, _, _, stage, microbatch in sorted(candidates):
        lane = problem.host_link(problem.device_of(stage))
        begin = max(forward_end, out_free.get(lane, 0.0))
        out_free[lane] = offloaded[stage, microbatch] = begin + problem.offload.offload_times[stage]
        starts[Op(OFFLOAD, stage, microbatch)] = begin
    return offloaded


@register("serial-offload", "zbopt's fallback at the least limit with offload: one microbatch at a time, every "
                            "activation offloaded but the last stage's",
          lambda problem: serial_peak(problem, lambda plain: plain.min_memory_limit))
def serial_offload(problem: Problem) -> Schedule:
    """Microbatch by microbatch, its forwards stage by stage, each activation but the last stage's
    offloaded before the device's next forward starts, then its backwards, each reloaded once the
    device has freed the one before: a device holds at most one stage's activation, the least
    limit with offload (`Problem.min_memory_limit`; with FSDP, the least that keeps its parameters,
    and all its gradients held until their reductions: `serial_peak`). Slow, but it fits where
    nothing else does, so the optimizer has a warm start at any limit from there up. Any v and
    placement; needs allow_offload."""
    require(problem.offload is not None, "serial-offload", _NEEDS)
    last = problem.num_stages - 1
    starts: dict[Op, float] = {}
    now = 0.0  # everything of the microbatches before has ended
    compute_free = list(unshards_done(problem))
    steps = None  # with the iteration's ends, per device the end of its last optimizer step
    out_free: dict[int, float] = {}
    in_free: dict[int, float] = {}
    held_until = [0.0] * problem.num_devices  # when the device's last activation was freed

    def run(op: Op, ready: float) -> float:
        device = problem.device_of(op.stage)
        starts[op] = begin = max(ready, compute_free[device])
        compute_free[device] = begin + problem.cost(op.kind, op.stage)
        return compute_free[device]

    def copy(op: Op, ready: float, lanes: dict[int, float]) -> float:
        lane = problem.host_link(problem.device_of(op.stage))
        starts[op] = begin = max(ready, lanes.get(lane, 0.0))
        lanes[lane] = begin + problem.cost(op.kind, op.stage)
        return lanes[lane]

    for microbatch in range(problem.total_microbatches):
        arrival = now
        for stage in range(problem.num_stages):
            device = problem.device_of(stage)
            if stage and problem.device_of(stage - 1) != device:
                arrival += problem.p2p_time
            arrival = run(Op(FORWARD, stage, microbatch), max(arrival, held_until[device]))
            if stage != last:
                held_until[device] = copy(Op(OFFLOAD, stage, microbatch), arrival, out_free)
        for stage in range(last, -1, -1):
            device = problem.device_of(stage)
            if stage != last:
                if problem.device_of(stage + 1) != device:
                    arrival += problem.p2p_time
                offload_end = starts[Op(OFFLOAD, stage, microbatch)] + problem.offload.offload_times[stage]
                reloaded = copy(Op(RELOAD, stage, microbatch), max(offload_end, held_until[device]), in_free)
                arrival = max(arrival, reloaded)
            ops = backward_ops(problem, stage, microbatch)
            arrival = run(ops[0], arrival)
            held_until[device] = arrival
            for op in ops[1:]:
                held_until[device] = run(op, held_until[device])
        now = max(compute_free)
        compute_free = [now] * problem.num_devices
        if problem.iteration_ends is not None and (microbatch + 1) % problem.num_microbatches == 0 \
                and microbatch + 1 < problem.total_microbatches:
            steps = _steps_done(problem, starts, microbatch // problem.num_microbatches, steps)
            compute_free = list(unshards_done(problem, steps))  # the next iteration's gathers, after the steps
            now = max(now, *compute_free)
    return schedule_from_starts(problem, starts, "serial-offload", timed=True)


def _steps_done(problem: Problem, starts: dict[Op, float], iteration: int,
                before: tuple[float, ...] | None) -> tuple[float, ...]:
    """Per device, when its optimizer step of `iteration` ends (`device_ends`), for ops starting at
    `starts`; `before`: the steps of the iteration before (None for the first)."""
    compute_done = [0.0] * problem.num_devices
    gradients_done = [0.0] * problem.num_stages
    for op, begin in starts.items():
        if op.microbatch // problem.num_microbatches == iteration and op.kind not in COPY_KINDS:
            end, device = begin + problem.cost(op.kind, op.stage), problem.device_of(op.stage)
            compute_done[device] = max(compute_done[device], end)
            if op.kind in (WEIGHT, FUSED_BACKWARD):
                gradients_done[op.stage] = max(gradients_done[op.stage], end)
    return tuple(device_ends(problem, device, free, compute_done[device],
                             {stage: gradients_done[stage] for stage in stages}).step[1]
                 for device, (stages, free) in enumerate(zip(problem.stages_of_device,
                                                             unshards_done(problem, before), strict=True)))


@register("full-offload", "every activation but the last stage's offloaded on a base schedule's order (default "
                          "1f1b, interleaved-1f1b for v > 1), each allocation waiting until the memory limit has room")
def full_offload(problem: Problem, base: str | None = None) -> Schedule:
    """PipeOffload's full offload (its paper's finding: often all activations can be offloaded)
    on the order of `base`, fitted to the memory limit: O right after each F, L listed after the
    last forward before its backward (issued when that forward ends), and every op that allocates
    (F, L) started once the device has room for it given what its earlier ops free by then.
    The last stage's backward follows its forward, so its activations stay. zbopt's rules; a
    warm start near the floor, where PipeOffload's fixed compute does not fit. NotApplicable
    when the order cannot fit the limit (an allocation waits on memory only later ops free).
    Needs allow_offload and one iteration."""
    require(problem.offload is not None, "full-offload", _NEEDS)
    require(problem.iterations == 1, "full-offload", "iterations = 1")
    schedule = _base_schedule(problem, base, "full-offload")
    last = problem.num_stages - 1
    gradient = problem.input_gradient_kind
    orders = []
    for order in schedule.orders:
        reloads: dict[int, list[Op]] = {}  # number of forwards listed before a backward -> its L, issued then
        forwards = 0
        for op in order:
            forwards += op.kind == FORWARD
            if op.kind == gradient and op.stage != last:
                reloads.setdefault(forwards, []).append(Op(RELOAD, op.stage, op.microbatch))
        with_copies: list[Op] = list(reloads.get(0, []))
        forwards = 0
        for op in order:
            with_copies.append(op)
            if op.kind == FORWARD:
                forwards += 1
                if op.stage != last:
                    with_copies.append(Op(OFFLOAD, op.stage, op.microbatch))
                with_copies += reloads.get(forwards, [])
        orders.append(with_copies)
    return Schedule(orders, _fitted_times(problem, orders, "full-offload"), name="full-offload")


def _fitted_times(problem: Problem, orders: list[list[Op]], name: str) -> list[list[float]]:
    """Start times of `orders` as soon as possible (`simulate`'s rules: a copy is issued when the
    compute op listed before it ends and waits for its input and for the device's copy listed
    before it on its lane), except that a copy takes the first gap of its lane (which the pair's
    other device also uses with a shared host link) and an op that allocates memory also waits
    until its device holds, from then on, at most the limit with it, counting what the ops placed
    so far free. A reload without room yet waits while the compute ops after it run (their frees
    may make room; its backward waits for it); a forward cannot. One iteration only (no
    weight-update barrier)."""
    fitting = _Fitting(problem, orders, name)
    while fitting.ready:
        device = fitting.ready.pop()
        fitting.advance(device)
        fitting.try_deferred(device)
    return fitting.start_times()


class _Fitting:
    """`_fitted_times` under way: per op its start and end (None until placed); per device its
    memory events, its place in its order, when its compute is free, its reloads waiting for
    room; per host link and lane the copies placed; and the devices to advance."""

    def __init__(self, problem: Problem, orders: list[list[Op]], name: str):
        self.problem, self.name = problem, name
        self.table = table = OpTable(problem, *activation_choices(Schedule(orders)))
        self.indices = [[table.index(op) for op in order] for order in orders]
        self.caps = [memory_ceiling(limit) - gathered for limit, gathered in zip(problem.memory_caps,
                                                                                 held_throughout(problem), strict=True)]
        self.start = [0.0] * table.size
        self.end: list[float | None] = [None] * table.size
        # per device, its memory events so far as (time, allocates, change), in order (a free first at a moment)
        self.events: list[list[tuple[float, bool, float]]] = [[] for _ in orders]
        self.position, self.compute_free = [0] * len(orders), list(unshards_done(problem))
        self.busy: dict[tuple[int, int], list[tuple[float, float]]] = {}  # per (host link, lane), (start, end) sorted
        self.own_end: dict[tuple[int, int], float] = {}  # per (device, lane), the end of its copy placed last
        self.issued = [0.0] * table.size  # a copy's issue point
        self.deferred: list[list[int]] = [[] for _ in orders]  # per device, reloads waiting for room, in order
        self.waiting: dict[int, list[int]] = {}  # op index -> devices waiting for it to be placed
        self.ready = list(range(len(orders) - 1, -1, -1))

    def advance(self, device: int) -> None:
        """Place the device's ops in order until one waits on an op not placed yet."""
        table, end, order = self.table, self.end, self.indices[device]
        while self.position[device] < len(order):
            self.try_deferred(device)
            index = order[self.position[device]]
            sources = [(table.predecessor[index], table.latency[index]),
                       *((other, 0.0) for other in table.same_device_inputs[index])]
            pending = next((source for source, _ in sources if source >= 0 and end[source] is None), None)
            if pending is not None:
                if pending in self.deferred[device]:
                    raise self.no_room(device, pending)
                self.waiting.setdefault(pending, []).append(device)
                return
            t = max([self.compute_free[device], *(end[source] + latency for source, latency in sources if source >= 0)])
            self.position[device] += 1
            t = self.earliest_start(device, index, t)
            if t is not None:
                self.place(device, index, t)

    def earliest_start(self, device: int, index: int, ready: float) -> float | None:
        """When the op whose inputs are in at `ready` starts: a copy in a gap of its lane (None: a
        reload without room, or behind one, deferred), an op that allocates once it has room."""
        table = self.table
        if table.lane[index]:
            self.issued[index] = self.compute_free[device]
            t = self.copy_start(device, index, ready) if not self.deferred[device] else None
            if t is None:
                self.deferred[device].append(index)
            return t
        if table.allocates_at_start[index] and table.memory_delta[index] > 0:
            t = _room_from(self.events[device], ready, table.memory_delta[index], self.caps[device])
            if t is None:
                raise self.no_room(device, index)
            return t
        return ready

    def place(self, device: int, index: int, t: float) -> None:
        table = self.table
        self.start[index], self.end[index] = t, t + table.duration[index]
        allocates = table.allocates_at_start[index]
        bisect.insort(self.events[device], (t if allocates else self.end[index], allocates, table.memory_delta[index]))
        if table.lane[index]:
            link = (self.problem.host_link(device), table.lane[index])
            bisect.insort(self.busy.setdefault(link, []), (t, self.end[index]))
            self.own_end[device, table.lane[index]] = self.end[index]
        else:
            self.compute_free[device] = self.end[index]
        self.ready.extend(self.waiting.pop(index, ()))

    def copy_start(self, device: int, index: int, earliest: float) -> float | None:
        """The copy's first start from `earliest` on, after the device's copy before it on the lane,
        in a gap of the lane, with room for a reload's allocation (None: no room yet)."""
        table = self.table
        lane, duration = table.lane[index], table.duration[index]
        t = max(earliest, self.own_end.get((device, lane), 0.0))
        while True:
            if table.memory_delta[index] > 0:
                t = _room_from(self.events[device], t, table.memory_delta[index], self.caps[device])
                if t is None:
                    return None
            moved = t
            for begin, finish in self.busy.get((self.problem.host_link(device), lane), ()):  # disjoint, in order
                if begin < moved + duration and finish > moved:
                    moved = finish
            if moved == t:
                return t
            t = moved

    def try_deferred(self, device: int) -> None:
        """Place the device's deferred reloads that have room now, in order."""
        for index in list(self.deferred[device]):
            t = self.copy_start(device, index, max(self.issued[index], self.end[self.table.predecessor[index]]))
            if t is None:
                return  # its lane takes the device's reloads in order
            self.deferred[device].remove(index)
            self.place(device, index, t)

    def no_room(self, device: int, index: int) -> NotApplicableError:
        return NotApplicableError(f"{self.name}: {self.table.op(index)} finds no room within device {device}'s "
                                  f"memory limit {self.problem.memory_caps[device]:g} in this order")

    def start_times(self) -> list[list[float]]:
        """Per device, its ops' start times; NotApplicableError when some op was never placed."""
        for device, order in enumerate(self.indices):
            if self.position[device] < len(order):
                raise NotApplicableError(f"{self.name}: device {device} waits forever at "
                                         f"{self.table.op(order[self.position[device]])}")
            if self.deferred[device]:
                raise self.no_room(device, self.deferred[device][0])
        return [[self.start[index] for index in order] for order in self.indices]


def _room_from(events: list[tuple[float, bool, float]], earliest: float, amount: float, cap: float) -> float | None:
    """The first time from `earliest` on at which `amount` more memory keeps the level within
    `cap` from then on, given the device's `events` (time, allocates, change) in order (a free
    first at a moment), or None when there is none. Only a free can make room, so only `earliest`
    and the frees after it are tried; one pass over the events (prefix levels, suffix maxima)."""
    if not events:
        return earliest if amount <= cap else None
    times = [time for time, _, _ in events]
    level = np.cumsum([change for _, _, change in events])
    highest_after = np.maximum.accumulate(level[::-1])[::-1]  # [k]: the highest level from event k on
    moments = [earliest, *sorted({time for time, allocates, _ in events if not allocates and time > earliest})]
    for moment in moments:
        settled = bisect.bisect_right(times, moment)  # the events up to and at the moment
        now = level[settled - 1] if settled else 0.0
        later = highest_after[settled] if settled < len(events) else now
        if max(now, later) + amount <= cap:
            return moment
    return None
