"""`solve`: the one driver every exact solver runs under.

The driver owns what every solve method shares: the argument checks, the independent lower
bounds, the warm start, the early exit when the warm start already meets the bound, the time
budget, the live progress line, Ctrl-C, the re-simulation of the answer, the rule for "optimal"
and the gap, and the second phase that lowers the peak memory at the makespan found. A backend
(a function in BACKENDS) only builds its model, solves it and returns what it found.
"""

from __future__ import annotations

import contextvars
import inspect
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

from zbopt.core import interrupt
from zbopt.core.errors import ZboptError
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import compute_slowed
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import Simulation
from zbopt.schedules.ordering import Order
from zbopt.solvers import cpsat, full_model, lns, milp
from zbopt.solvers.answer import (
    OBJECTIVES,
    objective_name,
    objective_value,
    simulated_answer,
    without_needless_mechanisms,
)
from zbopt.solvers.bounds import LowerBounds, lower_bounds, span_bounds
from zbopt.solvers.gap import gap_text, meets, optimality_tolerance, relative_gap, settle
from zbopt.solvers.result import SolveResult
from zbopt.solvers.task import Found, SearchTask, ignore
from zbopt.solvers.warm import warm_start_simulation

__all__ = ["ANSWER_SECONDS_PER_OP", "BACKENDS", "BOUNDS_SHARE", "CP_SAT_STOP_S", "HEURISTICS_CUTOFF",
           "HEURISTICS_SHARE", "LIVE_LINE_PERIOD_S", "MILP_STOP_S", "SOLVERS", "STOP_GRACE_S", "Backend",
           "search_deadline", "solve"]


class Backend(NamedTuple):
    """A solve method: `search(problem, task, **options) -> Found`; `refusal(problem)`: why it
    cannot solve that problem, or None (checked before any work); `stop_s`: how long it may take
    to return once its deadline has passed (the driver gives it its deadline that much earlier)."""

    search: Callable[..., Found]
    refusal: Callable[[Problem], str | None] = lambda _problem: None
    stop_s: float = 0.0


# CP-SAT and LNS: the deadline watcher polls every 0.05 s, then the answer is read (measured on 2 cores:
# within 0.15 s at 576-3072 ops; but on some models CP-SAT's full-problem LP worker answers a stop only
# seconds later, and is left behind); the MILP: its child reads and hands back the solver's answer
# after the solver's own limit (measured: 0.8-1.3 s, HiGHS and CBC, p = 8, m = 24)
CP_SAT_STOP_S = 0.25
MILP_STOP_S = 1.5
BACKENDS = {"cpsat": Backend(cpsat.search, full_model.refusal, CP_SAT_STOP_S),
            "cbc": Backend(partial(milp.search, engine="cbc"), milp.refusal, MILP_STOP_S),
            "highs": Backend(partial(milp.search, engine="highs"), milp.refusal, MILP_STOP_S),
            "lns": Backend(lns.search, lns.refusal, CP_SAT_STOP_S)}
SOLVERS = tuple(BACKENDS)
LIVE_LINE_PERIOD_S = 0.5
STOP_GRACE_S = 0.5  # after Ctrl-C, how long a backend gets to return its best before it is left behind
HEURISTICS_SHARE = 0.3  # of the time limit: no further heuristic starts after it (once one is valid)
HEURISTICS_CUTOFF = 0.6  # of the time limit: while none is valid yet, a heuristic stops here at the latest
BOUNDS_SHARE = 0.3  # of what the heuristics left: the lower bounds stop after it
# re-simulating the answer, at most twice (`simulated_answer`; measured: 0.23-0.28 s of CPU for one, 49k ops)
ANSWER_SECONDS_PER_OP = 1e-5


