"""Every chosen schedule (and optionally the optimizer's answer) on one problem, side by side.

The CLI's `zbopt compare`, the HTML report and notebooks all build their rows here, so a number in
any of them is the simulator's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zbopt.core import interrupt
from zbopt.core.errors import NotApplicableError, ZboptError
from zbopt.core.interrupt import Clock, Interrupted, as_clock
from zbopt.core.problem import Problem
from zbopt.core.problem.order import ORDER_RULES, entry_order
from zbopt.core.simulation import Simulation, simulate
from zbopt.core.tolerance import RELATIVE_TOLERANCE
from zbopt.core.wiring import Shown, dataframe
from zbopt.schedules import TORCH_PREFIX, get, named_schedule, registered
from zbopt.schedules.ordering import Order
from zbopt.schedules.reductions import reductions_in_turn
from zbopt.schedules.regathers import PLACES, regathered
from zbopt.solvers import SolveResult, lower_bounds, solve
from zbopt.solvers.api import HEURISTICS_CUTOFF, HEURISTICS_SHARE
from zbopt.solvers.gap import gap_text, relative_gap
from zbopt.solvers.warm import best_of

__all__ = ["BOUNDS_S", "COLUMNS", "NO_BOUNDS", "OPTIMAL_ROW", "Comparison", "ComparisonRow", "columns", "compare",
           "row_order", "simulated_in_time"]

OPTIMAL_ROW = "cpsat"
BOUNDS_S = 5.0  # the independent bounds' time in a comparison without the optimizer
NO_BOUNDS = "none: bounds=False (--no-bounds) skips them"  # the source of a comparison without bounds
COLUMNS = {"name": "schedule", "status": "status", "makespan": "makespan", "bubble_rate": "bubble rate",
           "zb_bubble_rate": "ZB bubble rate", "peak_memory": "peak memory", "binding_device": "binds",
           "within_memory_limit": "within limit", "gap": "gap"}  # row key -> column title, in the table's order


@dataclass(frozen=True)
class ComparisonRow:
    """One schedule's metrics; `status` is the solver's ("optimal", "feasible") on the optimizer's
    row and None on a heuristic's. `gap` is measured against the comparison's lower bound, which
    holds for schedules within the memory limit: a row over the limit can have a negative gap; both
    are None when the comparison skipped its bounds."""

    name: str
    simulation: Simulation
    lower_bound: float | None
    status: str | None = None

    @property
    def makespan(self) -> float:
        return self.simulation.makespan

    @property
    def iteration_time(self) -> float:
        """Until every device's optimizer step has ended (the makespan without the iteration's ends)."""
        return self.simulation.iteration_time

    @property
    def bubble_rate(self) -> float:
        return self.simulation.bubble_rate

    @property
    def zb_bubble_rate(self) -> float:
        return self.simulation.zb_bubble_rate

    @property
    def peak_memory(self) -> float:
        """The highest peak over all devices."""
        return max(self.simulation.peak_memory)

    @property
    def binding_device(self) -> int:
        """The device whose memory binds: the one with the least room under its own limit (per-device
        limits differ, so the highest peak need not bind), or without a limit the highest peak; the
        lowest index on a tie."""
        peaks, limit = self.simulation.peak_memory, self.simulation.problem.memory_limit
        room = [-peak if limit is None else limit[device] - peak for device, peak in enumerate(peaks)]
        return min(range(len(room)), key=room.__getitem__)

    @property
    def within_memory_limit(self) -> bool:
        return self.simulation.valid

    @property
    def gap(self) -> float | None:
        return None if self.lower_bound is None else relative_gap(self.iteration_time, self.lower_bound)

    def cells(self) -> dict[str, str]:
        """The row as table text, one cell per `columns` key (the iteration time only where the
        problem has the iteration's ends), so the terminal and the report agree."""
        texts = {"name": self.name, "status": self.status or "-", "makespan": f"{self.makespan:.6g}",
                 "iteration_time": f"{self.iteration_time:.6g}",
                 "bubble_rate": f"{self.bubble_rate:.4f}", "zb_bubble_rate": f"{self.zb_bubble_rate:.4f}",
                 "peak_memory": f"{self.peak_memory:g}", "binding_device": self._binding_text(),
                 "within_memory_limit": "yes" if self.within_memory_limit else "no",
                 "gap": "no bound" if self.lower_bound is None else gap_text(self.gap)}
        return {key: texts[key] for key in columns(self.simulation.problem)}

    def _binding_text(self) -> str:
        """"device 3", and under a limit that device's peak against its own limit: "device 0: 33.2 of 33.1"."""
        device, limit = self.binding_device, self.simulation.problem.memory_limit
        text = f"device {device}"
        return text if limit is None else f"{text}: {self.simulation.peak_memory[device]:g} of {limit[device]:g}"

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "makespan": self.makespan,
                "iteration_time": self.iteration_time, "bubble_rate": self.bubble_rate,
                "zb_bubble_rate": self.zb_bubble_rate,
                "peak_memory": self.peak_memory, "binding_device": self.binding_device,
                "peak_memory_per_device": [float(peak) for peak in self.simulation.peak_memory],
                "within_memory_limit": self.within_memory_limit, "lower_bound": self.lower_bound, "gap": self.gap,
                **self._order()}

    def _order(self) -> dict:
        """{"order": the microbatches in the order they enter} where they differ; else nothing."""
        problem = self.simulation.problem
        return {} if problem.microbatches_equal else {"order": list(entry_order(problem, self.simulation.schedule))}


