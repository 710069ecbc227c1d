"""The memory–makespan frontier: the optimal makespan at each memory limit of a sweep, with every
heuristic placed at the peak memory it needs, so one sees what each extra unit of memory buys.

The solves are independent, so they run in parallel through any `concurrent.futures.Executor`:
by default worker processes on this machine, or a dask cluster's `client.get_executor()`.
"""

from __future__ import annotations

import math
import multiprocessing
import numbers
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from itertools import accumulate

from zbopt.core import interrupt
from zbopt.core.errors import ProblemError, ZboptError
from zbopt.core.problem import Problem
from zbopt.core.simulation import simulate
from zbopt.core.wiring import Shown, dataframe
from zbopt.schedules import generate_applicable
from zbopt.solvers import solve
from zbopt.solvers.gap import relative_gap, settle

__all__ = ["MAX_LIMITS", "Frontier", "FrontierPoint", "HeuristicPoint", "counted_mechanisms",
           "heuristic_points", "limits_at", "memory_frontier", "parse_memory_limits", "process_pool", "sweep_scale"]

MAX_LIMITS = 10_000  # a sweep longer than this is a typo in START:STOP:STEP, not a plan


@dataclass(frozen=True)
class FrontierPoint:
    """The optimizer's answer at one value of the sweep: the limit on every device or, where the
    problem's own limits differ between devices, the factor each is scaled by (`Frontier.scaled`).

    makespan is None when no schedule was found within the time limit (status "unknown").
    found_at is the limit whose solve found the schedule: this one, or a smaller one whose
    schedule was better (it fits this limit too; see `memory_frontier`). recomputed and offloaded
    are how many activations (stage, microbatch) that schedule recomputes and offloads, None where
    the mechanism is not allowed (`counted_mechanisms`)."""

    memory_limit: float
    status: str
    makespan: float | None
    lower_bound: float
    solve_time_s: float
    found_at: float | None = None
    recomputed: int | None = None
    offloaded: int | None = None

    @property
    def gap(self) -> float | None:
        return relative_gap(self.makespan, self.lower_bound)

    def to_dict(self) -> dict:
        return {"memory_limit": self.memory_limit, "status": self.status, "makespan": self.makespan,
                "lower_bound": self.lower_bound, "gap": self.gap, "solve_time_s": self.solve_time_s,
                "found_at": self.found_at, "recomputed": self.recomputed, "offloaded": self.offloaded}


@dataclass(frozen=True)
class HeuristicPoint:
    """A registered heuristic run without a memory limit: the most memory any device holds, and
    its makespan (its iteration time where the problem has the iteration's ends, as the solved
    points'). It is a feasible schedule at every limit from `peak_memory` on; with scaled
    per-device limits, from `factor` on (the most any device's peak takes of its own limit)."""

    name: str
    peak_memory: float
    makespan: float
    factor: float | None = None

    @property
    def position(self) -> float:
        """Where it sits on the sweep's axis: the least sweep value it fits at."""
        return self.peak_memory if self.factor is None else self.factor

    def to_dict(self) -> dict:
        return {"name": self.name, "peak_memory": self.peak_memory, "makespan": self.makespan, "factor": self.factor}


@dataclass(frozen=True)
class Frontier(Shown):
    """The sweep's answers in increasing sweep value, the heuristics by where they fit, and the
    sweep's wall-clock time (the solves ran in parallel, so less than their sum). `scaled` holds
    the problem's per-device limits the sweep's values multiply (`sweep_scale`), or None."""

    problem: Problem
    time_limit: float
    points: tuple[FrontierPoint, ...]
    heuristics: tuple[HeuristicPoint, ...]
    wall_time_s: float
    scaled: tuple[float, ...] | None = None

    def device_limits(self, point: FrontierPoint) -> tuple[float, ...]:
        """The memory limit of each device at `point`."""
        return limits_at(self.problem, self.scaled, point.memory_limit)

    def to_dict(self) -> dict:
        problem = self.problem.replace(memory_limit=None).to_dict()
        del problem["memory_limit"]  # the sweep sets it
        return {"problem": problem, "scaled_limits": None if self.scaled is None else list(self.scaled),
                "time_limit": self.time_limit, "wall_time_s": self.wall_time_s,
                "points": [{**point.to_dict(), "device_limits": list(self.device_limits(point))}
                           for point in self.points],
                "heuristics": [point.to_dict() for point in self.heuristics]}

    def to_dataframe(self):
        """One row per memory limit (`FrontierPoint.to_dict`), as a pandas DataFrame (pandas is optional)."""
        return dataframe([point.to_dict() for point in self.points])


