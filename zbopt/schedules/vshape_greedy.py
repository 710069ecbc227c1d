"""ZB-V as its authors generate it: a cost-aware greedy over the V placement.

"Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024), section 6, describes ZB-V by a figure;
the authors' repository (sail-sg/zero-bubble-pipeline-parallelism, `zerobubble/scheduler/zbv.py`)
builds it with a greedy that times every op as it places it, so unequal F, B, W shift the W's.
This is zbopt's own account of it, in zbopt's terms (device d's chunk 0 is stage d, chunk 1 stage
2p-1-d; a forward runs chunk 0 down the devices and chunk 1 back up, a backward the other way):

- warm-up: every device one chunk-0 F; then, from the last device up, as many further chunk-0 F's
  (on that device and all above it) as arrive before the device's first chunk-1 F can start and
  leave room for 2d+2 more activations; then F's in alternating chunks, sweeping up from the last
  device, until each device has run as many F's as the one above it;
- steady, 2m rounds: each device one B (its chunk-0 B where that B's input is ready, the last
  device first, then the chunk-1 B's from device 0 down), then one F; before each, pending W's
  fill the wait for the op's input, and one more W runs when the wait would exceed the device's
  share of the worst device's idle (always before a chunk-0 B; before a chunk-1 B and before an F
  only in the variants that fill there); a W also runs whenever the next op would not fit in memory;
- cool-down: the W's left.

Each of the four fill variants is rerun with the previous run's idle per device as an allowance
while that shortens the worst device's idle; zbopt keeps the shortest rebalanced run by simulated
makespan. Costs, latency and memory are each op's own (the authors' code takes one F, B, W for all
stages). Where their code would stop on an op whose input is not placed yet or that does not fit
(unequal costs or memory per stage, small m), zbopt passes that device by for the round, and its
warm-up leaves room for the chunk-1 F (on equal costs, p <= 6, m <= 3p + 1, it never had to)."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence

from zbopt.core import interrupt
from zbopt.core.errors import NotApplicableError
from zbopt.core.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, WEIGHT
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import simulate
from zbopt.core.simulation.ends import held_throughout
from zbopt.core.tolerance import memory_ceiling
from zbopt.schedules.common import block_memory, chunk_activations, passes_to_schedule, require_v_shape
from zbopt.schedules.registry import register
from zbopt.schedules.slot_model import Pass, v_half_block, v_half_peak
from zbopt.schedules.vshape_reorder import reordered_passes

__all__ = ["greedy_candidates", "v_half", "v_zb", "zero_bubble_v", "zero_bubble_v_auto"]

_LANES = ((FORWARD, 0), (FORWARD, 1), (BACKWARD, 1), (BACKWARD, 0), (WEIGHT, 1), (WEIGHT, 0))
# the pass on a device before each lane's pass of the same microbatch (a W follows its own B)
_LANE_BEFORE = {lane: (BACKWARD, lane[1]) if lane[0] == WEIGHT else (_LANES[index - 1] if index else None)
                for index, lane in enumerate(_LANES)}


class _LaneTables:
    """Each lane's cost and memory change per device, looked up once per problem rather than per
    pass (~10^6 passes at p = 32, m = 256): keys (kind, device, chunk); memory per microbatch where
    they differ (each takes its own room). A fused backward costs BW in B's lane, its W nothing."""

    def __init__(self, problem: Problem):
        self.costs: dict[tuple[str, int, int], float] = {}
        self.deltas: dict[tuple[str, int, int], tuple[float, ...]] = {}
        microbatches = [None] if problem.microbatches_equal else range(problem.num_microbatches)
        for device, stages in enumerate(problem.stages_of_device):
            for chunk, stage in enumerate(stages):
                for kind in (FORWARD, BACKWARD, WEIGHT):
                    own = kind if problem.split_backward else {BACKWARD: FUSED_BACKWARD, WEIGHT: None}.get(kind, kind)
                    self.costs[kind, device, chunk] = 0.0 if own is None else problem.cost(own, stage)
                    self.deltas[kind, device, chunk] = tuple(0.0 if own is None else problem.memory_delta(
                        own, stage, microbatch=microbatch) for microbatch in microbatches)


@functools.lru_cache(maxsize=8)
def _lane_tables(problem: Problem) -> _LaneTables:
    return _LaneTables(problem)