@dataclass(frozen=True)
class Comparison(Shown):
    """The rows (see `row_order`), the lower bound they are measured against (None: skipped) and
    where it came from, the schedules left out because they do not apply (name, reason), the solver's full
    answer when it ran (its row is missing when it found no schedule in time), and the schedules not
    built within the heuristics' share of the time limit (`not_run`)."""

    problem: Problem
    rows: tuple[ComparisonRow, ...]
    lower_bound: float | None
    lower_bound_source: str
    not_applicable: tuple[tuple[str, str], ...] = ()
    solve_result: SolveResult | None = None
    not_run: tuple[str, ...] = ()

    @property
    def best_within_limit(self) -> ComparisonRow | None:
        """The fastest row within the memory limit (the first, by `row_order`), or None."""
        return next((row for row in self.rows if row.within_memory_limit), None)

    def to_dicts(self) -> list[dict]:
        return [row.to_dict() for row in self.rows]

    def to_dataframe(self):
        """`to_dicts` as a pandas DataFrame (pandas is optional)."""
        return dataframe(self.to_dicts())


def row_order(row: ComparisonRow) -> tuple[bool, float, float]:
    """The rows' order in the table, the report and the JSON: those within the memory limit by
    iteration time (the makespan, where the problem has no iteration's ends; the makespan breaks a
    tie), then those over it alike (a faster schedule that breaks the limit is no answer, so it
    does not top the table)."""
    return not row.within_memory_limit, row.iteration_time, row.makespan


def columns(problem: Problem) -> dict[str, str]:
    """The comparison table's columns (row key -> title): COLUMNS, with the iteration time after the
    makespan where the problem has the iteration's ends."""
    if problem.iteration_ends is None:
        return COLUMNS
    items, after = list(COLUMNS.items()), list(COLUMNS).index("makespan") + 1
    return dict([*items[:after], ("iteration_time", "iteration"), *items[after:]])


def compare(problem: Problem, schedules: Sequence[str] | None = None, *, optimal: bool = False,
            time_limit: float | Clock = 60.0, workers: int = 2, progress: bool = False, bounds: bool = True,
            order: Order = None, deterministic: bool = False) -> Comparison:
    """Every chosen schedule, and optionally the optimum, on one problem, measured alike.

    Parameters
    ----------
    problem : the problem every row runs on.
    schedules : the schedules to simulate (default: every registered one that applies to
        `problem`; "torch:NAME" is torch's built-in NAME, see `zbopt.schedules.torch_builtin`).
    optimal : add the solver's answer (`solve`), started from the best row.
    time_limit : with `optimal`, seconds for the whole call (or a `Clock` the caller counts): the
        schedules get HEURISTICS_SHARE of it (none starts later once one is valid; those left are
        `not_run`), the solver the rest.
    workers : the solver's threads.
    progress : a live line on stderr while the solver runs.
    bounds : False skips the lower bounds (up to BOUNDS_S a problem, where simulating takes
        hundredths of a second: for sweeps over many problems); no bound and no gaps (None) then.
    order : every schedule's microbatches enter in this order (`generate`). Left None on a problem
        whose microbatches differ, each schedule has its row in the given order and, where one of
        the other rules (`ORDER_RULES`) gives a shorter schedule (within the memory limit first), a
        row "NAME (RULE order)" for the best of them: the order's worth per heuristic.
    deterministic : two calls give the same table (`solve`'s `deterministic`: the time limit a
        budget of work, no wall clock deciding what runs); only the reported times differ.

    Returns
    -------
    Comparison : the rows, best first (within the memory limit first), the lower bound and what
        proved it, the schedules that did not apply with their reasons.

    Raises
    ------
    UnknownScheduleError : for an unknown name.
    NotApplicableError : naming a requested schedule whose preconditions do not hold.
    ZboptError : for `optimal` without `bounds` (the solver certifies with them).
    zbopt.core.interrupt.Interrupted : on Ctrl-C during the solve, with the Comparison of the rows
        so far (the solver's best schedule among them).

    Examples
    --------
    With a fused backward of twice the forward, 1F1B and GPipe both take (m + p - 1)(F + BW):

    >>> from zbopt import Problem
    >>> problem = Problem(num_devices=2, num_microbatches=4, forward_times=1, backward_times=2)
    >>> [(row.name, row.makespan) for row in compare(problem, ["1f1b", "gpipe"]).rows]
    [('1f1b', 15.0), ('gpipe', 15.0)]
    """
    if optimal and not bounds:
        raise ZboptError("bounds=False (--no-bounds) with optimal=True (--optimal): the optimizer certifies its "
                         "answer with the lower bounds; give one of the two")
    clock = as_clock(time_limit, "compare", deterministic) if optimal or deterministic else None
    with interrupt.metered(clock):
        return _compared(problem, schedules, optimal, clock, workers, progress, bounds, order)