@dataclass(frozen=True)
class _Call:
    """What the stages before the search settle, and every answer of the call reports."""

    problem: Problem
    solver: str
    objective: str
    began: float  # `time.perf_counter()`: the wall time the call reports (`solve_time_s`)
    started: float  # `interrupt.now()`: where its shares are counted from
    deadline: float  # of the whole call (`interrupt.now()`)
    warm: tuple[str, Simulation] | None
    bounds: LowerBounds  # on the objective: `lower_bounds` on the makespan, `span_bounds` on the span

    @property
    def independent_bound(self) -> float:
        return self.bounds.best

    @property
    def binding_text(self) -> str:
        """The binding bound's name, with the devices it reasons about: "device_sequencing on device 7"."""
        return self.bounds.binding_bound.describe()

    @property
    def warm_simulation(self) -> Simulation | None:
        return None if self.warm is None else self.warm[1]

    def result(self, simulation: Simulation | None, status: str, lower: float, decided_by: str | None,
               resolution: float | None = None, *, warm_kept: bool = False) -> SolveResult:
        """The answer, its schedule named for what it is: the warm start's heuristic where the answer
        is the warm start (`warm_kept`; say, `block-v-zb` proven optimal by a bound, no model
        searched), else the solver's; the same name in every table, chart and trace."""
        value = None if simulation is None else objective_value(simulation, self.objective)
        if simulation is not None:
            name = self.warm[0] if warm_kept and self.warm is not None else self.solver
            simulation = replace(simulation, schedule=simulation.schedule.renamed(name))
        return SolveResult(status=status, simulation=simulation, objective=value, lower_bound=lower,
                           solver=self.solver, objective_kind=objective_name(self.problem, self.objective),
                           solve_time_s=time.perf_counter() - self.began,
                           warm_start=None if self.warm is None else self.warm[0], resolution=resolution,
                           decided_by=decided_by, bounds=self.bounds.as_dict(), binding_bound=self.bounds.binding,
                           binding_devices=self.bounds.binding_bound.devices, bounds_complete=self.bounds.complete,
                           bound_seconds={bound.name: bound.seconds for bound in self.bounds.bounds})


def solve(problem: Problem, solver: str = "cpsat", *, time_limit: float | interrupt.Clock = 60.0,
          objective: str = "makespan", warm_start: str | Schedule | Simulation | list | None = None,
          use_warm_start: bool = True, lower_peak: bool = True, workers: int = 2,
          seed: int = 0, progress: bool = False, order: Order = None, deterministic: bool = False,
          **options) -> SolveResult:
    """The schedule with the smallest makespan (or longest device span) within the memory limit,
    with its status, lower bound and gap.

    Parameters
    ----------
    solver : "cpsat" (OR-Tools CP-SAT: the full model, `zbopt.solvers.full_model`; on large
        problems, unless it proved its answer by half time, then LNS from its best,
        `zbopt.solvers.cpsat`), "cbc" / "highs" (the disjunctive MILP through PuLP,
        `zbopt.solvers.milp`) or "lns" (large-neighbourhood search from the warm start,
        `zbopt.solvers.lns`).
    time_limit : seconds for the whole call, or a `zbopt.core.interrupt.Clock` its caller already
        counts; shared by stages: the heuristics (no further one
        starts after HEURISTICS_SHARE of it, once one is valid), the lower bounds (cut after
        BOUNDS_SHARE of what is left; `bounds_complete` says so), then the search and the second
        phase, whose deadline comes early enough for the backend to stop (`Backend.stop_s`) and
        for the answer's re-simulation (ANSWER_SECONDS_PER_OP); a backend still busy at the
        limit (say, building a model too large) is stopped and left behind (its thread ends on
        its own), and the best schedule so far is the answer.
    objective : "makespan" or "span" (the Zero Bubble paper's longest per-device span).
    warm_start : a registered heuristic to start from, or a schedule (or its simulation) the
        caller has; None: the best valid heuristic (at equal objective, the one with less peak
        memory); a list of schedules or simulations: the best of them and of the heuristics.
    use_warm_start : hint the model with the warm start and cap its horizon with it.
    order : the warm start's heuristics with their microbatches entering in this order (a sorting
        rule, "longest-first" say, or a permutation); the search itself is free to reorder.
    lower_peak : after the search, spend at most as long again as the call took so far (at least
        1 s, within the time limit) lowering the highest peak memory while keeping the objective
        (CP-SAT only; skipped when less time than that is left).
    workers, seed : solver threads and random seed; one worker and a seed repeat exactly.
    deterministic : two calls give the same answer, bound and status: `time_limit` is then a budget
        of work, CP-SAT's deterministic time at `interrupt.WORK_PER_SECOND` per second (on 2 cores
        about the wall time; not a wall-clock limit), its searches run on one worker, and no wall
        clock decides anything (`interrupt.metered`); only the reported times differ. CP-SAT and
        LNS only: the MILP solvers' limits are wall-clock.
    progress : a live line on stderr (incumbent, bound, gap, elapsed time), redrawn twice a second.
    options : the backend's own options (CP-SAT: memory_model, symmetry_breaking, lns_share, pair_window).

    Returns
    -------
    SolveResult, its schedule re-simulated; never worse than the warm start.

    Raises
    ------
    zbopt.core.interrupt.Interrupted (a KeyboardInterrupt) on Ctrl-C, once the stage under way has
    stopped (in the main thread: see `zbopt.core.interrupt`); its `partial` is the SolveResult of the
    best schedule so far, with its status and bound as at the stop (a second Ctrl-C: at once).

    >>> from zbopt import Problem
    >>> result = solve(Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2), time_limit=10)
    >>> result.status, result.objective
    ('optimal', 9.0)
    """
    backend, clock = _backend(problem, solver, objective, interrupt.as_clock(time_limit, "solve", deterministic),
                              workers, options)
    with interrupt.stoppable(), interrupt.metered(clock):
        result = _solved(problem, solver, backend, clock, objective,
                         (warm_start, order), use_warm_start, lower_peak, workers, seed, progress, options)
        if interrupt.requested.is_set():
            raise interrupt.Interrupted(result)
    return result