class _Stuck(Exception):
    """The greedy reached an op it cannot place (its input not placed yet, or no room in memory)."""


class _GreedyRun:
    """One run of the greedy: per device, the passes placed so far with their times and memory."""

    def __init__(self, problem: Problem, caps: Sequence[float], fill_forward: bool, fill_backward: bool,
                 allowance: Sequence[float] | None):
        p = problem.num_devices
        self.problem, self.caps, self.allowance = problem, caps, allowance
        self.tables = _lane_tables(problem)
        self.fill_forward, self.fill_backward = fill_forward, fill_backward
        self.done = [dict.fromkeys(_LANES, 0) for _ in range(p)]
        self.ends: dict[tuple[str, int, int, int], float] = {}  # (kind, device, chunk, microbatch) -> end
        self.clock, self.held, self.idle = [0.0] * p, list(held_throughout(problem)), [0.0] * p
        self.pending: list[deque[int]] = [deque() for _ in range(p)]  # chunks whose W is due, oldest first
        self.passes: list[list[Pass]] = [[] for _ in range(p)]

    # ------------------------------------------------------------------------------ placing one op

    def _cost(self, kind: str, device: int, chunk: int) -> float:
        return self.tables.costs[kind, device, chunk]

    def _memory(self, kind: str, device: int, chunk: int) -> float:
        """The memory change of the lane's next pass (its microbatch's own)."""
        row = self.tables.deltas[kind, device, chunk]
        return row[0] if len(row) == 1 else row[min(self.done[device][kind, chunk], len(row) - 1)]

    def _input(self, kind: str, device: int, chunk: int, microbatch: int) -> tuple | None:
        """The op on another device whose output this pass waits for (F0, B1 from the device above,
        F1, B0 from the device below), or None when its input is made on this device."""
        above = (kind == FORWARD) == (chunk == 0)
        neighbour = device - 1 if above else device + 1
        if kind == WEIGHT or not 0 <= neighbour < self.problem.num_devices:
            return None
        return kind, neighbour, chunk, microbatch

    @staticmethod
    def _local_input(kind: str, chunk: int, microbatch: int) -> tuple[str, int, int] | None:
        """The pass on this device that must come first (the one before it on the microbatch's lane)."""
        before = _LANE_BEFORE[kind, chunk]
        return None if before is None else (*before, microbatch)

    def placed(self, kind: str, device: int, chunk: int, microbatch: int) -> bool:
        return (kind, device, chunk, microbatch) in self.ends

    def ready(self, device: int, kind: str, chunk: int) -> bool:
        """Whether the lane has a microbatch left whose inputs are placed. (The authors' sweeps
        assume it; with unequal costs per stage a device above may not have run that F yet, and
        zbopt's sweep then passes the device by.)"""
        microbatch = self.done[device][kind, chunk]
        local = self._local_input(kind, chunk, microbatch)
        source = self._input(kind, device, chunk, microbatch)
        return (microbatch < self.problem.num_microbatches and (not local or self.placed(local[0], device, *local[1:]))
                and (not source or source in self.ends))

    def put(self, device: int, kind: str, chunk: int) -> None:
        """Run the lane's next microbatch on `device` as early as its input and the device allow."""
        microbatch = self.done[device][kind, chunk]
        source = self._input(kind, device, chunk, microbatch)
        change = self._memory(kind, device, chunk)
        if not self.ready(device, kind, chunk) or not self.fits(device, kind, chunk):
            raise _Stuck
        start = self.clock[device]
        if source:
            start = max(start, self.ends[source] + self.problem.p2p_time)
        if self.done[device][FORWARD, 0]:
            self.idle[device] += start - self.clock[device]
        self.clock[device] = self.ends[kind, device, chunk, microbatch] = start + self._cost(kind, device, chunk)
        self.held[device] += change
        self.passes[device].append((kind, chunk, microbatch))
        self.done[device][kind, chunk] += 1
        if kind == BACKWARD and self.problem.split_backward:
            self.pending[device].append(chunk)

    def put_weight(self, device: int) -> None:
        if not self.pending[device]:
            raise _Stuck
        self.put(device, WEIGHT, self.pending[device].popleft())

    def fits(self, device: int, kind: str, chunk: int) -> bool:
        return self.held[device] + self._memory(kind, device, chunk) <= memory_ceiling(self.caps[device])

    def make_room(self, device: int, kind: str, chunk: int) -> bool:
        """W's until the pass fits in the device's memory; whether it fits."""
        while not self.fits(device, kind, chunk):
            if not self.pending[device]:
                return False
            self.put_weight(device)
        return True

    def slack(self, device: int) -> float:
        """How much longer the device may idle: up to the worst device's idle so far, or the
        allowance of the run before (a device that idled less there may idle more now)."""
        worst = max(self.idle)
        if self.allowance is not None:
            worst = max(worst, max(self.allowance) - self.allowance[device])
        return worst - self.idle[device]

    def fill(self, device: int, kind: str, chunk: int, one_more: bool) -> None:
        """Before the pass: W's while one ends before its input arrives; then one more W if the
        wait would exceed the device's slack and `one_more`."""
        source = self._input(kind, device, chunk, self.done[device][kind, chunk])
        if source is None or source not in self.ends:
            return
        arrival = self.ends[source] + self.problem.p2p_time
        pending = self.pending[device]
        while pending and arrival >= self.clock[device] + self._cost(WEIGHT, device, pending[0]):
            self.put_weight(device)
        if pending and one_more and arrival - self.clock[device] > self.slack(device):
            self.put_weight(device)

    # ------------------------------------------------------------------------------------- phases

    def forwards(self, device: int) -> int:
        return self.done[device][FORWARD, 0] + self.done[device][FORWARD, 1]

    def backwards(self) -> int:
        return sum(done[BACKWARD, 0] + done[BACKWARD, 1] for done in self.done)

    def warm_up(self) -> None:
        """Chunk-0 F's while they arrive before the device's first chunk-1 F could start and leave
        room for 2d+2 activations; then F's in alternating chunks, swept up from the last device,
        until every device has run as many F's as the device above it."""
        p, m = self.problem.num_devices, self.problem.num_microbatches
        for device in range(p):
            self.put(device, FORWARD, 0)
        self.put(p - 1, FORWARD, 1)
        for device in reversed(range(p - 1)):
            turn = self.ends[FORWARD, device + 1, 1, 0] + self.problem.p2p_time
            room = (2 * device + 2) * max(self._memory(FORWARD, device, chunk) for chunk in (0, 1))
            while (self.held[device] + room <= memory_ceiling(self.caps[device]) and self.done[device][FORWARD, 0] < m
                   and self.clock[device] + self._cost(FORWARD, device, 0) <= turn
                   and all(self._room_for_both(upper) for upper in range(device))):
                for upper in range(device + 1):
                    self.put(upper, FORWARD, 0)
            self.put(device, FORWARD, 1)
        chunk = 0
        for device in range(1, p):
            idle_sweeps = 0
            while (self.forwards(device) < self.forwards(device - 1)
                   or self.done[device][FORWARD, 1] <= self.done[device - 1][FORWARD, 1] < m):
                before = sum(map(self.forwards, range(p)))
                for lower in range(p - 1, device - 1, -1):
                    if self.ready(lower, FORWARD, chunk) and self.fits(lower, FORWARD, chunk):
                        self.put(lower, FORWARD, chunk)
                idle_sweeps = 0 if sum(map(self.forwards, range(p))) > before else idle_sweeps + 1
                chunk = 1 - chunk
                if idle_sweeps == 2:  # no F can start: the steady phase takes over
                    break

    def _room_for_both(self, device: int) -> bool:
        """Room for one more chunk-0 F and the chunk-1 F still to come in the warm-up (the authors'
        count assumes equal chunk memory: a larger first stage's chunk-0 F's could fill it)."""
        both = self._memory(FORWARD, device, 0) + self._memory(FORWARD, device, 1)
        return self.held[device] + both <= memory_ceiling(self.caps[device])

    def backward_chunk(self, device: int) -> int:
        """Chunk 0's B once its input from the device below is there (the last device makes its
        own), else chunk 1's: keeps each device's two B lanes about a microbatch apart."""
        done = self.done[device]
        if done[BACKWARD, 0] >= done[BACKWARD, 1]:
            return 1
        if (device == self.problem.num_devices - 1 or done[BACKWARD, 1] >= self.problem.num_microbatches
                or self.placed(BACKWARD, device + 1, 0, done[BACKWARD, 0])):
            return 0
        return 1

    def forward_chunk(self, device: int) -> int | None:
        """Chunk 1's F once its input is there, else chunk 0's if its input is; None if neither."""
        done, m = self.done[device], self.problem.num_microbatches
        if done[FORWARD, 1] >= m:
            return None
        if done[FORWARD, 1] >= done[FORWARD, 0]:
            return 0 if self.ready(device, FORWARD, 0) else None
        if device == self.problem.num_devices - 1 or self.placed(FORWARD, device + 1, 1, done[FORWARD, 1]):
            return 1
        if done[FORWARD, 0] < m and (device == 0 or self.placed(FORWARD, device - 1, 0, done[FORWARD, 0])):
            return 0
        return None

    def steady_round(self) -> None:
        """Each device one B (chunk-0 B's from the last device up, then chunk-1 B's from device 0
        down), then one F, W's filling the waits before them and making room in memory."""
        p = self.problem.num_devices
        chunks = [self.backward_chunk(device) for device in range(p)]
        for device in range(p):
            self.make_room(device, BACKWARD, chunks[device])
        turns = [(device, 0) for device in reversed(range(p)) if chunks[device] == 0]
        turns += [(device, 1) for device in range(p) if chunks[device] == 1]
        for device, chunk in turns:
            if self.ready(device, BACKWARD, chunk):  # always, but where an input is late (see `ready`)
                self.fill(device, BACKWARD, chunk, chunk == 0 or self.fill_backward)
                self.put(device, BACKWARD, chunk)
        for device in range(p):
            chunk = self.forward_chunk(device)
            if chunk is not None and self.make_room(device, FORWARD, chunk):  # else it waits for a B
                self.fill(device, FORWARD, chunk, self.fill_forward)
                self.put(device, FORWARD, chunk)

    def run(self) -> _GreedyRun:
        self.warm_up()
        backwards = 2 * self.problem.num_microbatches * self.problem.num_devices
        while self.backwards() < backwards:  # 2m rounds, unless an input is late (see `ready`)
            interrupt.check()
            placed = sum(map(len, self.passes))
            self.steady_round()
            if sum(map(len, self.passes)) == placed:
                raise _Stuck
        for device in range(self.problem.num_devices):
            while self.pending[device]:
                self.put_weight(device)
        return self


