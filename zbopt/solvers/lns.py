"""Large-neighbourhood search: improve a schedule one time window at a time with CP-SAT.

For problems too large for one model (v = 2 at p >= 8, say), the search keeps an incumbent and
repeats: free the ops of a window of consecutive starts, fix all others at their times, and let
CP-SAT re-place the free ones (dependencies with latency, no overlap with any op of their device,
every activation's lifetime within the device's memory limit) so the window ends as early as it
can; then compact the whole schedule in its new order (`timeline.compact`: every op as early as
its device, input and memory allow, never later than before) and keep it if the makespan fell,
or stayed and the ops start earlier in sum. The window grows while CP-SAT solves it to optimality
quickly and shrinks when it does not. The first window is the fill, the second the drain (where a
schedule built from a repeating block, `cpsat`'s start under a memory limit, follows a rule rather
than a search); then half the windows sit at the drain, the rest anywhere (a quarter at the fill
measured no better: loop p = 8, m = 16, memory 4, 120 s, three seeds, 1317 against 1292 on average).
Where microbatches differ, each round also tries two of them trading places (the order of entry
decides how well long and short ones interleave).

It proves nothing: the driver's independent lower bounds give the gap. Makespan objective,
one iteration; otherwise it returns no schedule and the driver keeps the warm start.
"""

from __future__ import annotations

import random

from ortools.sat.python import cp_model

from zbopt.core import interrupt
from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.simulation import simulate
from zbopt.core.ticks import memory_capacity, memory_scale, tick_problem, tick_scale
from zbopt.core.timeline import compact
from zbopt.solvers.cp_parts import lifetime_intervals, solve_stoppable, task_stopped, timed_solver
from zbopt.solvers.task import Found, SearchTask, simple_model_refusal

__all__ = ["FIRST_WINDOW_OPS", "MIN_WINDOW_OPS", "STEP_S", "applies", "refusal", "search"]

FIRST_WINDOW_OPS = 120
MIN_WINDOW_OPS = 30
STEP_S = 2.0  # the most one window's model gets