def _solved(problem: Problem, solver: str, backend: Backend, clock: interrupt.Clock, objective: str,
            warm_start: tuple, use_warm_start: bool, lower_peak: bool, workers: int, seed: int,
            progress: bool, options: dict) -> SolveResult:
    """`solve`'s stages, each cut short by Ctrl-C (`interrupt.past`): the heuristics, the bounds, the search."""
    began, started, deadline = time.perf_counter(), interrupt.now(), clock.deadline
    time_limit = clock.left()
    # the stages share the limit: heuristics, then bounds, each up to a share; the search gets the rest
    warm = None
    if use_warm_start:
        given, order = warm_start
        warm = warm_start_simulation(problem, given, objective, started + HEURISTICS_SHARE * time_limit,
                                     started + HEURISTICS_CUTOFF * time_limit, order, deadline)
    bounded = lower_bounds if objective == "makespan" else span_bounds
    bounds = bounded(problem, interrupt.now() + BOUNDS_SHARE * max(0.0, deadline - interrupt.now()))
    call = _Call(problem, solver, objective, began, started, deadline, warm, bounds)
    if warm is not None and meets(objective_value(warm[1], objective), call.independent_bound):
        # no model is built: the warm start is proven optimal by the bound alone
        simulation = without_needless_mechanisms(problem, warm[1], objective, deadline)
        return call.result(simulation, "optimal", objective_value(simulation, objective),
                           f"lower bound ({call.binding_text})", warm_kept=True)
    return _search(call, backend, options, workers, seed, progress, lower_peak)


def _backend(problem: Problem, solver: str, objective: str, clock: interrupt.Clock, workers: int,
             options: dict) -> tuple[Backend, interrupt.Clock]:
    """The backend and the call's clock, once the arguments, its refusal and its options are checked."""
    if solver not in BACKENDS:
        raise ZboptError(f"unknown solver '{solver}' (known: {', '.join(SOLVERS)})")
    if objective not in OBJECTIVES:
        raise ZboptError(f"unknown objective '{objective}' (known: {', '.join(OBJECTIVES)})")
    if clock.meter is not None and solver in ("cbc", "highs"):
        raise ZboptError(f"solver '{solver}' with deterministic=True (--deterministic): its time limit is "
                         "wall-clock; use cpsat or lns")
    if workers < 1:
        raise ZboptError(f"workers {workers}: must be at least 1")
    backend = BACKENDS[solver]
    refusal = backend.refusal(problem)
    if refusal:
        raise ZboptError(f"solver '{solver}': {refusal}")
    try:  # an option the backend does not take, refused before any work (not only when a model is built)
        inspect.signature(backend.search).bind(None, None, **options)
    except TypeError as error:
        raise ZboptError(f"solver '{solver}': {error}") from None
    return backend, clock


def search_deadline(call: _Call, backend: Backend) -> float:
    """The backend's deadline: the call's, less the time it may take to stop and the driver to
    re-simulate its answer, so that the whole call ends within its limit; under a metered clock
    the call's own (stopping and re-simulating count no work)."""
    if interrupt.deterministic():
        return call.deadline
    return call.deadline - backend.stop_s - ANSWER_SECONDS_PER_OP * call.problem.num_ops


def _search(call: _Call, backend: Backend, options: dict, workers: int, seed: int, progress: bool,
            lower_peak: bool) -> SolveResult:
    """The search stage and what follows it: the backend's answer re-simulated, judged against the
    warm start and the bounds, then (`lower_peak`) the second phase."""
    problem, objective, search, warm = call.problem, call.objective, backend.search, call.warm_simulation
    live = _LiveLine(call.began, call.independent_bound, None if warm is None else objective_value(warm, objective)) \
        if progress else None
    task = SearchTask(objective, warm, call.independent_bound, search_deadline(call, backend),
                      workers, seed, report=live.update if live else ignore)
    found = Found("unknown", None, 0.0, None, None)  # Ctrl-C before the search: the warm start stands
    if not interrupt.requested.is_set():
        found = _run_stoppable(search, problem, task, options, live, _abandon_at(call.deadline))
    simulation = simulated_answer(problem, found, objective, call.solver)
    if simulation is None and warm is None:
        proved = "solver" if found.status == "infeasible" else None
        return call.result(None, found.status, max(call.independent_bound, found.bound), proved, found.resolution)
    if simulation is not None:
        simulation = without_needless_mechanisms(problem, simulation, objective, call.deadline)
    status, simulation, lower, decided_by = _verdict(found, simulation, call.warm, objective, call.independent_bound,
                                                     call.binding_text)
    if lower_peak and not task.stopped.is_set() and not interrupt.requested.is_set():
        simulation = _lower_peak(search, task, options, simulation, call)
    return call.result(simulation, status, lower, decided_by, found.resolution,
                       warm_kept=warm is not None and simulation is warm)