def _rebalanced(problem: Problem, caps: Sequence[float], fill_forward: bool, fill_backward: bool) -> _GreedyRun:
    """One fill variant, rerun with each run's idle per device as the next run's allowance while
    the worst device's idle shrinks; the run with the least worst idle (the authors' rebalancing)."""
    best = _GreedyRun(problem, caps, fill_forward, fill_backward, None).run()
    while True:
        try:
            again = _GreedyRun(problem, caps, fill_forward, fill_backward, best.idle).run()
        except _Stuck:
            return best
        if not max(again.idle) < max(best.idle):
            return best
        best = again


def greedy_candidates(problem: Problem, caps: Sequence[float]) -> list[tuple[list[list[Pass]], float]]:
    """Per fill variant (fill before chunk-1 B's, before F's: both, B only, F only, neither, the
    authors' order), the rebalanced run's passes per device and its worst device's idle (the
    authors' own measure, by which their code picks); variants that get stuck are left out."""
    candidates = []
    for fill_backward in (True, False):
        for fill_forward in (True, False):
            try:
                run = _rebalanced(problem, caps, fill_forward, fill_backward)
            except _Stuck:
                continue
            candidates.append((run.passes, max(run.idle)))
    return candidates


# ------------------------------------------------------------------------------------ registered


