"""The optimal block: CP-SAT models of one period, T searched by bisection.

For one microbatch (a group of one), find the smallest interval T at which a block exists, then the
shortest block at that T: for large m that minimises (m - 1)·T + length, the makespan of the block
repeated for the problem's m before any squeeze. At a fixed T the model is linear:
  1. each op starts after its input (duration plus latency);
  2. no two ops of a device overlap when the block repeats every T: with o = q·T + r, r in [0, T),
     the intervals [r, r + d) and [r + T, r + T + d) of a device's ops do not overlap;
  3. the repeated block holds at most the memory limit on every device: an activation part held
     for L = n·T + rem is n copies at every moment plus one more during [r_F, r_F + rem) (mod T),
     so a cumulative over those remainders (again at r and r + T) gets the limit minus the n's.
A block at T gives one at any larger T' (keep each op's phase r and period count q: o' = q·T' + r;
phases keep their order and gaps, inputs only wait longer, no lifespan covers more periods), so
feasibility is monotone in T and bisection finds the least T,
proven when the T one tick below is proven infeasible. Times are integer ticks (`zbopt.core.ticks`);
when costs do not round to whole ticks the answer is stretched by the largest rounding ratio,
which keeps it valid. A block's T bounds block schedules only, never schedules in general: it is
reported as the best block, not as a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from zbopt.core import interrupt
from zbopt.core.dag import critical_path, device_work, earliest_finish, op_graph
from zbopt.core.errors import NotApplicableError, ZboptError
from zbopt.core.kinds import FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.ticks import memory_capacity, memory_scale, tick_problem, tick_scale, whole_at
from zbopt.core.timeline import Timeline
from zbopt.core.tolerance import memory_ceiling
from zbopt.solvers.blocks.model import Block, block_ops, group_table, input_of, lifespan_bound, steady_peak
from zbopt.solvers.blocks.published import PUBLISHED, published_block
from zbopt.solvers.cp_parts import solve_stoppable, timed_solver

__all__ = ["FINAL_SHARE", "PLACEMENT_SHARE", "PLACEMENT_STEP", "BlockSearch", "best_published_block",
           "block_objective", "block_refusal", "optimal_block", "published_rows"]

FINAL_SHARE = 0.2  # of the time limit, kept for the shortest block at the least T
PLACEMENT_SHARE = 0.1  # of the time limit, at most, for the modulo placements below the bisection's upper end
PLACEMENT_STEP = 0.005  # relative step between the periods tried by modulo placement


@dataclass(frozen=True)
class BlockSearch:
    """The best block found; "optimal" when its T is proven the least and its length the least at
    that T (among one-microbatch blocks on the tick grid); `least_interval`: no such block repeats
    faster; `start`: the published block the search started from."""

    block: Block
    status: str
    least_interval: float
    start: str

    def to_dict(self) -> dict:
        """The block, its lifespans' rule and exact steady peak per device, and how it was found."""
        return {"status": self.status, "least_interval": self.least_interval, "start": self.start,
                "block": self.block.to_dict(), "steady_peak": steady_peak(self.block),
                "lifespan_bound": lifespan_bound(self.block), "repeated_span": block_objective(self.block)}


def published_rows(problem: Problem) -> list[dict]:
    """Each published block at the problem's costs: T, length, steady peak, whether it fits the
    memory limit; or why it does not apply."""
    rows = []
    for name in PUBLISHED:
        try:
            block = published_block(name, problem)
        except NotApplicableError as reason:
            rows.append({"name": name, "not_applicable": str(reason)})
            continue
        peaks = steady_peak(block)
        rows.append({"name": name, "interval": block.interval, "length": block.length, "steady_peak": max(peaks),
                     "fits": _fits(problem, peaks)})
    return rows


def _fits(problem: Problem, peaks: list[float]) -> bool:
    return problem.memory_limit is None or all(
        peak <= memory_ceiling(limit) for peak, limit in zip(peaks, problem.memory_limit, strict=True))


def block_objective(block: Block) -> float:
    """(m - 1)·T + length: what the search minimises (the repeated span for the problem's m)."""
    return block.repeated_span(block.problem.num_microbatches)


def best_published_block(problem: Problem) -> Block | None:
    """The published block with the smallest objective that applies and fits the memory limit."""
    fitting = []
    for name in PUBLISHED:
        try:
            block = published_block(name, problem)
        except NotApplicableError:
            continue
        if _fits(problem, steady_peak(block)):
            fitting.append(block)
    return min(fitting, key=block_objective, default=None)