def _run_stoppable(search, problem: Problem, task: SearchTask, options: dict, live: _LiveLine | None,
                   abandon_at: float) -> Found:
    """Run the backend in a worker thread while this thread redraws the live line and polls for
    Ctrl-C (`interrupt.requested`): then it sets `task.stopped` and calls the stop hooks the
    backend registered, and the backend returns its best so far. A backend still busy at
    `abandon_at`, or STOP_GRACE_S after Ctrl-C (say, building a model too large), is stopped and
    left behind: the answer is the incumbent it kept (`SearchTask.kept`), if any. A
    KeyboardInterrupt here (a second Ctrl-C from Python) stops the backend on its way out."""
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

    def stop() -> None:
        task.stopped.set()
        for hook in stops:
            hook()

    # the backend reads the caller's meter (`interrupt.metered`) through a copy of its context
    threading.Thread(target=contextvars.copy_context().run, args=(work,), name="zbopt-search", daemon=True).start()
    drawn = time.perf_counter()
    try:
        while not done.wait(max(0.0, min(interrupt.POLL_S, abandon_at - time.perf_counter()))):
            if interrupt.requested.is_set() and not task.stopped.is_set():
                stop()
                abandon_at = min(abandon_at, time.perf_counter() + STOP_GRACE_S)
            if time.perf_counter() >= abandon_at:
                stop()  # its best so far, if it kept one (a CP-SAT incumbent), nothing proven
                interrupt.left_running(done)
                return task.kept.get("incumbent") or Found("unknown", None, 0.0, None, None)
            if live is not None and time.perf_counter() - drawn >= LIVE_LINE_PERIOD_S:
                live.draw()
                drawn = time.perf_counter()
    except KeyboardInterrupt:
        stop()
        interrupt.left_running(done)
        raise
    finally:
        if live is not None:
            live.close()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["found"]


def _abandon_at(deadline: float) -> float:
    """When `_run_stoppable` leaves a backend behind (`time.perf_counter()`): at the call's
    deadline; never under a metered clock, where the backend stops on the work it did and no
    wall clock decides."""
    return math.inf if interrupt.deterministic() else deadline


def _verdict(found: Found, simulation: Simulation | None, warm: tuple[str, Simulation] | None, objective: str,
             independent_bound: float, binding: str) -> tuple[str, Simulation, float, str | None]:
    """(status, simulation, lower bound, what decided) of a search: the warm start when it is
    better; the objective as its own bound when the backend proved it for the problem's own costs;
    "optimal" exactly when the objective meets the lower bound (the one rule), else "feasible".
    A model leaving out a slowdown (`compute_slowed`) still bounds: every schedule, its starts kept,
    is one of its (ops end no later; a device's reductions get ready in its compute lane's order)."""
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
    elif found.status == "optimal" and not compute_slowed(simulation.problem):
        decided_by = (f"proven optimal at the model's tick resolution {found.resolution:g}; rounded costs leave "
                      f"a gap of at most {relative_gap(value, lower):.4%}")
    status, lower = settle(value, lower, tolerance)
    return status, simulation, lower, decided_by


def _lower_peak(search, task: SearchTask, options: dict, simulation: Simulation, call: _Call) -> Simulation:
    """The second phase: the same objective, less peak memory, if the backend finds it within at
    most as long again as the call took so far (at least 1 s). Skipped when less time is left than
    that: its model costs about as much to build as the first one."""
    value = objective_value(simulation, task.objective)
    elapsed = interrupt.now() - call.started
    budget = min(task.remaining(), max(interrupt.span(1.0), elapsed))
    if task.remaining() < elapsed or budget <= 0.05:
        return simulation
    phase = replace(task, warm=simulation, peak_cap=value, deadline=interrupt.now() + budget,
                    report=ignore, stopped=task.stopped, kept={})  # not the first phase's incumbent
    found = _run_stoppable(search, call.problem, phase, options, None, _abandon_at(call.deadline))
    leaner = simulated_answer(call.problem, found, task.objective, call.solver)
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