def _one_f_one_b_memory(problem: Problem) -> list[float]:
    """ZB-V's memory target, 1F1B's: p full stages per device (2p chunk activations), or all m."""
    count = min(problem.num_devices, problem.num_microbatches)
    return [count * sum(chunk_activations(problem, device)) for device in range(problem.num_devices)]


def _shortest(problem: Problem, caps: Sequence[float], name: str) -> Schedule:
    """The greedy's variants within `caps`, the shortest by simulated makespan (the first of
    equals, in the authors' order of variants)."""
    fitting = []  # (makespan, place, schedule) of each variant within the caps
    for passes, _ in greedy_candidates(problem, caps):
        schedule = passes_to_schedule(problem, passes)
        result = simulate(problem, schedule)
        if all(peak <= memory_ceiling(cap) for peak, cap in zip(result.peak_memory, caps, strict=True)):
            fitting.append((result.makespan, len(fitting), schedule))
    if not fitting:
        raise NotApplicableError(f"{name} needs more memory: every variant of the greedy is stuck within "
                                 f"{[round(cap, 6) for cap in caps]}")
    return min(fitting)[2]


@register("zb-v", "ZB-V (Qi et al., ICLR 2024, sec. 6), the authors' cost-aware greedy: 1F1B's peak memory, "
          "zero bubble when F = B = W", _one_f_one_b_memory)