def optimal_block(problem: Problem, *, time_limit: float = 10.0, workers: int = 2, seed: int = 0) -> BlockSearch:
    """The block of one microbatch with the least interval T, then the least length, within the
    problem's memory limit (see the module doc), in at most `time_limit` seconds: bisection on T
    from the devices' work per microbatch up to the least of the best published block that fits,
    the first modulo placement that fits (`_Shape.first_placed`) and the serial block
    (`_Shape.serial`, which always exists). When that published block's (m - 1)·T + length is
    smaller than the block found (costs not whole ticks, a search cut short, or a small m), it is
    the answer instead, with status "feasible"."""
    _check_searchable(problem, time_limit)
    deadline = interrupt.now() + time_limit
    scale = tick_scale(problem)
    integral = tick_problem(problem, scale)
    start = best_published_block(problem)
    seed_block = None if start is None else _first_microbatch(start)
    shape = _Shape(integral, problem, memory_scale(problem))
    found = _blocks_to_start_from(shape, seed_block, scale, PLACEMENT_SHARE * time_limit)
    final_share = FINAL_SHARE * time_limit  # kept for the shortest block at the least T
    high, refuted = _bisect(shape, found, deadline - final_share, workers, seed)
    code, offsets = shape.solve(high, max(0.01, deadline - interrupt.now()), workers, seed,
                                hint=found.get(high), shortest=True)
    if offsets is None:
        offsets, code = found[high], cp_model.FEASIBLE
    proven = high - refuted <= 1 and code == cp_model.OPTIMAL
    stretch = _rounding_stretch(problem, integral, scale)
    to_units = stretch / scale.ticks_per_unit
    block = Block(problem, {op: offsets[op] * to_units for op in shape.ops}, high * to_units, 1, "optimal")
    exact = scale.exact and stretch == 1.0
    least = (refuted + 1) / scale.ticks_per_unit if exact else max(device_work(problem)) / problem.num_microbatches
    if seed_block is not None and block_objective(seed_block) < block_objective(block):  # e.g. costs not whole ticks
        return BlockSearch(seed_block, "feasible", least, start.name)
    return BlockSearch(block, "optimal" if proven and exact else "feasible", least,
                       start.name if start is not None else "none")


def block_refusal(problem: Problem) -> str | None:
    """Why the block search cannot take `problem` (what it does not model), or None."""
    for record, key, what in ((problem.recomputation, "allow_recompute", "recomputation"),
                              (problem.offload, "allow_offload", "offload")):
        if record is not None:
            return f"the block search keeps every activation: it does not model {what} ({key}); use zbopt solve"
    if problem.bidirectional:
        return ("the block search repeats one microbatch's block, and placement 'bidirectional' sends "
                "microbatches two ways; use zbopt solve")
    if problem.pairs is not None:
        return "the block search does not model overlapped pairs (overlap_times); use zbopt solve"
    if not problem.microbatches_equal:
        return ("the block search repeats one microbatch's block, and these microbatches differ "
                "(microbatch_tokens, rows per microbatch or sequence_slices); use zbopt solve")
    return None


def _check_searchable(problem: Problem, time_limit: float) -> None:
    """A ZboptError for what the block search does not model (`block_refusal`) or a time limit
    that is no number of seconds; NotApplicableError for more than one iteration."""
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ZboptError(f"time_limit = {time_limit!r}: must be a positive number of seconds")
    refusal = block_refusal(problem)
    if refusal is not None:
        raise ZboptError(refusal)
    if problem.iterations != 1:
        raise NotApplicableError(f"a block schedule needs iterations = 1 (got {problem.iterations})")


def _blocks_to_start_from(shape: _Shape, seed_block: Block | None, scale, placing_time: float
                          ) -> dict[int, dict[Op, int]]:
    """Period -> offsets of the blocks known before the bisection: the serial one (always there),
    the first modulo placement that fits (searched for `placing_time` seconds at most) and the published
    seed when it lies on the tick grid (rounding one off it could break the block)."""
    period, serial = shape.serial()
    found = {period: serial}
    placed = shape.first_placed(period, interrupt.now() + placing_time)
    if placed is not None:
        found[placed[0]] = placed[1]
    if seed_block is not None and scale.exact and whole_at([seed_block.period, *seed_block.offsets.values()],
                                                           scale.ticks_per_unit):
        found[scale.ticks(seed_block.period)] = {op: scale.ticks(offset) for op, offset in seed_block.offsets.items()}
    return found


