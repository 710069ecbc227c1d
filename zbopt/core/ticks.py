"""Integer ticks for CP-SAT: the problem's float costs as whole numbers, and how much that rounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from zbopt.core.problem import Problem
from zbopt.core.problem.microbatches import EQUAL_MICROBATCHES, TABLE_KEYS
from zbopt.core.tolerance import RELATIVE_TOLERANCE, memory_ceiling

__all__ = ["LIFETIMES_PER_ACTIVATION", "MAX_TICKS_PER_OP", "TIME_KEYS", "TickScale", "ceil_ticks", "cost_values",
           "gradients_wait", "memory_capacity", "memory_rounding", "memory_scale", "scaled_costs", "tick_problem",
           "tick_scale", "waits_matter", "whole_at"]

MAX_TICKS_PER_OP = 100_000  # the finest resolution a solver model uses for the longest op
WHOLE_EXPONENTS = 6  # the powers of ten tried to make memory amounts whole (1 to 1e6)
LIFETIMES_PER_ACTIVATION = 4  # the parts B and W free, a checkpoint, a recomputed or reloaded part


@dataclass(frozen=True)
class TickScale:
    """Times in the problem's units times `ticks_per_unit`, rounded (up where recomputation or
    offload matter, `tick_problem`), are the solvers' integer ticks. `resolution` is one tick in
    the problem's units; a rounded duration is off by at most half a tick (one, rounded up), so a
    solver's objective is off by at most `error_bound`."""

    ticks_per_unit: int
    exact: bool
    error_bound: float

    @property
    def resolution(self) -> float:
        return 1.0 / self.ticks_per_unit

    def ticks(self, value: float) -> int:
        return round(value * self.ticks_per_unit)

    def units(self, ticks: float) -> float:
        return ticks / self.ticks_per_unit


def whole_at(values, scale: int) -> bool:
    """Whether every value times `scale` is a whole number (up to float rounding)."""
    return all(abs(v * scale - round(v * scale)) < 1e-9 * max(1.0, v * scale) for v in values)


def tick_scale(problem: Problem) -> TickScale:
    """The smallest power of ten that makes every cost and the latency whole ticks, capped so the
    longest op stays within MAX_TICKS_PER_OP ticks (beyond that, costs are rounded)."""
    values = [*cost_values(problem), problem.p2p_time]
    longest = max(values)
    scale = 1
    while True:
        if whole_at(values, scale):
            return TickScale(scale, True, 0.0)
        if scale * 10 * longest > MAX_TICKS_PER_OP:
            break
        scale *= 10
    # rounding: every op and latency on a chain is off by <= half a tick (recomputes and copies are ops
    # too), or by < one tick where mechanisms round up (`tick_problem`)
    copies = int(problem.recomputation is not None) + 2 * int(problem.offload is not None)  # R; O and L
    ops = problem.num_ops + problem.num_activations * copies + problem.num_stages * problem.iterations * \
        problem.allow_reshard  # a G per stage and iteration
    chain = 2 * ops / problem.num_devices + 2 * problem.num_stages
    if problem.iteration_ends is not None:  # a device's unshards and reductions, then its step
        chain += 2 * problem.chunks_per_device + 1
    per_op = 1.0 if waits_matter(problem) else 0.5
    return TickScale(scale, False, per_op * chain / scale)


def _memory_amounts(problem: Problem) -> list[float]:
    """Every memory amount and limit the problem has, each microbatch's where they differ."""
    rows = problem.per_microbatch or {}
    checkpoints = problem.recomputation.checkpoint_memory if problem.recomputation else ()
    ends = problem.iteration_ends
    fsdp = (*ends.unshard_memory, *ends.gradient_memory) if ends else ()
    amounts = [*problem.activation_memory, *(problem.weight_memory or ()), *checkpoints, *fsdp,
               *(problem.memory_limit or ())]
    return amounts + [value for key in ("activation_memory", "weight_memory", "checkpoint_memory")
                      for row in rows.get(key, ()) for value in row]


def memory_rounding(problem: Problem, unit: int):
    """How a model turns an amount in `unit`s (`memory_scale`, which the caller has) into a whole
    one: exactly where the unit makes every amount whole, else up (the model then holds at least
    what the simulator counts, so an answer within its capacity is within the limit; the unit is
    fine enough that this refuses no schedule the simulator accepts)."""
    if unit <= 10**WHOLE_EXPONENTS and whole_at(_memory_amounts(problem), unit):  # relative: at a fine unit
        return round                                                              # all looks whole
    return lambda scaled: math.ceil(scaled - 1e-6)