def parse_memory_limits(text: str) -> tuple[float, ...]:
    """"START:STOP:STEP" as the limits START, START+STEP, ... up to and including STOP.

    >>> parse_memory_limits("1:3:0.5")
    (1.0, 1.5, 2.0, 2.5, 3.0)
    """
    parts = text.split(":")
    try:
        start, stop, step = (float(part) for part in parts) if len(parts) == 3 else (math.nan,) * 3
    except ValueError:
        start = stop = step = math.nan
    if not all(math.isfinite(value) for value in (start, stop, step)):
        raise ZboptError(f"memory limits '{text}': expected START:STOP:STEP with three numbers, e.g. 1:8:1")
    if step <= 0:
        raise ZboptError(f"memory limits '{text}': STEP must be positive, got {step:g}")
    if stop < start:
        raise ZboptError(f"memory limits '{text}': STOP {stop:g} is below START {start:g}")
    count = math.floor((stop - start) / step + 1e-9) + 1  # STOP itself despite float rounding
    if count > MAX_LIMITS:
        raise ZboptError(f"memory limits '{text}': {count} limits, more than {MAX_LIMITS}; use a larger STEP")
    return tuple(round(start + index * step, 12) for index in range(count))


def process_pool(max_workers: int | None = None) -> ProcessPoolExecutor:
    """Worker processes started with "spawn": forking a process that has loaded OR-Tools is unsafe."""
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"))


def sweep_scale(problem: Problem) -> tuple[float, ...] | None:
    """The per-device limits a sweep scales: the problem's own where they differ between devices
    (one value for all would lose them), else None: each sweep value is every device's limit."""
    limit = problem.memory_limit
    return None if limit is None or len(set(limit)) == 1 else limit


def limits_at(problem: Problem, scaled: tuple[float, ...] | None, value: float) -> tuple[float, ...]:
    """Each device's memory limit at the sweep's `value`: the value, or the value times its own limit."""
    return (value,) * problem.num_devices if scaled is None else tuple(value * cap for cap in scaled)


def heuristic_points(problem: Problem, scaled: tuple[float, ...] | None = None) -> tuple[HeuristicPoint, ...]:
    """Every registered heuristic that applies, simulated without a memory limit so each sits at
    its own peak memory (and, with `scaled` limits, the least factor of them it fits); sorted by
    that place, then makespan, then name."""
    unlimited = problem.replace(memory_limit=None)
    points = []
    for name, schedule in generate_applicable(unlimited)[0].items():
        simulation = simulate(unlimited, schedule)
        peaks = simulation.peak_memory
        factor = None if scaled is None else max(peak / cap for peak, cap in zip(peaks, scaled, strict=True))
        points.append(HeuristicPoint(name, max(peaks), simulation.iteration_time, factor))
    return tuple(sorted(points, key=lambda point: (point.position, point.makespan, point.name)))


