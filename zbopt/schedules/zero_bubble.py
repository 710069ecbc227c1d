"""Zero Bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024), split backward, v = 1.

- `zb-h1`, `zb-h2`: the handcrafted schedules of section 3 (Figure 3). Both are 1F1B-shaped orders in
  which W runs a fixed number of microbatches after its B; ZB-H2 also runs more warm-up forwards.
- `zb-auto`: the automatic greedy of section 3.1 (its heuristic part), over its binary choices, each
  candidate timed by `zbopt.simulate`; `zb-1p` / `zb-2p` run it under a memory limit of p·M_B / 2p·M_B.

Memory: M_B is an activation_memory (one microbatch's activations on a stage), M_W a weight_memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from zbopt.core import interrupt
from zbopt.core.errors import NotApplicableError, ProblemError, ZboptError
from zbopt.core.kinds import BACKWARD, FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import simulate
from zbopt.core.simulation.ends import held_throughout
from zbopt.core.timeline import Timeline
from zbopt.core.tolerance import memory_ceiling
from zbopt.schedules.common import repeat_per_iteration
from zbopt.schedules.registry import register, require

__all__ = ["GreedyChoices", "zb_1p", "zb_2p", "zb_auto", "zb_h1", "zb_h2"]


def _require_split_single_chunk(problem: Problem, name: str) -> None:
    require(problem.split_backward, name, "a split backward (weight_times given)")
    require(problem.chunks_per_device == 1, name, "chunks_per_device = 1 (one stage per device)")


# ---------------------------------------------------------------------------------------------- handcrafted


def _lagged_weight_order(stage: int, m: int, warmup: int, lag: int) -> list[Op]:
    """One iteration on `stage`: `warmup` forwards; then for k = 0..m-1: B_k, W_(k-lag) when
    k >= lag, the next forward if any is left; then the last `lag` W's."""
    warmup = min(warmup, m)
    order = [Op(FORWARD, stage, j) for j in range(warmup)]
    for k in range(m):
        order.append(Op(BACKWARD, stage, k))
        if k >= lag:
            order.append(Op(WEIGHT, stage, k - lag))
        if warmup + k < m:
            order.append(Op(FORWARD, stage, warmup + k))
    order += [Op(WEIGHT, stage, j) for j in range(max(m - lag, 0), m)]
    return order


def _lagged_weight_memory(problem: Problem, warmup: int, lag: int, stage: int) -> float:
    """Peak memory of `_lagged_weight_order` on `stage`: at most `warmup` microbatches between their F
    and B, plus `lag` whose W is pending, each count at most m."""
    m = problem.num_microbatches
    return min(warmup, m) * problem.activation_memory[stage] + min(lag, m) * problem.weight_memory[stage]


def _zb_h1_memory(problem: Problem) -> list[float]:
    """Device s: p - s activations and s pending W's, at most p·M_B (1F1B's peak on device 0)."""
    p = problem.num_devices
    return [_lagged_weight_memory(problem, p - s, s, s) for s in range(p)]


def _zb_h2_memory(problem: Problem) -> list[float]:
    """Device s: 2(p - s) - 1 activations and 2s pending W's, at most (2p - 1)·M_B."""
    p = problem.num_devices
    return [_lagged_weight_memory(problem, 2 * (p - s) - 1, 2 * s, s) for s in range(p)]


@register("zb-h1", "ZB-H1 (Zero Bubble, Qi et al. 2024, Fig. 3): 1F1B with device s's W's delayed by s microbatches",
          _zb_h1_memory)