def _bisect(shape: _Shape, found: dict[int, dict[Op, int]], stop: float, workers: int, seed: int) -> tuple[int, int]:
    """(high, refuted): the least period with a block found by bisection from the least of `found`
    down to the devices' work, until `stop`, and the largest period proven to have none (each
    block found goes into `found`, the hint for the next period)."""
    high = min(found)
    low = refuted = shape.least_period - 1  # no block at `low`; proven none at `refuted`
    while high - low > 1 and interrupt.now() < stop:
        middle = (low + high) // 2
        remaining = (stop - interrupt.now()) / max(1, math.ceil(math.log2(high - low)))
        code, offsets = shape.solve(middle, remaining, workers, seed, hint=found.get(high), shortest=False)
        if offsets is not None:
            found[middle], high = offsets, middle
        else:
            low = middle
            if code == cp_model.INFEASIBLE:
                refuted = middle
    return high, refuted


def _rounding_stretch(problem: Problem, integral: Problem, scale) -> float:
    """The largest ratio of a cost (or the latency) to its rounded tick count, at least 1: the tick
    block stretched by it stays valid at the problem's own costs."""
    return max([problem.cost(kind, stage) * scale.ticks_per_unit / integral.cost(kind, stage)
                for kind in problem.kinds for stage in range(problem.num_stages)]
               + [problem.p2p_time * scale.ticks_per_unit / max(1, integral.p2p_time), 1.0])


def _free_moment(taken: list[tuple[int, int]], moment: int, duration: int, period: int) -> int | None:
    """The first moment from `moment` whose phase [r, r + duration) misses every taken (phase,
    length) and its copies one period away; None when none within a period (no gap fits)."""
    origin = moment
    while moment - origin < period:
        phase = moment % period
        clashes = [shifted + length for start, length in taken for shifted in (start - period, start, start + period)
                   if phase < shifted + length and shifted < phase + duration]
        if not clashes:
            return moment
        moment += clashes[0] - phase  # past the first clash
    return None


def _first_microbatch(block: Block) -> Block:
    """The first microbatch of a group block, alone, repeated every period (still valid: its ops
    are a subset of the group's), its first forward at 0 as the search pins it."""
    first = {op: t for op, t in block.offsets.items() if op.microbatch == 0}
    origin = first[Op(FORWARD, 0, 0)]
    return Block(block.problem, {op: t - origin for op, t in first.items()}, block.period, 1, block.name)