def zero_bubble_v(problem: Problem) -> Schedule:
    """ZB-V as the authors' repository builds it (zbv.py, cited in the module docstring): the
    greedy's four fill variants, each rebalanced, within 1F1B's memory (p full stages per device,
    2p chunk activations: the authors' default); the shortest by simulated makespan. With F = B = W
    and no latency it has no bubble (m >= 2p-1). Needs placement v and v = 2."""
    require_v_shape(problem, "zb-v")
    return _one_f_one_b_greedy(problem)


@functools.lru_cache(maxsize=4)
def _one_f_one_b_greedy(problem: Problem) -> Schedule:
    """The greedy within 1F1B's memory (and FSDP's gathered weights and gradients, held from the start), once per
    problem: `zb-v` and `v-zb` are the same orders, and at p = 32, m = 512 it takes seconds."""
    caps = [problem.num_devices * sum(chunk_activations(problem, d)) + g
            for d, g in enumerate(held_throughout(problem))]
    return _shortest(problem, caps, "zb-v")


@register("v-half", "V-Half (Qi et al., NeurIPS 2024), the authors' reordering of the V-shape block: about 1/2 of "
          "1F1B's activation memory", block_memory(v_half_peak))
def v_half(problem: Problem) -> Schedule:
    """V-Half, "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024), as the
    authors' repository runs it (zbv_greedy.py, mode 'half'; `vshape_reorder`): the block
      chunk-0 F at 2d, chunk-1 F at 3p-2-d, chunk-1 B at 3p-1+g+2d, chunk-0 B at 6p-2+g-d,
      g = 3 if p is even else 0,
    repeated every 6 slots; its memory is the repeated block's own peak, 2·floor((p+2)/2) chunk
    activations (about half of 1F1B's), which the reordering keeps. The order does not depend on
    the costs. Needs placement v and v = 2; a fused backward runs it with BW in B's place."""
    require_v_shape(problem, "v-half")
    return passes_to_schedule(problem, reordered_passes(v_half_block(problem.num_devices), problem.num_microbatches))


@register("v-zb", "V-ZB (Qi et al., NeurIPS 2024): 1F1B's memory and zero bubble; the authors run it as ZB-V",
          _one_f_one_b_memory)
def v_zb(problem: Problem) -> Schedule:
    """V-ZB, "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024): the V-shape
    building block with 1F1B's memory (2p chunk activations) and no bubble when F = B = W. The
    authors' repository runs this memory setting ('zb') with the ZB-V greedy, so v-zb returns
    zb-v's orders (with F = B = W its stable phase is the V-ZB block). Needs placement v and v = 2."""
    require_v_shape(problem, "v-zb")
    return zero_bubble_v(problem)


@register("zb-v-auto", "the ZB-V greedy (Qi et al., ICLR 2024) under the problem's memory limit (option memory_limit)",
          lambda problem: list(problem.memory_caps))
def zero_bubble_v_auto(problem: Problem, *, memory_limit: float | Sequence[float] | None = None) -> Schedule:
    """The ZB-V greedy with the problem's memory limit (or the option's, a number or one per
    device) as its target instead of 1F1B's: the warm start of a solve under that limit. Without
    either it runs unlimited. Not applicable where every variant of the greedy gets stuck (it
    needs room for a device's warm-up). Needs placement v and v = 2."""
    require_v_shape(problem, "zb-v-auto")
    caps = problem.memory_caps if memory_limit is None else problem.replace(memory_limit=memory_limit).memory_limit
    return _shortest(problem, caps, "zb-v-auto")