def _compared(problem: Problem, schedules: Sequence[str] | None, optimal: bool, clock: Clock | None, workers: int,
              progress: bool, bounds: bool, order: Order) -> Comparison:
    """`compare`'s work, its clock (with `optimal` or `deterministic`) read through `interrupt.metered`."""
    deadline, cutoff = (math.inf, math.inf) if not optimal else \
        (clock.share("heuristics", HEURISTICS_SHARE).deadline, clock.share("a first row", HEURISTICS_CUTOFF).deadline)
    simulations, not_applicable, not_run = _simulate_schedules(problem, schedules, order, deadline, cutoff)
    if order is None and not problem.microbatches_equal and problem.sequence_slices == 1:  # slices keep theirs
        simulations += _best_orders(problem, simulations, deadline)
    simulations += _reductions_in_turn(problem, simulations, deadline)
    simulations += _regathered(problem, simulations, deadline)
    stop = None
    if optimal:
        best = best_of(simulation for _, simulation, _ in simulations if simulation.valid)
        # from the best row (with the heuristics where the rows are not every one's): never behind a row
        warm = [best] if best is not None and schedules is not None else best
        try:
            result = solve(problem, "cpsat", time_limit=clock, workers=workers, progress=progress, warm_start=warm,
                           deterministic=clock.meter is not None)
        except Interrupted as interruption:  # the table with the solver's best so far, then the interruption
            result, stop = interruption.partial, interruption
        lower_bound, source = result.lower_bound, _proved_by(result)
        if result.simulation is not None:
            simulations.append((OPTIMAL_ROW, result.simulation, result.status))
    elif not bounds:
        result, lower_bound, source = None, None, NO_BOUNDS
    else:
        result = None
        # without --optimal the bounds stay quick: the v >= 2 relaxations get BOUNDS_S in all
        bounds = lower_bounds(problem, interrupt.now() + interrupt.span(BOUNDS_S))
        lower_bound, source = bounds.best, bounds.binding_bound.describe()
    rows = [ComparisonRow(name, simulation, lower_bound, status) for name, simulation, status in simulations]
    rows.sort(key=row_order)
    comparison = Comparison(problem, tuple(rows), lower_bound, source, tuple(not_applicable), result, tuple(not_run))
    if stop is not None:
        raise Interrupted(comparison)
    return comparison


def _proved_by(result: SolveResult) -> str:
    """What proved the solve's lower bound: the search's own bound where it is above the independent
    ones, else the binding independent bound and the devices it reasons about."""
    independent = (result.bounds or {}).get("best", 0.0)
    if result.lower_bound > independent * (1 + RELATIVE_TOLERANCE) + RELATIVE_TOLERANCE:
        return f"the {result.solver} search's own bound"
    devices = result.binding_devices
    where = f" on device{'s' * (len(devices) > 1)} {', '.join(map(str, devices))}" if devices else ""
    return f"{result.binding_bound}{where}"