def memory_frontier(problem: Problem, memory_limits: Iterable[float], *, time_limit: float = 60.0,
                    executor: Executor | None = None, workers: int | None = None, progress: bool = False) -> Frontier:
    """Solve `problem` (CP-SAT, one thread each) at every memory limit, in parallel.

    The solves are independent, but their answers are not: a schedule within a smaller limit is
    within every larger one, and a lower bound at a larger limit holds at every smaller one (less
    memory is never faster). So each point reports the best schedule found at or below its limit
    (`found_at` says where) and the best bound proven at or above it, and the frontier never rises.

    Parameters
    ----------
    problem : each solve sets one limit on every device, replacing the problem's own; where the
        problem's limits differ between devices, each solve scales them instead (`sweep_scale`).
    memory_limits : the limits (or factors), each leaving every device at least the problem's
        least valid limit (see `Problem.min_memory_limit`); `parse_memory_limits` reads "START:STOP:STEP".
    time_limit : seconds per solve.
    executor : where the solves run, e.g. a dask `Client(...).get_executor()`; by default a pool
        of spawned processes, one per core (each solve uses one thread, so N processes use N cores).
    workers : without `executor`, that many processes instead of one per core.
    progress : a one-line bar on stderr, advanced as solves finish.

    Returns
    -------
    Frontier : one point per limit (its makespan, status, bound and schedule), never rising.

    Raises
    ------
    ZboptError : naming the first limit no schedule can meet, or an empty sweep.
    zbopt.core.interrupt.Interrupted : on Ctrl-C (in the main thread: see `zbopt.core.interrupt`):
        the pending solves are cancelled, our own pool's workers stopped, and its `partial` is the
        Frontier of the points finished so far (None if none).

    Examples
    --------
    p = 2, m = 4, F = B = W = 1: one activation a device forces GPipe's serial 20; two already
    allow 1F1B's 13, which more memory does not beat (threads stand in for the process pool here).

    >>> from concurrent.futures import ThreadPoolExecutor
    >>> from zbopt import Problem
    >>> problem = Problem(num_devices=2, num_microbatches=4, forward_times=1, backward_times=1, weight_times=1)
    >>> with ThreadPoolExecutor(2) as pool:
    ...     frontier = memory_frontier(problem, [1, 2, 3], time_limit=10, executor=pool)
    >>> [(point.memory_limit, point.makespan, point.status) for point in frontier.points]
    [(1.0, 20.0, 'optimal'), (2.0, 13.0, 'optimal'), (3.0, 13.0, 'optimal')]
    """
    scaled = sweep_scale(problem)
    limits = sorted(_checked_limit(problem, scaled, limit) for limit in memory_limits)
    if not limits:
        raise ZboptError("memory limits: none given")
    if time_limit <= 0:
        raise ZboptError(f"time limit {time_limit:g}: must be positive")
    began = time.perf_counter()
    own_pool = executor is None
    if own_pool:
        executor = process_pool(min(len(limits), workers or os.cpu_count() or 1))
    futures: list[Future] = []
    with interrupt.stoppable():
        try:
            futures = _submitted(executor, problem, scaled, limits, time_limit)
            heuristics = heuristic_points(problem, scaled)  # while the solves run
            finished = _finished_solves(futures, _ProgressBar(len(futures)) if progress else None)
            if len(finished) < len(futures):  # Ctrl-C: no further solve starts, our own workers stop now
                _stop_solves(executor, futures, own_pool)
        except BaseException:  # an error in a solve, or a second Ctrl-C from Python
            _stop_solves(executor, futures, own_pool)
            raise
        finally:
            if own_pool:
                executor.shutdown(cancel_futures=True)
    frontier = Frontier(problem, time_limit, _best_known_at_each_limit(finished), heuristics,
                        time.perf_counter() - began, scaled)
    if len(finished) < len(futures):  # only Ctrl-C ends the sweep early
        raise interrupt.Interrupted(frontier if finished else None)
    return frontier


def _submitted(executor: Executor, problem: Problem, scaled: tuple[float, ...] | None, limits: list[float],
               time_limit: float) -> list[Future]:
    """One solve per limit. Ctrl-C is ignored while they are submitted: the processes a pool starts
    then inherit that (Python keeps it), so a terminal's Ctrl-C, sent to the whole process group,
    reaches only this process, which stops them."""
    ignoring = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignoring else None
    try:
        return [executor.submit(_solve_at, problem.replace(memory_limit=limits_at(problem, scaled, limit)), limit,
                                time_limit) for limit in limits]
    finally:
        if ignoring:
            signal.signal(signal.SIGINT, previous)


def _finished_solves(futures: list[Future], bar: _ProgressBar | None) -> list[FrontierPoint]:
    """The points of the solves, in the order of `futures`, once all have finished or Ctrl-C came
    (`interrupt.requested`): then only those finished so far."""
    pending = set(futures)
    while pending and not interrupt.requested.is_set():
        done, pending = wait(pending, timeout=interrupt.POLL_S, return_when=FIRST_COMPLETED)
        for future in done:
            future.result()  # an error in a solve stops the sweep here
            if bar is not None:
                bar.advance()
    if bar is not None and pending:
        bar.close()
    return [future.result() for future in futures if future not in pending]