def search(problem: Problem, task: SearchTask, *, window_ops: int = FIRST_WINDOW_OPS) -> Found:
    """Improve the warm start window by window until the deadline or a stop (see the module doc)."""
    scale = tick_scale(problem)
    if task.warm is None or not applies(problem, task):
        return Found("unknown", None, 0.0, None, scale.resolution)
    stopped = task_stopped(task)  # Ctrl-C or the driver: each window's solve is stopped by its watcher
    integral = tick_problem(problem, scale)
    caps = problem.memory_caps
    table = op_table(integral)
    began = interrupt.now()
    current = _timed(integral, _by_start(table, task.warm.start.tolist()), caps)
    finishing = 2 * (interrupt.now() - began)  # kept for the final compaction and its simulation (0 on a meter)
    rng = random.Random(task.seed)
    size = window_ops
    swaps = not problem.microbatches_equal and problem.sequence_slices == 1 and problem.num_microbatches > 1
    turn = 0
    while task.remaining() > interrupt.span(0.05) + finishing and not stopped():
        if swaps:
            current = _better(table, current, _swapped(integral, table, current, caps, rng), task, scale)
        order = sorted(range(table.size), key=lambda i: current[i])
        # the fill first, then the drain (both follow a rule in a block-built start); then half the
        # windows at the drain, where the makespan is decided, the rest anywhere
        ends = (size // 2, table.size - 1 - size // 2)
        middle = ends[turn] if turn < 2 else (ends[1] if rng.random() < 0.5 else rng.randrange(table.size))
        turn += 1
        free = order[max(0, middle - size // 2): middle + size // 2 + 1]
        solver = timed_solver(min(interrupt.span(STEP_S), task.remaining()), task.workers, rng.randrange(1 << 30))
        placed, solved = _reoptimise(integral, table, current, set(free), solver, caps, stopped)
        size = min(table.size, int(size * 1.25)) if solved else max(MIN_WINDOW_OPS, int(size * 0.8))
        if placed is None:
            continue
        try:
            candidate = _timed(integral, _by_start(table, placed), caps)
        except ValueError:  # cannot happen for a model that holds the limit; keep the incumbent
            continue
        current = _better(table, current, candidate, task, scale)
    schedule = compact(problem, [table.op(i) for i in sorted(range(table.size), key=lambda i: current[i])], caps)
    result = simulate(problem, schedule)
    starts = dict(zip(result.table.ops(), result.start.tolist(), strict=True))
    return Found("feasible", starts, 0.0, result.makespan, scale.resolution, error_bound=scale.error_bound,
                 exact=scale.exact)


def refusal(problem: Problem) -> str | None:
    """Why the search cannot take `problem`: its windows keep every activation."""
    return simple_model_refusal(problem, "LNS")


def applies(problem: Problem, task: SearchTask) -> bool:
    """Whether the search can improve a schedule of this task: makespan, one iteration (its windows
    do not model the weight-update barrier), not the driver's second phase (lowering the peak),
    every activation kept."""
    return task.objective == "makespan" and problem.iterations == 1 and task.peak_cap is None \
        and refusal(problem) is None


def _better(table, current: list[float], candidate: list[float] | None, task: SearchTask, scale) -> list[float]:
    """The candidate where it ends sooner, or as soon with the ops starting earlier in sum (reported
    to the task); else the incumbent."""
    if candidate is None or (max(_ends(table, candidate)), sum(candidate)) >= (max(_ends(table, current)),
                                                                              sum(current)):
        return current
    task.report(scale.units(max(_ends(table, candidate))), None)
    return candidate


def _swapped(problem: Problem, table, current: list[float], caps, rng: random.Random) -> list[float] | None:
    """Where microbatches differ, the incumbent with two of them trading places (every op of the
    one where the other's ran, in every device's order: still a valid order, each microbatch's
    chain keeps its sequence), compacted under the caps; None where that cannot fit them."""
    first, second = rng.sample(range(problem.num_microbatches), 2)
    trade = {first: second, second: first}
    order = [Op(op.kind, op.stage, trade.get(op.microbatch, op.microbatch)) for op in _by_start(table, current)]
    try:
        return _timed(problem, order, caps)
    except ValueError:
        return None


def _by_start(table, starts) -> list[Op]:
    """The ops in start order (a topological order: every op starts after its input's start)."""
    return [table.op(i) for i in sorted(range(table.size), key=lambda i: (starts[i], i))]


def _timed(problem: Problem, order: list[Op], caps) -> list[float]:
    """Start of every op (by op index) once `order` is compacted under the memory caps (the
    compaction times them; the simulator judges only the final answer)."""
    table = op_table(problem)
    compacted = compact(problem, order, caps)
    starts = [0.0] * table.size
    for ops, times in zip(compacted.orders, compacted.start_times, strict=True):
        for op, start in zip(ops, times, strict=True):
            starts[table.index(op)] = start
    return starts


def _ends(table, starts) -> list[float]:
    return [start + duration for start, duration in zip(starts, table.duration, strict=True)]


def _reoptimise(problem: Problem, table, current: list[float], free: set[int], solver: cp_model.CpSolver,
                caps, stopped) -> tuple[list[float] | None, bool]:
    """CP-SAT over the `free` ops (indices), all others fixed at `current`; (new starts of every
    op or None, whether it was solved to optimality). The free ops stay within the window's span
    (from the first of them to start to the last to end), so only the fixed ops and lifetimes that
    overlap it can collide with them; the window ends as early as possible (then the sum of ends).
    The solve stops (StopSearch, from its watcher) once `stopped()` holds."""
    model = cp_model.CpModel()
    latest = int(max(current[i] + table.duration[i] for i in free))
    earliest = int(min(current[i] for i in free))
    start: dict[Op, object] = {}
    for index in free:
        start[table.op(index)] = model.NewIntVar(earliest, latest - int(table.duration[index]), f"s{index}")
    duration = {}
    for index in range(table.size):
        op = table.op(index)
        duration[op] = int(table.duration[index])
        if index not in free:
            start[op] = int(current[index])
    end = {op: start[op] + duration[op] for op in start}
    for index in free:  # dependencies touching a free op
        source = table.predecessor[index]
        if source >= 0:
            model.Add(start[table.op(index)] >= end[table.op(source)] + int(table.latency[index]))
    for index in range(table.size):
        source = table.predecessor[index]
        if source in free and index not in free:
            model.Add(end[table.op(source)] + int(table.latency[index]) <= start[table.op(index)])
    busy = [[] for _ in range(problem.num_devices)]
    for index in range(table.size):
        if index in free or (current[index] < latest and current[index] + table.duration[index] > earliest):
            op = table.op(index)
            busy[table.device[index]].append(model.NewFixedSizeIntervalVar(start[op], duration[op], f"i{index}"))
    for intervals in busy:
        model.AddNoOverlap(intervals)
    if problem.memory_limit is not None:
        _limit_memory(model, problem, table, current, free, start, end, earliest, latest, caps)
    window_end = model.NewIntVar(earliest, latest, "window_end")
    for index in free:
        model.Add(window_end >= end[table.op(index)])
    model.Minimize((len(free) + 1) * window_end + sum(end[table.op(index)] for index in free))
    for index in free:
        model.AddHint(start[table.op(index)], int(current[index]))
    code = solve_stoppable(solver, model, stop_when=stopped)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, False
    placed = list(current)
    for index in free:
        placed[index] = solver.Value(start[table.op(index)])
    return placed, code == cp_model.OPTIMAL


def _limit_memory(model, problem: Problem, table, current, free, start, end, earliest, latest, caps) -> None:
    """Every lifetime that touches a free op or the window's time span, in one cumulative per device."""
    touching = set()
    for index in range(table.size):
        op = table.op(index)
        if op.kind != FORWARD:
            continue
        lifetime = [table.index(Op(kind, op.stage, op.microbatch)) for kind in problem.kinds]
        last_end = max(current[i] + table.duration[i] for i in lifetime)
        if any(i in free for i in lifetime) or (current[index] < latest and last_end > earliest):
            touching.update(table.op(i) for i in lifetime)
    forwards = sorted(op for op in touching if op.kind == FORWARD)  # one order, whatever the hash seed
    held = lifetime_intervals(model, problem, forwards, start, end, int(max(_ends(table, current))))
    unit = memory_scale(problem)
    for device, lives in enumerate(held):
        if lives:
            model.AddCumulative([life.interval for life in lives], [life.amount for life in lives],
                                memory_capacity(caps[device], unit))