def zb_h1(problem: Problem) -> Schedule:
    """ZB-H1, the memory-efficient handcrafted schedule (Zero Bubble paper, section 3, Figure 3 top).

    Device s runs 1F1B's order (min(p - s, m) forwards, then B, W, F repeated) except that its W's
    start s microbatches late: W_k runs after B_(k+s), the last s W's at the end. The delayed W's
    fill the drain that 1F1B leaves idle, so with uniform costs F, B, W and no latency the longest
    device span is m(F+B+W) + (p-1)(F+B-W) (for m >= p and W <= F), against 1F1B's (p-1)(F+B+W)
    bubble. Device s holds at most (p - s)·M_B + s·M_W <= p·M_B, 1F1B's peak on device 0.
    Needs a split backward and v = 1.
    """
    _require_split_single_chunk(problem, "zb-h1")
    p, m = problem.num_devices, problem.num_microbatches
    return repeat_per_iteration(problem, [_lagged_weight_order(s, m, p - s, s) for s in range(p)])


@register("zb-h2", "ZB-H2 (Zero Bubble, Qi et al. 2024, Fig. 3): 2(p-s)-1 warm-up forwards, W's delayed by 2s",
          _zb_h2_memory)
def zb_h2(problem: Problem) -> Schedule:
    """ZB-H2, the zero-bubble handcrafted schedule (Zero Bubble paper, section 3, Figure 3 bottom).

    Device s runs min(2(p - s) - 1, m) warm-up forwards, enough to cover the wait for the first B,
    then B, W, F repeated with W_k after B_(k+2s), and its last 2s W's at the end: the W's left at
    the tail turn 1F1B's trapezoid into a parallelogram. With uniform costs and F = B = W the
    bubble is zero; in general the longest device span is m(F+B+W) + (p-1)(F+B+2c-2W) with latency
    c (for m >= 2p - 1, W <= F, 2W <= F+B+2c, W + 2c <= F+B). Device s holds at most
    (2(p - s) - 1)·M_B + 2s·M_W <= (2p - 1)·M_B. Needs a split backward and v = 1.
    """
    _require_split_single_chunk(problem, "zb-h2")
    p, m = problem.num_devices, problem.num_microbatches
    return repeat_per_iteration(problem, [_lagged_weight_order(s, m, 2 * (p - s) - 1, 2 * s) for s in range(p)])


# ---------------------------------------------------------------------------------------------- automatic


@dataclass(frozen=True)
class GreedyChoices:
    """The binary choices of the automatic greedy (the authors' code tries all eight).

    overfill_warmup : a warm-up forward may still start when it would end after the first B arrives
        (otherwise warm-up forwards must end by then).
    prioritize_backward : a device two or more forwards ahead of the next one skips its forward
        when the next B would arrive first (or soon enough that the wait is within the bubble budget).
    fill_gaps_eagerly : a W that does not fit in the wait for the next F or B is still run
        (otherwise only when the wait exceeds the device's bubble budget).
    """

    overfill_warmup: bool
    prioritize_backward: bool
    fill_gaps_eagerly: bool


@dataclass
class _Device:
    """The greedy's own bookkeeping for one device (= stage, v = 1): its idle time and how many ops
    of each kind it has placed. Times, order and memory held live in the shared `Timeline`."""

    idle: float = 0.0  # idle time since its first op
    placed: dict[str, int] = field(default_factory=lambda: {FORWARD: 0, BACKWARD: 0, WEIGHT: 0})

    @property
    def pending_weights(self) -> int:
        return self.placed[BACKWARD] - self.placed[WEIGHT]