def _stop_solves(executor: Executor, futures: list[Future], own_pool: bool) -> None:
    """Cancel the solves not yet started and, in our own pool, terminate the workers: a solve under
    way, or already queued to a worker, would otherwise run to its time limit."""
    for future in futures:
        future.cancel()
    if own_pool:
        _stop_workers(executor)


def _best_known_at_each_limit(points: list[FrontierPoint]) -> tuple[FrontierPoint, ...]:
    """Points in increasing limit, each with the shortest makespan found at or below its limit (at
    equal makespan, the fewest recomputes, then offloads) and the highest bound proven at or above
    it; the status follows ("optimal" when they meet)."""
    bounds = list(accumulate((point.lower_bound for point in reversed(points)), max))[::-1]
    carried, best = [], None
    for point, bound in zip(points, bounds, strict=True):
        if point.makespan is not None and (best is None or _preference(point) < _preference(best)):
            best = point
        if best is point and bound == point.lower_bound:
            carried.append(replace(point, found_at=point.memory_limit))
            continue
        makespan = None if best is None else best.makespan
        status = "unknown"
        if makespan is not None:  # the solve driver's rule
            status, bound = settle(makespan, bound)
        carried.append(replace(point, status=status, makespan=makespan, lower_bound=bound,
                               found_at=None if best is None else best.memory_limit,
                               recomputed=None if best is None else best.recomputed,
                               offloaded=None if best is None else best.offloaded))
    return tuple(carried)


def counted_mechanisms(problem: Problem) -> list[tuple[str, str]]:
    """(letter, name) of each mechanism the problem allows, the name being both the FrontierPoint
    count and the op table's (stage, microbatch) pairs: ("R", "recomputed"), ("O", "offloaded")."""
    return [(letter, name) for letter, name, allowed in (("R", "recomputed", problem.recomputation is not None),
                                                          ("O", "offloaded", problem.offload is not None)) if allowed]


def _preference(point: FrontierPoint) -> tuple:
    """Shorter first; at equal makespan, fewer recomputes (work), then fewer offloads (traffic)."""
    return point.makespan, point.recomputed or 0, point.offloaded or 0


def _checked_limit(problem: Problem, scaled: tuple[float, ...] | None, limit: float) -> float:
    """The sweep value, if every device can meet its limit there; else a ZboptError naming the
    value (and the limits it scales to) and the device."""
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise ZboptError(f"memory limit {limit!r}: expected a number")
    try:
        problem.replace(memory_limit=limits_at(problem, scaled, limit))
    except ProblemError as error:
        named = f"memory limit {limit!r}" if scaled is None else f"memory limit factor {limit!r} (limits " \
            f"{', '.join(f'{cap:g}' for cap in limits_at(problem, scaled, limit))})"
        raise ZboptError(f"{named}: {error.reason}") from None
    return float(limit)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's worker processes (Python 3.14's `terminate_workers` does the same)."""
    for process in list((pool._processes or {}).values()):
        process.terminate()


def _solve_at(problem: Problem, limit: float, time_limit: float) -> FrontierPoint:
    """One solve of the sweep (runs in a worker, so it returns only the few numbers the frontier keeps)."""
    result = solve(problem, "cpsat", time_limit=time_limit, workers=1)
    counts = {} if result.simulation is None else \
        {name: len(getattr(result.simulation.table, name)) for _, name in counted_mechanisms(problem)}
    return FrontierPoint(limit, result.status, result.objective, result.lower_bound, result.solve_time_s, limit,
                         **counts)


class _ProgressBar:
    """"[#####.....] k/N limits solved, 12 s" on one stderr line, redrawn as solves finish."""

    WIDTH = 30

    def __init__(self, total: int):
        self.total, self.done, self.began = total, 0, time.perf_counter()
        self._draw()

    def advance(self) -> None:
        self.done += 1
        self._draw()
        if self.done == self.total:
            self.close()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()

    def _draw(self) -> None:
        filled = self.WIDTH * self.done // self.total
        sys.stderr.write(f"\r  [{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} limits solved, "
                         f"{time.perf_counter() - self.began:.0f} s ")
        sys.stderr.flush()
