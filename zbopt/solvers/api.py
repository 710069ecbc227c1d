"""`solve`: the one driver every exact solver runs under.

The driver owns what every solve method shares: the argument checks, the independent lower
bounds, the warm start, the early exit when the warm start already meets the bound, the time
budget, the live progress line, Ctrl-C, the re-simulation of the answer, the rule for "optimal"
and the gap, and the second phase that lowers the peak memory at the makespan found. A backend
(`cpsat.search`, `milp.search`, `lns.search`; `hybrid.search` runs the first and the last in turn)
only builds its model, solves it and returns what it found.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from zbopt.errors import ZboptError
from zbopt.ops import Op
from zbopt.problem import Problem
from zbopt.schedules.common import schedule_from_starts
from zbopt.simulation import Simulation, simulate
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.result import (
    OBJECTIVES,
    SolveResult,
    check_close,
    gap_text,
    meets,
    objective_bound,
    objective_value,
    optimality_tolerance,
    relative_gap,
    settle,
    warm_start_simulation,
    without_needless_mechanisms,
)

# solver name -> (module, backend option); each module has one function `search(problem, task, **options)`,
# and may have `refusal(problem) -> str | None`: why it cannot solve that problem (checked before any work)
BACKENDS = {"cpsat": ("zbopt.solvers.hybrid", {}), "cbc": ("zbopt.solvers.milp", {"engine": "cbc"}),
            "highs": ("zbopt.solvers.milp", {"engine": "highs"}), "lns": ("zbopt.solvers.lns", {})}
SOLVERS = tuple(BACKENDS)
LIVE_LINE_PERIOD_S = 0.5
HEURISTICS_SHARE = 0.3  # of the time limit: no further heuristic starts after it (once one is valid)
BOUNDS_SHARE = 0.3  # of what the heuristics left: the lower bounds stop after it
ABANDON_GRACE_S = 1.0  # a backend still running this long past the deadline is left behind


def _ignore(*_args) -> None:
    """A hook nobody listens to: `report` without a live line, `on_stop` outside `_run_stoppable`."""


@dataclass
class SearchTask:
    """What the driver hands a backend.

    objective : "makespan" or "span". With `peak_cap` set (the second phase; `warm` is then the
        first phase's schedule and `peak_cap` its objective), the backend instead minimises the
        highest peak memory over the devices, keeping the objective at most the warm start's; a
        backend that cannot says so with `Found(status="unknown")`.
    warm : the warm start (valid under the memory limit) to hint and to cap the horizon with, or None.
    independent_bound : the driver's lower bound on the objective (problem units).
    deadline : `time.perf_counter()` by which the backend must have returned.
    report : call with (incumbent, bound) in problem units whenever either improves.
    on_stop : register a callable that stops the search (Ctrl-C); the backend then returns its best.
    """

    objective: str
    warm: Simulation | None
    independent_bound: float
    deadline: float
    workers: int
    seed: int
    report: Callable[[float | None, float | None], None] = _ignore
    on_stop: Callable[[Callable[[], None]], None] = _ignore
    peak_cap: float | None = None
    stopped: threading.Event = field(default_factory=threading.Event)

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()


@dataclass(frozen=True)
class Found:
    """A backend's answer.

    status : its own verdict on its own model: optimal, feasible, infeasible, unknown.
    starts : the start time of every op (problem units), or None without a schedule.
    bound : its own lower bound on the objective (problem units, rounding already taken off).
    modelled : its objective value as its model computed it (checked against the simulator).
    resolution : one time unit of its model (problem units; None without a model); `error_bound` the most its objective
        can differ from the simulated one through that rounding; `exact` when a proof of
        optimality holds for the problem's own costs, not only for the rounded ones.
    tolerance : the absolute slack its solver allows (problem units).
    pairs : the overlapped pairs its schedule runs (`Schedule.pairs`).
    """

    status: str
    starts: dict[Op, float] | None
    bound: float
    modelled: float | None
    resolution: float | None
    error_bound: float = 0.0
    exact: bool = True
    tolerance: float = 0.0
    pairs: tuple[tuple[Op, ...], ...] = ()


def solve(problem: Problem, solver: str = "cpsat", *, time_limit: float = 60.0, objective: str = "makespan",
          warm_start: str | None = None, use_warm_start: bool = True, lower_peak: bool = True, workers: int = 2,
          seed: int = 0, progress: bool = False, **options) -> SolveResult:
    """The schedule with the smallest makespan (or longest device span) within the memory limit,
    with its status, lower bound and gap.

    Parameters
    ----------
    solver : "cpsat" (OR-Tools CP-SAT: the full model, `zbopt.solvers.cpsat`; on large problems,
        unless it proved its answer by half time, then LNS from its best, `zbopt.solvers.hybrid`),
        "cbc" / "highs" (the disjunctive MILP through PuLP, `zbopt.solvers.milp`) or "lns"
        (large-neighbourhood search from the warm start, `zbopt.solvers.lns`).
    time_limit : seconds for the whole call, shared by stages: the heuristics (no further one
        starts after HEURISTICS_SHARE of it, once one is valid), the lower bounds (cut after
        BOUNDS_SHARE of what is left; `bounds_complete` says so), then the search and the second
        phase; a backend still busy ABANDON_GRACE_S past the deadline is left behind (its
        thread ends on its own) and the best schedule so far is the answer.
    objective : "makespan" or "span" (the Zero Bubble paper's longest per-device span).
    warm_start : a registered heuristic to start from; None: the best valid one (at equal
        objective, the one with less peak memory).
    use_warm_start : hint the model with the warm start and cap its horizon with it.
    lower_peak : after the search, spend at most as long again as the call took so far (at least
        1 s, within the time limit) lowering the highest peak memory while keeping the objective
        (CP-SAT only; skipped when less time than that is left).
    workers, seed : solver threads and random seed; one worker and a seed repeat exactly.
    progress : a live line on stderr (incumbent, bound, gap, elapsed time), redrawn twice a second.
    options : the backend's own options (CP-SAT: memory_model, symmetry_breaking, lns_share, pair_window).

    Returns
    -------
    SolveResult, its schedule re-simulated; never worse than the warm start.

    >>> from zbopt import Problem
    >>> result = solve(Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2), time_limit=10)
    >>> result.status, result.objective
    ('optimal', 9.0)
    """
    if solver not in BACKENDS:
        raise ZboptError(f"unknown solver '{solver}' (known: {', '.join(SOLVERS)})")
    if objective not in OBJECTIVES:
        raise ZboptError(f"unknown objective '{objective}' (known: {', '.join(OBJECTIVES)})")
    if not time_limit > 0:  # NaN too
        raise ZboptError(f"time limit {time_limit:g}: must be positive")
    if workers < 1:
        raise ZboptError(f"workers {workers}: must be at least 1")
    began = time.perf_counter()
    module, backend_options = BACKENDS[solver]
    backend = importlib.import_module(module)
    refusal = getattr(backend, "refusal", lambda _problem: None)(problem)
    if refusal:
        raise ZboptError(f"solver '{solver}': {refusal}")
    search = backend.search
    options = {**backend_options, **options}
    _check_options(search, solver, options)
    deadline = began + time_limit
    # the stages share the limit: heuristics, then bounds, each up to a share; the search gets the rest
    warm = None
    if use_warm_start:
        warm = warm_start_simulation(problem, warm_start, objective, began + HEURISTICS_SHARE * time_limit)
    bounds = lower_bounds(problem, time.perf_counter() + BOUNDS_SHARE * max(0.0, deadline - time.perf_counter()))
    independent_bound, binding = objective_bound(problem, bounds, objective)

    def finish(simulation: Simulation | None, status: str, lower: float, decided_by: str | None,
               resolution: float | None = None) -> SolveResult:
        value = None if simulation is None else objective_value(simulation, objective)
        if simulation is not None and simulation.schedule.name != solver:
            # the answer is the solver's, also where it is the warm start's schedule: one name in
            # every table and chart (`warm_start` says which heuristic it started from)
            simulation = replace(simulation, schedule=replace(simulation.schedule, name=solver))
        return SolveResult(status=status, simulation=simulation, objective=value, lower_bound=lower, solver=solver,
                           objective_kind=objective, solve_time_s=time.perf_counter() - began,
                           warm_start=None if warm is None else warm[0], resolution=resolution,
                           decided_by=decided_by, bounds=bounds.as_dict(), binding_bound=binding,
                           bounds_complete=bounds.complete)

    tolerance = optimality_tolerance(independent_bound)
    if warm is not None and meets(objective_value(warm[1], objective), independent_bound, tolerance):
        # no model is built: the warm start is proven optimal by the bound alone
        simulation = without_needless_mechanisms(problem, warm[1], objective, deadline)
        return finish(simulation, "optimal", objective_value(simulation, objective), f"lower bound ({binding})")

    live = _LiveLine(began, independent_bound, None if warm is None else objective_value(warm[1], objective)) \
        if progress else None
    task = SearchTask(objective, None if warm is None else warm[1], independent_bound, deadline, workers,
                      seed, report=live.update if live else _ignore)
    found = _run_stoppable(search, problem, task, options, live)
    simulation = simulated_answer(problem, found, objective, solver)
    if simulation is None and task.stopped.is_set():
        raise KeyboardInterrupt  # stopped before the backend found a schedule of its own
    if simulation is None and warm is None:
        proved = "solver" if found.status == "infeasible" else None
        return finish(None, found.status, max(independent_bound, found.bound), proved, found.resolution)
    if simulation is not None:
        simulation = without_needless_mechanisms(problem, simulation, objective, deadline)
    status, simulation, lower, decided_by = _verdict(found, simulation, warm, objective, independent_bound, binding)
    if lower_peak and not task.stopped.is_set():
        try:
            simulation = _lower_peak(search, problem, task, options, simulation, began, solver)
        except KeyboardInterrupt:  # Ctrl-C between the phases: the first phase's answer stands
            task.stopped.set()
    return finish(simulation, status, lower, decided_by, found.resolution)


def _check_options(search, solver: str, options: dict) -> None:
    """Refuse an option the backend does not take, before any work (not only when a model is built)."""
    try:
        inspect.signature(search).bind(None, None, **options)
    except TypeError as error:
        raise ZboptError(f"solver '{solver}': {error}") from None


def _run_stoppable(search, problem: Problem, task: SearchTask, options: dict, live: _LiveLine | None) -> Found:
    """Run the backend in a worker thread while this thread redraws the live line; Ctrl-C here calls
    the stop hooks the backend registered (it then returns its best so far), or, when it
    registered none, propagates at once."""
    stops: list[Callable[[], None]] = []
    task.on_stop = stops.append
    outcome: dict[str, object] = {}
    done = threading.Event()  # not Thread.join: a Ctrl-C inside join can leave is_alive() wrong

    def work() -> None:
        try:
            outcome["found"] = search(problem, task, **options)
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=work, name="zbopt-search", daemon=True).start()
    try:
        while not done.is_set():
            try:
                done.wait(LIVE_LINE_PERIOD_S)
                if live is not None:
                    live.draw()
                if not done.is_set() and time.perf_counter() > task.deadline + ABANDON_GRACE_S:
                    for stop in stops:
                        stop()
                    return Found("unknown", None, 0.0, None, None)  # e.g. still building a model too large
            except KeyboardInterrupt:
                if not stops or task.stopped.is_set():
                    raise
                task.stopped.set()
                for stop in stops:
                    stop()
    finally:
        if live is not None:
            live.close()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["found"]


def simulated_answer(problem: Problem, found: Found, objective: str, solver: str) -> Simulation | None:
    """The backend's schedule through the one simulator (strict: a memory violation is a bug),
    its objective checked against the model's own where the backend gives one."""
    if found.starts is None:
        return None
    # as soon as possible, which is robust to rounded ticks; but a wait for memory (a forward until
    # an offload has freed room, a recompute or reload not too early) and which copy goes first on a
    # shared host link are in the model's times only
    simulation = None
    if not problem.shared_host_link:
        simulation = simulate(problem, schedule_from_starts(problem, found.starts, solver, pairs=found.pairs),
                              strict=not problem.mechanisms_matter)
    if simulation is None or not simulation.valid:
        simulation = simulate(problem, schedule_from_starts(problem, found.starts, solver, timed=True,
                                                            pairs=found.pairs), strict=True)
    if found.modelled is not None:
        check_close(solver, objective_value(simulation, objective), found.modelled, found.error_bound)
    return simulation


def _verdict(found: Found, simulation: Simulation | None, warm, objective: str, independent_bound: float,
             binding: str) -> tuple[str, Simulation, float, str | None]:
    """(status, simulation, lower bound, what decided) of a search: the warm start when it is
    better; the objective as its own bound when the backend proved it for the problem's own costs;
    "optimal" exactly when the objective meets the lower bound (the one rule), else "feasible"."""
    tolerance = max(optimality_tolerance(independent_bound), found.tolerance)
    lower = max(independent_bound, found.bound)
    if simulation is None or (warm is not None and objective_value(warm[1], objective)
                              < objective_value(simulation, objective) - tolerance):
        simulation = warm[1]
    value = objective_value(simulation, objective)
    decided_by = None
    if found.status == "optimal" and found.exact and value <= found.modelled + tolerance:
        lower, decided_by = max(lower, value), "solver"
    elif meets(value, independent_bound, tolerance):
        decided_by = f"lower bound ({binding})"
    elif meets(value, found.bound, tolerance):  # e.g. LNS reached the bound the full model proved
        decided_by = "solver"
    elif found.status == "optimal":
        decided_by = (f"proven optimal at the model's tick resolution {found.resolution:g}; rounded costs leave "
                      f"a gap of at most {relative_gap(value, lower):.4%}")
    status, lower = settle(value, lower, tolerance)
    return status, simulation, lower, decided_by


def _lower_peak(search, problem: Problem, task: SearchTask, options: dict, simulation: Simulation,
                began: float, solver: str) -> Simulation:
    """The second phase: the same objective, less peak memory, if the backend finds it within at
    most as long again as the call took so far (at least 1 s). Skipped when less time is left than
    that: its model costs about as much to build as the first one."""
    value = objective_value(simulation, task.objective)
    elapsed = time.perf_counter() - began
    budget = min(task.remaining(), max(1.0, elapsed))
    if task.remaining() < elapsed or budget <= 0.05:
        return simulation
    phase = replace(task, warm=simulation, peak_cap=value, deadline=time.perf_counter() + budget,
                    report=_ignore, stopped=task.stopped)
    leaner = simulated_answer(problem, _run_stoppable(search, problem, phase, options, None), task.objective, solver)
    if leaner is None or objective_value(leaner, task.objective) > value:  # not even a rounding worse
        return simulation
    return leaner if max(leaner.peak_memory) < max(simulation.peak_memory) else simulation


class _LiveLine:
    """"  incumbent X  bound Y  gap Z  T s" on one stderr line, redrawn twice a second, so the
    elapsed time and the bound show, and the bound rises as the backend reports it, even while no
    better schedule is found."""

    def __init__(self, began: float, bound: float, incumbent: float | None):
        self.began, self.bound, self.incumbent = began, bound, incumbent

    def update(self, incumbent: float | None, bound: float | None) -> None:
        if incumbent is not None and (self.incumbent is None or incumbent < self.incumbent):
            self.incumbent = incumbent
        if bound is not None and bound > self.bound:
            self.bound = bound

    def draw(self) -> None:
        incumbent = "none" if self.incumbent is None else f"{self.incumbent:.6g}"
        gap = gap_text(relative_gap(self.incumbent, self.bound))
        sys.stderr.write(f"\r  incumbent {incumbent}  bound {self.bound:.6g}  gap {gap:>6}  "
                         f"{time.perf_counter() - self.began:6.1f} s ")
        sys.stderr.flush()

    def close(self) -> None:
        self.draw()
        sys.stderr.write("\n")
        sys.stderr.flush()