class _AutoGreedy:
    """One run of the greedy for one iteration (microbatches 0..m-1), timing ops on a `Timeline` as
    it places them (an op starts when its device is free and its predecessor, plus latency, has ended)."""

    def __init__(self, problem: Problem, limits: Sequence[float], choices: GreedyChoices):
        self.problem, self.limits, self.choices = problem, limits, choices
        # FSDP's gradients from the start: it caps forwards only (counted from a first W: no gain seen)
        self.timeline = Timeline(problem.replace(iterations=1), gradients_throughout=True)
        self.devices = [_Device() for _ in range(problem.num_devices)]

    # -- placing ops
    def next_op(self, stage: int, kind: str) -> Op:
        return Op(kind, stage, self.devices[stage].placed[kind])

    def arrival(self, stage: int, kind: str) -> float:
        """When the next op of `kind` (F or B) on `stage` has its input: the upstream F or the
        downstream B end plus latency; 0 on the first stage (F)."""
        return self.timeline.ready(self.next_op(stage, kind))

    def free_at(self, stage: int) -> float:
        """The end of the device's last placed op."""
        return self.timeline.free[stage]

    def place(self, stage: int, kind: str) -> None:
        device, free = self.devices[stage], self.free_at(stage)
        start = self.timeline.append(self.next_op(stage, kind))
        if len(self.timeline.orders[stage]) > 1:
            device.idle += start - free
        device.placed[kind] += 1

    def fits_forward(self, stage: int, held: float, ahead: int = 0) -> bool:
        """Whether the forward `ahead` after the next one fits: each microbatch's own activations."""
        activation = self.problem.memory_delta(FORWARD, stage, microbatch=self.devices[stage].placed[FORWARD] + ahead)
        return held + activation <= memory_ceiling(self.limits[stage])

    def weight_frees(self, stage: int, ahead: int = 0) -> float:
        """What the pending W `ahead` after the next one frees (its microbatch's M_W)."""
        return -self.problem.memory_delta(WEIGHT, stage, microbatch=self.devices[stage].placed[WEIGHT] + ahead)

    def budget(self, stage: int) -> float:
        """Idle a device may still accept: the worst idle so far minus its own."""
        return max(device.idle for device in self.devices) - self.devices[stage].idle

    def fill_wait(self, stage: int, arrival: float) -> None:
        """Run pending W's in the wait before `arrival`: those that end by then, and one more that
        overruns it when eager or when the wait would exceed the bubble budget."""
        device, cost = self.devices[stage], self.problem.cost(WEIGHT, stage)
        while device.pending_weights and self.free_at(stage) + cost <= arrival:
            self.place(stage, WEIGHT)
        wait = arrival - self.free_at(stage)
        if device.pending_weights and wait > 0 and (self.choices.fill_gaps_eagerly or wait > self.budget(stage)):
            self.place(stage, WEIGHT)

    def make_room(self, stage: int) -> None:
        """Run pending W's until the next forward's activations fit in the memory limit."""
        device = self.devices[stage]
        while device.pending_weights and not self.fits_forward(stage, self.timeline.held[stage]):
            self.place(stage, WEIGHT)

    # -- phases
    def warmup(self) -> None:
        """F_0 everywhere; then, from the last stage back, as many extra forwards as fit (memory) in
        the wait for B_0, each device at least one forward ahead of the next; then B_0 upwards."""
        p, m, c = self.problem.num_devices, self.problem.num_microbatches, self.problem.p2p_time
        for stage in range(p):
            self.place(stage, FORWARD)
        extra = [0] * p
        backward_end = self.timeline.end(Op(FORWARD, p - 1, 0)) + self.problem.cost(BACKWARD, p - 1)
        for stage in range(p - 2, -1, -1):
            forward = self.problem.cost(FORWARD, stage)
            arrival = backward_end + c
            time, held = self.free_at(stage), self.timeline.held[stage]
            while 1 + extra[stage] < m and self.fits_forward(stage, held, extra[stage]):
                if time >= arrival or (not self.choices.overfill_warmup and time + forward > arrival):
                    break
                time += forward
                held += self.problem.memory_delta(FORWARD, stage, microbatch=1 + extra[stage])
                extra[stage] += 1
            backward_end = max(time, arrival) + self.problem.cost(BACKWARD, stage)
        for stage in range(1, p):
            ahead = extra[stage - 1] if 1 + extra[stage - 1] == m else extra[stage - 1] - 1
            extra[stage] = max(min(extra[stage], ahead), 0)
        for stage in range(p):
            for _ in range(extra[stage]):
                self.place(stage, FORWARD)
        for stage in range(p - 1, -1, -1):
            self.place(stage, BACKWARD)

    def skips_forward(self, stage: int) -> bool:
        """prioritize_backward: whether a device two forwards ahead of the next waits for its B."""
        device, following = self.devices[stage], self.devices[stage + 1]
        if device.placed[FORWARD] < following.placed[FORWARD] + 2:
            return False
        problem = self.problem
        backward_ready = (self.free_at(stage + 1) + problem.cost(FORWARD, stage + 1) + problem.cost(BACKWARD, stage + 1)
                          + problem.p2p_time)
        if self.free_at(stage) >= backward_ready:
            return True
        held, freed, work = self.timeline.held[stage], 0, problem.cost(FORWARD, stage)
        while freed < device.pending_weights and not self.fits_forward(stage, held):
            held -= self.weight_frees(stage, freed)
            freed += 1
            work += problem.cost(WEIGHT, stage)
        if self.free_at(stage) + work <= backward_ready:
            return False
        return backward_ready - self.free_at(stage) <= self.budget(stage)

    def steady_round(self) -> None:
        """One forward per device (a device runs one only if the next device does), then the next B
        on every device from the last stage back, W's filling the waits."""
        p, m = self.problem.num_devices, self.problem.num_microbatches
        runs_forward = [device.placed[FORWARD] < m for device in self.devices]
        if self.choices.prioritize_backward:
            for stage in range(p - 1):
                runs_forward[stage] = runs_forward[stage] and not self.skips_forward(stage)
        for stage in range(p - 2, -1, -1):
            runs_forward[stage] = runs_forward[stage] and runs_forward[stage + 1]
        for stage in range(p):
            if runs_forward[stage]:
                self.make_room(stage)
                if stage > 0:
                    self.fill_wait(stage, self.arrival(stage, FORWARD))
                self.place(stage, FORWARD)
        for stage in range(p - 1, -1, -1):
            device = self.devices[stage]
            if stage < p - 1:
                self.fill_wait(stage, self.arrival(stage, BACKWARD))
            if stage == 0 and device.placed[FORWARD] == m:
                while device.pending_weights:
                    self.place(stage, WEIGHT)
            self.place(stage, BACKWARD)

    def run(self) -> list[list[Op]]:
        self.warmup()
        for _ in range(1, self.problem.num_microbatches):
            interrupt.check()
            self.steady_round()
        for stage, device in enumerate(self.devices):
            while device.pending_weights:
                self.place(stage, WEIGHT)
        return self.timeline.orders