def _best_orders(problem: Problem, simulations: list, deadline: float = math.inf) -> list:
    """[("NAME (RULE order)", simulation, None)] per schedule of `simulations` (in the given order)
    that another order rule makes shorter: the best rule's, within the memory limit first; none
    started after `deadline` (they are the order's worth, not rows anyone asked for)."""
    rows = []
    for name, given, _ in simulations:
        best = (not given.valid, given.iteration_time * (1 - RELATIVE_TOLERANCE), None, None)  # shorter, not a rounding
        for rule in ORDER_RULES[1:]:
            if interrupt.past(deadline):
                return rows
            try:
                with interrupt.deadline_scope(deadline):
                    simulation = simulate(problem, named_schedule(name, problem, rule))
            except (NotApplicableError, interrupt.TimeUp):  # a greedy no candidate of fits in this order
                continue
            best = min(best, (not simulation.valid, simulation.iteration_time, rule, simulation),
                       key=lambda item: item[:2])
        if best[2] is not None:
            rows.append((f"{name} ({best[2]} order)", best[3], None))
    return rows


def _reductions_in_turn(problem: Problem, simulations: list, deadline: float = math.inf) -> list:
    """[("NAME (reductions in turn)", simulation, None)] per row whose trailing W regrouped by stage
    (`schedules.reductions.reductions_in_turn`) give a shorter iteration: the variant's worth; none
    started after `deadline`."""
    rows = []
    for name, given, _ in simulations:
        if interrupt.past(deadline):
            return rows
        variant = reductions_in_turn(problem, given.schedule)
        if variant is None:
            continue
        simulation = simulate(problem, variant)
        shorter = simulation.iteration_time < given.iteration_time * (1 - RELATIVE_TOLERANCE)
        if simulation.valid >= given.valid and shorter:
            rows.append((f"{name} (reductions in turn)", simulation, None))
    return rows


def _regathered(problem: Problem, simulations: list, deadline: float = math.inf) -> list:
    """[("NAME (re-gathered)", simulation, None)] per row that FSDP's reshard after forward
    (`schedules.regathers.regathered`, the better of its places) brings within the memory limit
    or, within it, to a shorter iteration: the variant's worth; none started after `deadline`."""
    rows = []
    for name, given, _ in simulations:
        best = (not given.valid, given.iteration_time * (1 - RELATIVE_TOLERANCE), None)  # better, not a rounding
        for place in PLACES:
            if interrupt.past(deadline):
                return rows
            variant = regathered(problem, given.schedule, place)
            simulation = None if variant is None else simulate(problem, variant)
            if simulation is not None and simulation.valid:
                best = min(best, (False, simulation.iteration_time, simulation), key=lambda item: item[:2])
        if best[2] is not None:
            rows.append((f"{name} (re-gathered)", best[2], None))
    return rows


def _simulate_schedules(problem: Problem, names: Sequence[str] | None, order: Order, deadline: float,
                        cutoff: float) -> tuple[list, list, list]:
    """[(name, simulation, None)] for the requested schedules (every registered one when None) in
    `order`, [(name, reason)] for the registered ones skipped because they do not apply (a requested
    one that does not apply is an error), and the names not built in time (`simulated_in_time`)."""
    if names is not None:
        names = list(dict.fromkeys(names))
        for name in names:
            if not name.startswith(TORCH_PREFIX):
                get(name)  # an unknown name fails before any work
    reasons: dict[str, str] = {}
    late: list[str] = []
    built = simulated_in_time(problem, [entry.name for entry in registered()] if names is None else names,
                              order=order, deadline=deadline, cutoff=cutoff,
                              reasons=reasons if names is None else None, late=late)
    return [(name, simulation, None) for name, simulation in built.items()], list(reasons.items()), late


def simulated_in_time(problem: Problem, names: Sequence[str], *, order: Order = None, deadline: float = math.inf,
                      cutoff: float = math.inf, reasons: dict[str, str] | None = None,
                      late: list[str] | None = None) -> dict[str, Simulation]:
    """The schedules `names` ("torch:NAME" too) built for `problem` in `order` and simulated, in
    their order: those built by `deadline`, or while none is valid yet by `cutoff` (a table with no
    valid row has no answer, and at m in the thousands one schedule takes seconds); none starts
    after it, and the names left for time go into `late`. One that does not apply goes into
    `reasons` (name -> why), or where `reasons` is None is a NotApplicableError naming it."""
    built: dict[str, Simulation] = {}
    for index, name in enumerate(names):
        valid = any(simulation.valid for simulation in built.values())
        if interrupt.past(cutoff) or (valid and interrupt.past(deadline)):
            if late is not None:
                late.extend(names[index:])
            break
        try:
            with interrupt.deadline_scope(deadline if valid else cutoff):
                built[name] = simulate(problem, named_schedule(name, problem, order))
        except NotApplicableError as error:
            if reasons is None:
                raise NotApplicableError(f"schedule '{name}' does not apply to this problem: {error}") from None
            reasons[name] = str(error)
        except interrupt.TimeUp:
            if late is not None:
                late.append(name)
    return built
