"""What every solver shares: integer ticks, the warm start, and the verified result."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from zbopt.errors import ZboptError
from zbopt.ops import Op, device_work
from zbopt.problem import OFFLOAD, RECOMPUTE, RELOAD, Problem
from zbopt.schedule import Schedule
from zbopt.schedules import applicable, generate
from zbopt.shown import Shown
from zbopt.simulation import Simulation, simulate
from zbopt.solvers.bounds import LowerBounds, pair_relaxed
from zbopt.tolerance import RELATIVE_TOLERANCE

OBJECTIVES = ("makespan", "span")


@dataclass(frozen=True)
class SolveResult(Shown):
    """A solver's answer, re-verified by the simulator.

    status: optimal (the objective meets the lower bound), feasible (a schedule, gap > 0),
        infeasible, unknown (no schedule).
    objective: the schedule's makespan (or longest device span), from the simulator.
    lower_bound: the best of the independent bounds and the solver's own bound.
    gap: (objective - lower_bound) / objective; 0 exactly when the status is optimal.
    resolution: one time unit of the solver's model in the problem's units (None when no model
        was built); decided_by: what proved the status (the solver, which lower bound, or the
        model's resolution when rounding keeps the proof from the problem's own costs).
    bounds: every independent lower bound; binding_bound: the name of the largest;
        bounds_complete: False when the time limit cut some of them short.
    """

    status: str
    simulation: Simulation | None
    objective: float | None
    lower_bound: float
    solver: str
    objective_kind: str
    solve_time_s: float
    warm_start: str | None
    resolution: float | None = None
    decided_by: str | None = None
    bounds: dict = field(default_factory=dict)
    binding_bound: str | None = None
    bounds_complete: bool = True

    @property
    def schedule(self) -> Schedule | None:
        return None if self.simulation is None else self.simulation.timed_orders()

    @property
    def gap(self) -> float | None:
        return relative_gap(self.objective, self.lower_bound)

    def to_dict(self) -> dict:
        data = self.simulation.to_dict() if self.simulation is not None else {}
        data.update(status=self.status, objective=self.objective_kind, objective_value=self.objective,
                    lower_bound=self.lower_bound, gap=self.gap, solve_time_s=self.solve_time_s, solver=self.solver,
                    warm_start=self.warm_start, resolution=self.resolution, decided_by=self.decided_by,
                    bounds=self.bounds, binding_bound=self.binding_bound, bounds_complete=self.bounds_complete)
        return data

    def to_dataframe(self):
        """Its schedule's devices (`Simulation.to_dataframe`); pandas is optional."""
        if self.simulation is None:
            raise ZboptError(f"the solver found no schedule ({self.status}): nothing to tabulate")
        return self.simulation.to_dataframe()




def relative_gap(value: float | None, lower_bound: float) -> float | None:
    """The one gap formula: (value - lower_bound) / value; None without a positive value; 0 where
    the value is within `optimality_tolerance` of the bound (either side), so float noise in a sum
    never shows as a gap. Negative only for a schedule the bound does not hold for (one over the memory
    limit).

    >>> relative_gap(424.9289999999999, 424.929), relative_gap(5.0, 4.0)
    (0.0, 0.2)
    """
    if value is None or value <= 0:
        return None
    if abs(value - lower_bound) <= optimality_tolerance(lower_bound):
        return 0.0
    return (value - lower_bound) / value


def gap_text(gap: float | None) -> str:
    """A gap for people: "n/a" without one, else percent with two decimals, and more digits where a
    gap that is not zero would print as 0.00% (so "feasible" never shows a zero gap).

    >>> gap_text(0.0123), gap_text(2.5e-7), gap_text(0.0), gap_text(None)
    ('1.23%', '2.5e-05%', '0.00%', 'n/a')
    """
    if gap is None:
        return "n/a"
    text = f"{gap:.2%}"
    return f"{gap * 100:.1e}%" if gap != 0 and text.lstrip("-") == "0.00%" else text


def optimality_tolerance(bound: float) -> float:
    """How close a value must come to a lower bound to count as meeting it: the simulator's own
    relative tolerance, so that "optimal" means the same wherever it is decided."""
    return RELATIVE_TOLERANCE * max(1.0, abs(bound))


def meets(value: float, lower_bound: float, tolerance: float | None = None) -> bool:
    """The one rule for "optimal": a schedule's value meets a lower bound on every schedule."""
    return value <= lower_bound + (optimality_tolerance(lower_bound) if tolerance is None else tolerance)


def settle(value: float, lower_bound: float, tolerance: float | None = None) -> tuple[str, float]:
    """(status, lower bound) of a schedule's value against a bound: "optimal" with the value as its
    own bound when they meet, else "feasible" with the bound, never above the value (rounding)."""
    if meets(value, lower_bound, tolerance):
        return "optimal", value
    return "feasible", min(lower_bound, value)