def _memory_limits(problem: Problem, memory_limit: float | Sequence[float] | None, name: str) -> tuple[float, ...]:
    """Per device, the limit the greedy keeps: the option (checked as a Problem checks its own
    memory_limit), else the problem's, else unlimited."""
    if memory_limit is None:
        return problem.memory_caps
    try:
        return problem.replace(memory_limit=memory_limit).memory_limit
    except ProblemError as error:
        raise ZboptError(f"{name} option {error}") from None


def _best_greedy_schedule(problem: Problem, limits: tuple[float, ...], name: str) -> Schedule:
    """Every combination of GreedyChoices, each timed by `simulate`; among those within `limits`,
    the one with the shortest longest device span (the paper's objective), then shortest makespan."""
    best, best_key = None, None
    for flags in itertools.product((False, True), repeat=3):
        orders = _AutoGreedy(problem, limits, GreedyChoices(*flags)).run()
        schedule = repeat_per_iteration(problem, orders)
        result = simulate(problem, schedule)
        if any(peak > memory_ceiling(limit) for peak, limit in zip(result.peak_memory, limits, strict=True)):
            continue
        key = (max(result.span), result.makespan)
        if best_key is None or key < best_key:
            best, best_key = schedule, key
    if best is None:  # a heuristic that cannot serve this limit: not applicable, as any other's precondition
        raise NotApplicableError(f"{name}: no greedy candidate fits the memory limit {list(limits)}")
    return best


