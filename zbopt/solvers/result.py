"""What every solver shares: integer ticks, the warm start, and the verified result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zbopt.errors import ZboptError
from zbopt.ops import Op, device_work
from zbopt.problem import Problem
from zbopt.schedule import Schedule
from zbopt.schedules import generate, generate_applicable
from zbopt.simulate import Simulation, simulate
from zbopt.solvers.bounds import LowerBounds

OBJECTIVES = ("makespan", "span")
MAX_TICKS_PER_OP = 100_000  # the finest resolution a solver model uses for the longest op


@dataclass(frozen=True)
class TickScale:
    """Times in the problem's units times `ticks_per_unit`, rounded, are the solvers' integer
    ticks. `resolution` is one tick in the problem's units; a rounded duration is off by at most
    half a tick, so a solver's objective is off by at most `error_bound`."""

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


def _whole_at(values, scale: int) -> bool:
    """Whether every value times `scale` is a whole number (up to float rounding)."""
    return all(abs(v * scale - round(v * scale)) < 1e-9 * max(1.0, v * scale) for v in values)


def tick_scale(problem: Problem) -> TickScale:
    """The smallest power of ten that makes every cost and the latency whole ticks, capped so the
    longest op stays within MAX_TICKS_PER_OP ticks (beyond that, costs are rounded)."""
    values = [*problem.forward_times, *problem.backward_times, *(problem.weight_times or ()), problem.p2p_time]
    longest = max(values)
    scale = 1
    while True:
        if _whole_at(values, scale):
            return TickScale(scale, True, 0.0)
        if scale * 10 * longest > MAX_TICKS_PER_OP:
            break
        scale *= 10
    # rounding: every op and latency on a chain is off by <= half a tick
    chain = 2 * problem.num_ops / problem.num_devices + 2 * problem.num_stages
    return TickScale(scale, False, 0.5 * chain / scale)


def memory_scale(problem: Problem) -> int:
    """A power of ten making every memory amount whole (up to 1e6), for cumulative demands."""
    amounts = [*problem.activation_memory, *(problem.weight_memory or ()), *(problem.memory_limit or ())]
    return next((10**exponent for exponent in range(7) if _whole_at(amounts, 10**exponent)), 10**6)


@dataclass(frozen=True)
class SolveResult:
    """A solver's answer, re-verified by the simulator.

    status: optimal (proven), feasible (a schedule, gap > 0), infeasible, unknown (no schedule).
    objective: the schedule's makespan (or longest device span), from the simulator.
    lower_bound: the best of the independent bounds and the solver's own bound.
    gap: (objective - lower_bound) / objective.
    """

    status: str
    simulation: Simulation | None
    objective: float | None
    lower_bound: float
    solver: str
    objective_kind: str
    solve_time_s: float
    warm_start: str | None
    resolution: float
    bounds: dict = field(default_factory=dict)

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
                    warm_start=self.warm_start, resolution=self.resolution, bounds=self.bounds)
        return data


def relative_gap(value: float | None, lower_bound: float) -> float | None:
    """(value - lower_bound) / value, at least 0; None without a positive value."""
    if value is None or value <= 0:
        return None
    return max(0.0, (value - lower_bound) / value)


def objective_bound(problem: Problem, bounds: LowerBounds, kind: str) -> float:
    """The independent lower bound on the objective: the best makespan bound, or for the span
    objective a device's own work (the other bounds speak of the makespan only)."""
    return bounds.best if kind == "makespan" else max(device_work(problem))


def objective_value(simulation: Simulation, kind: str) -> float:
    """The makespan, or the longest per-device span (the Zero Bubble paper's objective)."""
    return simulation.makespan if kind == "makespan" else max(simulation.span)


def best_heuristic(problem: Problem, kind: str = "makespan") -> tuple[str, Simulation] | None:
    """The registered heuristic with the best objective among those valid under the memory limit."""
    best: tuple[str, Simulation] | None = None
    for name, schedule in generate_applicable(problem)[0].items():
        result = simulate(problem, schedule)
        if result.valid and (best is None or objective_value(result, kind) < objective_value(best[1], kind)):
            best = (name, result)
    return best


def warm_start_simulation(problem: Problem, warm_start: str | None, kind: str) -> tuple[str, Simulation] | None:
    """The named heuristic's simulation (an error if it breaks the memory limit), or the best one."""
    if warm_start is None:
        return best_heuristic(problem, kind)
    result = simulate(problem, generate(warm_start, problem))
    if not result.valid:
        raise ZboptError(f"warm start '{warm_start}' breaks the memory limit: {result.violations[0]}")
    return warm_start, result


def schedule_from_starts(problem: Problem, starts: dict[Op, float], name: str) -> Schedule:
    """Per device, its ops ordered by their start times (a device runs one op at a time)."""
    orders: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    for op in sorted(starts, key=starts.__getitem__):
        orders[problem.device_of(op.stage)].append(op)
    return Schedule(orders, name=name)


def meets_bound(warm: tuple[str, Simulation] | None, kind: str, lower: float, tolerance: float) -> bool:
    """Whether the warm start already reaches the independent lower bound: it is optimal, and a
    search could only confirm it (zb-h1 at p·M_B on the Zero Bubble paper's models, for one)."""
    return warm is not None and objective_value(warm[1], kind) <= lower + tolerance


def settle(status: str, simulation: Simulation | None, warm: tuple[str, Simulation] | None, kind: str,
           lower: float, tolerance: float, proof_is_exact: bool) -> tuple[str, Simulation | None, float | None, float]:
    """The final (status, simulation, objective, lower bound) of a solve: the warm start when it is
    better; the objective as its own bound when the solver proved it (and its model was exact);
    "optimal" also when an independent bound meets the objective; "feasible" whenever a schedule
    exists but optimality is not proven."""
    if warm is not None and (simulation is None
                             or objective_value(warm[1], kind) < objective_value(simulation, kind) - tolerance):
        simulation = warm[1]
        status = "optimal" if status == "optimal" else "feasible"
    if simulation is None:
        return status, None, None, lower
    value = objective_value(simulation, kind)
    if status == "optimal" and proof_is_exact:
        lower = value
    if value <= lower + tolerance:
        status, lower = "optimal", value
    if status != "optimal":
        status = "feasible"
    return status, simulation, value, min(lower, value)


def check_close(name: str, simulated: float, modelled: float, scale: TickScale) -> None:
    """The simulator's objective must not exceed the model's beyond the rounding bound."""
    if simulated > modelled + scale.error_bound + 1e-9 * max(1.0, modelled):
        raise RuntimeError(f"{name}: simulated objective {simulated} exceeds the model's {modelled}")


def ceil_ticks(value: float, scale: TickScale) -> int:
    """A bound in problem units as whole ticks, rounded up only when costs are exact."""
    ticks = value * scale.ticks_per_unit
    return math.ceil(ticks - 1e-6) if scale.exact else math.floor(ticks)