def memory_scale(problem: Problem) -> int:
    """A power of ten making every memory amount whole (up to 1e6); else one fine enough that
    rounding each amount up (`memory_rounding`) adds less than the simulator's tolerance
    (`memory_capacity`), however many lifetimes a device holds at once: the model then accepts
    exactly the schedules the simulator does, one at the limit included. No larger than keeps a
    device's whole memory an exact integer (2^53) in these units (beyond, amounts are rounded up,
    and a schedule at the limit may be refused)."""
    amounts = _memory_amounts(problem)
    activations = problem.total_microbatches * problem.chunks_per_device
    most = max(amounts) * activations
    units = [10**exponent for exponent in range(16) if 10**exponent * most <= 2**53] or [1]
    whole = next((unit for unit in units[:WHOLE_EXPONENTS + 1] if whole_at(amounts, unit)), None)
    if whole is not None:
        return whole
    # each lifetime rounds up by less than two units with float noise; a device holds at most
    # LIFETIMES_PER_ACTIVATION per activation on it
    needed = (2 * LIFETIMES_PER_ACTIVATION * activations + 1) / (RELATIVE_TOLERANCE * max(1.0, min(
        problem.memory_limit or (1.0,))))
    return next((unit for unit in units if unit >= needed), units[-1])


def memory_capacity(limit: float, unit: int) -> int:
    """A device's `limit` in `memory_scale` units: the simulator's ceiling (`memory_ceiling`),
    rounded down, so the model holds no more than the simulator allows."""
    return math.floor(memory_ceiling(limit) * unit)


def ceil_ticks(value: float, scale: TickScale) -> int:
    """A bound in problem units as whole ticks, rounded up only when costs are exact."""
    ticks = value * scale.ticks_per_unit
    return math.ceil(ticks - 1e-6) if scale.exact else math.floor(ticks)


def tick_problem(problem: Problem, scale: TickScale) -> Problem:
    """The problem with every cost and the latency in whole ticks (at least one per op, and per
    latency when there is one: a latency rounded to nothing would let an answer break it).

    Where waits matter (`waits_matter`), rounded up: an answer may wait for memory (a forward
    until an offload or a reduction has freed room, a G until its stage's activations have gone),
    which only its times say, and the model's times stay valid for the real costs only if no op
    really ends later than in the model."""
    whole = (lambda ticks: math.ceil(ticks - 1e-9)) if waits_matter(problem) else round
    return scaled_costs(problem, lambda value: max(1, whole(value * scale.ticks_per_unit)))


def waits_matter(problem: Problem) -> bool:
    """Whether an answer's times, not its orders alone, keep it within memory: where waiting can
    lower a peak under a limit (recomputation, offload, re-gathers, `gradients_wait`). A model's
    ticks then round every cost up (`tick_problem`), and its answer keeps its own times."""
    return problem.mechanisms_matter or problem.reshard_matters or gradients_wait(problem)


def gradients_wait(problem: Problem) -> bool:
    """Gradients are held until their reduction (`gradient_memory`) under a memory limit: an op
    held back until a reduction has freed room may fit where no order timed as soon as possible does."""
    ends = problem.iteration_ends
    return problem.memory_limit is not None and ends is not None and any(ends.gradient_memory)


TIME_KEYS = tuple(key for key in TABLE_KEYS if key.endswith("_times"))  # the costs that may differ by microbatch
END_TIME_KEYS = ("grad_reduce_times", "optimizer_step_times", "unshard_times")  # the iteration's ends (0 stays 0)


def cost_values(problem: Problem) -> list[float]:
    """Every cost the problem has: per virtual stage, or per stage and microbatch where they differ
    (`Problem.per_microbatch`), the overlapped pairs', and the iteration's ends that take time."""
    rows = problem.per_microbatch
    if rows is None:
        values = [value for key in TIME_KEYS for value in getattr(problem, key) or ()]
    else:
        values = [value for key in TIME_KEYS for row in rows.get(key, ()) for value in row]
    ends = problem.iteration_ends
    end_times = () if ends is None else (*ends.reduce_times, *ends.step_times, *ends.unshard_times)
    return values + [cost for _, costs in (problem.pairs.costs if problem.pairs else ()) for cost in costs] + \
        [time for time in end_times if time > 0]  # an end not taken is no cost


def scaled_costs(problem: Problem, ticks) -> Problem:
    """The problem with every cost turned into `ticks(cost)` and the latency too (0 stays 0).
    Where microbatches differ, each microbatch's own costs, as rows per microbatch (the memory
    too, as rows of the activations with the kept parts following them: not scaled)."""

    def scaled(values):
        return None if values is None else [ticks(value) for value in values]

    latency = ticks(problem.p2p_time) if problem.p2p_time > 0 else 0
    ends = {key: None if getattr(problem, key) is None else [ticks(value) if value > 0 else 0
                                                             for value in getattr(problem, key)]
            for key in END_TIME_KEYS}
    if problem.per_microbatch is None:
        return problem.replace(**{key: scaled(getattr(problem, key)) for key in TIME_KEYS}, p2p_time=latency, **ends,
                               overlap_times=None if problem.pairs is None else
                               {kind: scaled(costs) for kind, costs in problem.pairs.costs})
    rows = problem.per_microbatch
    changes = {key: [scaled(row) for row in rows[key]] if key in rows else None for key in TIME_KEYS}
    changes["activation_memory"] = [list(row) for row in rows["activation_memory"]]
    for key in ("weight_memory", "checkpoint_memory"):  # following the activations' rows by their means
        if key in rows:
            changes[key] = [sum(row) / len(row) for row in rows[key]]
    return problem.replace(**changes, **EQUAL_MICROBATCHES, p2p_time=latency, **ends)