def _auto_memory(problem: Problem) -> list[float]:
    """The problem's memory limit, else m microbatches' activations (the most any order holds)."""
    if problem.memory_limit is not None:
        return list(problem.memory_limit)
    return [problem.num_microbatches * problem.activation_memory[s] for s in range(problem.num_devices)]


def _scaled_limits(problem: Problem, microbatches: int) -> tuple[float, ...]:
    """`microbatches` · M_B per device, M_B the largest activation_memory of a stage (of any
    microbatch, where they differ), and FSDP's gathered parameters and gradients on top (the
    paper's limits count activations; `held_throughout`, as ZB-V's target); never above the
    problem's own limit."""
    rows = (problem.per_microbatch or {}).get("activation_memory")
    limit = microbatches * max(problem.activation_memory if rows is None else (max(row) for row in rows))
    return tuple(min(limit + fsdp, cap) for fsdp, cap in zip(held_throughout(problem), problem.memory_caps,
                                                             strict=True))


@register("zb-auto", "Zero Bubble automatic greedy (Qi et al. 2024, sec. 3.1) under the memory limit",
          _auto_memory)
def zb_auto(problem: Problem, *, memory_limit: float | Sequence[float] | None = None) -> Schedule:
    """The Zero Bubble paper's automatic scheduler, heuristic part (section 3.1; the authors'
    auto_schedule.py), driven by the problem's costs, latency and memory limit.

    Warm-up: F_0 on every device, then per device as many extra forwards as fit in memory and in the
    wait for the first B, each device at least one forward ahead of the next. Steady state, one
    microbatch per round: each device one forward (only if the next device runs one too), then B
    from the last device back; before each F or B, pending W's fill the wait for its input, and W's
    run whenever the next forward would not fit in memory. Last, each device flushes its W's.
    Every combination of the `GreedyChoices` is built and timed with `zbopt.simulate`; within the
    memory limit, the shortest longest device span wins (the paper's objective), then the makespan.

    Options: memory_limit (a number or one per device, in memory units) overrides the problem's;
    without either the greedy runs unlimited. Needs a split backward and v = 1.
    """
    _require_split_single_chunk(problem, "zb-auto")
    return _best_greedy_schedule(problem, _memory_limits(problem, memory_limit, "zb-auto"), "zb-auto")


@register("zb-1p", "ZB-1p (Qi et al. 2024): the automatic greedy with memory limit p·M_B (1F1B's)",
          lambda problem: list(_scaled_limits(problem, problem.num_devices)))
def zb_1p(problem: Problem) -> Schedule:
    """ZB-1p: `zb-auto` with memory limit p·M_B per device, 1F1B's peak (M_B = the largest
    activation_memory of a stage; the problem's own memory_limit, when lower, wins). Zero Bubble
    paper, section 3.1 and Table 5. Needs a split backward and v = 1."""
    _require_split_single_chunk(problem, "zb-1p")
    return _best_greedy_schedule(problem, _scaled_limits(problem, problem.num_devices), "zb-1p")


@register("zb-2p", "ZB-2p (Qi et al. 2024): the automatic greedy with memory limit 2p·M_B",
          lambda problem: list(_scaled_limits(problem, 2 * problem.num_devices)))
def zb_2p(problem: Problem) -> Schedule:
    """ZB-2p: `zb-auto` with memory limit 2p·M_B per device (M_B = the largest activation_memory of
    a stage; the problem's own memory_limit, when lower, wins). Zero Bubble paper, section 3.1 and
    Table 5. Needs a split backward and v = 1."""
    _require_split_single_chunk(problem, "zb-2p")
    return _best_greedy_schedule(problem, _scaled_limits(problem, 2 * problem.num_devices), "zb-2p")