def objective_bound(problem: Problem, bounds: LowerBounds, kind: str) -> tuple[float, str]:
    """The independent lower bound on the objective and its name: the best makespan bound, or for
    the span objective the busiest device's own work, "device_work" (the others speak of the
    makespan only)."""
    return (bounds.best, bounds.binding) if kind == "makespan" else \
        (max(device_work(pair_relaxed(problem))), "device_work")


def objective_value(simulation: Simulation, kind: str) -> float:
    """The makespan, or the longest per-device span (the Zero Bubble paper's objective)."""
    return simulation.makespan if kind == "makespan" else max(simulation.span)


def best_heuristic(problem: Problem, kind: str = "makespan",
                   deadline: float = math.inf) -> tuple[str, Simulation] | None:
    """The registered heuristic with the best objective among those valid under the memory limit;
    at equal objective, the one with the lower highest peak memory (1f1b before gpipe). Without a
    limit, none that recomputes or offloads: that only adds work or traffic, and lowers a peak the
    model (which then has no such choice) cannot match. Past `deadline` (`time.perf_counter()`) no
    further heuristic is tried once one is valid."""
    best: tuple[str, Simulation] | None = None
    for name, schedule in applicable(problem):
        result = simulate(problem, schedule)
        needless = not problem.mechanisms_matter and (result.table.recomputed or result.table.offloaded)
        if result.valid and not needless and (best is None or _preferred(result, best[1], kind)):
            best = (name, result)
        if best is not None and time.perf_counter() > deadline:
            break
    return best


def _preferred(simulation: Simulation, other: Simulation, kind: str) -> bool:
    """Whether `simulation` beats `other`: a better objective, or one as good (within the
    optimality tolerance) with a lower highest peak memory."""
    value, other_value = objective_value(simulation, kind), objective_value(other, kind)
    if not meets(other_value, value):
        return True
    return meets(value, other_value) and max(simulation.peak_memory) < max(other.peak_memory)


def warm_start_simulation(problem: Problem, warm_start: str | None, kind: str,
                          deadline: float = math.inf) -> tuple[str, Simulation] | None:
    """The named heuristic's simulation (an error if it breaks the memory limit), or the best one
    (see `best_heuristic` for the deadline)."""
    if warm_start is None:
        return best_heuristic(problem, kind, deadline)
    result = simulate(problem, generate(warm_start, problem))
    if not result.valid:
        raise ZboptError(f"warm start '{warm_start}' breaks the memory limit: {result.violations[0]}")
    return warm_start, result


def start_times(simulation: Simulation) -> dict[Op, float]:
    """The start of every op of a simulated schedule, by op (a warm start handed to a model)."""
    return dict(zip(simulation.table.ops(), simulation.start.tolist(), strict=True))


def without_needless_mechanisms(problem: Problem, simulation: Simulation, objective: str,
                                deadline: float = math.inf) -> Simulation:
    """The schedule with every recompute (R) and offload (O and L) dropped (the activation kept
    instead) that is not needed: one at a time, in (stage, microbatch) order, while the schedule
    stays within the memory limit and its objective does not grow, until `deadline`
    (`time.perf_counter()`; one simulation per activation; a timed schedule keeps its times). A
    solver may leave an R in idle time, or a pair of copies anywhere, where it costs nothing; a
    user reading the schedule should not have to wonder why it recomputes or offloads with memory
    to spare."""
    table = simulation.table
    for kinds, pairs in (((RECOMPUTE,), table.recomputed), ((OFFLOAD, RELOAD), table.offloaded)):
        for stage, microbatch in pairs:
            if time.perf_counter() > deadline:
                return simulation
            dropped = {Op(kind, stage, microbatch) for kind in kinds}
            schedule = simulation.schedule
            kept = [[index for index, op in enumerate(order) if op not in dropped] for order in schedule.orders]
            orders = [[order[i] for i in indices] for order, indices in zip(schedule.orders, kept, strict=True)]
            times = None if schedule.start_times is None else \
                [[device_times[i] for i in indices] for device_times, indices in zip(schedule.start_times, kept,
                                                                                       strict=True)]
            candidate = simulate(problem, dataclasses.replace(schedule, orders=orders, start_times=times))
            if candidate.valid and objective_value(candidate, objective) <= objective_value(simulation, objective):
                simulation = candidate
    return simulation


def check_close(name: str, simulated: float, modelled: float, error_bound: float) -> None:
    """The simulator's objective must not exceed the model's beyond the rounding bound."""
    if simulated > modelled + error_bound + 1e-9 * max(1.0, modelled):
        raise RuntimeError(f"{name}: simulated objective {simulated} exceeds the model's {modelled}")