class _Shape:
    """The problem's block ops in integer ticks, and the CP-SAT model of the module doc at one T."""

    def __init__(self, integral: Problem, problem: Problem, memory_unit: int):
        self.integral, self.problem, self.memory_unit = integral, problem, memory_unit
        self.table = group_table(integral, 1)
        self.ops = block_ops(integral, 1)
        self.duration = {op: int(integral.cost(op.kind, op.stage)) for op in self.ops}
        self.least_period = max(sum(self.duration[op] for op in self.ops if op.stage in stages)
                                for stages in integral.stages_of_device)
        # sizes the model's horizon (chain per op: room for any block up to the serial one)
        self.chain = math.ceil(critical_path(integral)) + max(self.duration.values())
        self.single = integral.replace(num_microbatches=1, memory_limit=None)  # one microbatch alone
        self.earliest_finish = earliest_finish(op_graph(self.single))
        self.placing_order = sorted(self.ops, key=lambda op: (op.kind == WEIGHT, self.earliest_start(op), op.stage))

    def earliest_start(self, op: Op) -> float:
        """The op's earliest start in one microbatch alone on the pipeline."""
        return self.earliest_finish[op] - self.duration[op]

    def serial(self) -> tuple[int, dict[Op, int]]:
        """(T, offsets) of a block that always exists: one microbatch's ops in earliest-start order,
        each device running its own in turn, repeated every T = its length, so one microbatch is in
        flight at a time (the memory floor). The bisection's upper end."""
        timeline = Timeline(self.single)
        for op in sorted(self.ops, key=lambda op: (self.earliest_start(op), op.stage, op.kind)):
            timeline.append(op)
        offsets = {op: round(timeline.start_of(op)) for op in self.ops}
        return max(offsets[op] + self.duration[op] for op in self.ops), offsets

    def placed(self, period: int) -> dict[Op, int] | None:
        """Offsets of a block at `period` by modulo list placement (iterative modulo scheduling,
        Rau 1994, without backtracking), or None when some op finds no free phase: the chain's ops
        (F, then B) in earliest-start order and then the Ws, each at the first moment after its
        input whose phase [r, r + duration) is free on its device modulo T. Memory is not checked."""
        busy: list[list[tuple[int, int]]] = [[] for _ in range(self.integral.num_devices)]
        offsets: dict[Op, int] = {}
        for op in self.placing_order:
            duration, waited = self.duration[op], input_of(self.table, op)
            moment = 0
            if waited is not None:
                before, latency = waited
                moment = offsets[before] + self.duration[before] + int(latency)
            device = self.integral.device_of(op.stage)
            moment = _free_moment(busy[device], moment, duration, period)
            if moment is None:
                return None
            busy[device].append((moment % period, duration))
            offsets[op] = moment
        return offsets

    def first_placed(self, high: int, deadline: float) -> tuple[int, dict[Op, int]] | None:
        """(T, offsets) of the first `placed` block within the memory limit with T from the least
        period up by PLACEMENT_STEP each time, below `high`; None if there is none (or no time)."""
        period = self.least_period
        while period < high and interrupt.now() < deadline:
            offsets = self.placed(period)
            if offsets is not None and _fits(self.problem, steady_peak(Block(self.integral, offsets, period))):
                return period, offsets
            period = math.floor(period * (1 + PLACEMENT_STEP)) + 1
        return None

    def solve(self, period: int, time_limit: float, workers: int, seed: int, hint: dict[Op, int] | None,
              shortest: bool) -> tuple[int, dict[Op, int] | None]:
        """(CP-SAT status, offsets or None) of a block at `period`; the shortest one if asked."""
        model, offset, phase, whole, length = self._model(period)
        if shortest:
            model.Minimize(length)
        if hint is not None:  # a complete hint: offsets with their phases and periods
            for op, value in hint.items():
                model.AddHint(offset[op], value)
                model.AddHint(phase[op], value % period)
                model.AddHint(whole[op], value // period)
        solver = timed_solver(time_limit, workers, seed)
        code = solve_stoppable(solver, model)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return code, None
        return code, {op: solver.Value(offset[op]) for op in self.ops}

    def _model(self, period: int):
        model, ops, duration = cp_model.CpModel(), self.ops, self.duration
        horizon = self.chain * len(ops)
        offset, phase, whole = {}, {}, {}
        for op in ops:
            offset[op] = model.NewIntVar(0, horizon, f"o_{op}")
            phase[op] = model.NewIntVar(0, period - 1, f"r_{op}")
            whole[op] = model.NewIntVar(0, horizon // period, f"q_{op}")
            model.Add(offset[op] == whole[op] * period + phase[op])
        model.Add(offset[Op(FORWARD, 0, 0)] == 0)
        # 1. dependencies
        for op in ops:
            waited = input_of(self.table, op)
            if waited is not None:
                before, latency = waited
                model.Add(offset[op] >= offset[before] + duration[before] + int(latency))
        # 2. no overlap modulo T
        for stages in self.integral.stages_of_device:
            mine = [op for op in ops if op.stage in stages]
            model.AddNoOverlap([model.NewFixedSizeIntervalVar(phase[op] + shift, duration[op], f"i_{op}_{shift}")
                                for op in mine for shift in (0, period)])
        # 3. memory of the repeated block
        if self.problem.memory_limit is not None:
            for device, stages in enumerate(self.integral.stages_of_device):
                self._limit_memory(model, offset, phase, period, stages, self.problem.memory_limit[device], horizon)
        length = model.NewIntVar(0, horizon + self.chain, "length")
        for op in ops:
            model.Add(length >= offset[op] + duration[op])
        return model, offset, phase, whole, length

    def _limit_memory(self, model, offset, phase, period: int, stages, limit: float, horizon: int) -> None:
        problem, unit = self.problem, self.memory_unit
        intervals, demands, always = [], [], []
        for stage in stages:
            forward = Op(FORWARD, stage, 0)
            for kind, amount in problem.releases(stage):
                freer = Op(kind, stage, 0)
                demand = round(amount * unit)
                if demand == 0:
                    continue
                copies = model.NewIntVar(0, horizon // period + 1, f"n_{freer}")
                rest = model.NewIntVar(0, period - 1, f"rem_{freer}")
                model.Add(offset[freer] + self.duration[freer] - offset[forward] == copies * period + rest)
                for shift in (0, period):
                    until = model.NewIntVar(0, 3 * period, f"e_{freer}_{shift}")
                    model.Add(until == phase[forward] + shift + rest)
                    intervals.append(model.NewIntervalVar(phase[forward] + shift, rest, until, f"m_{freer}_{shift}"))
                    demands.append(demand)
                always.append((copies, demand))
        capacity = memory_capacity(limit, unit)
        room = model.NewIntVar(0, capacity, "room")
        model.Add(room + sum(copies * demand for copies, demand in always) == capacity)
        model.AddCumulative(intervals, demands, room)
