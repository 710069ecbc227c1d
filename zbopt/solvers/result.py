"""A solver's answer as the user gets it: the schedule re-simulated, its status, bound and gap
(the solver's integer ticks are `zbopt.core.ticks`'s; the rule for "optimal" and the gap is `gap`'s)."""

from __future__ import annotations

from dataclasses import dataclass, field

from zbopt.core.errors import ZboptError
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import Simulation
from zbopt.core.wiring import Shown
from zbopt.solvers.gap import relative_gap

__all__ = ["SolveResult"]


@dataclass(frozen=True)
class SolveResult(Shown):
    """A solver's answer, re-verified by the simulator.

    status: optimal (the objective meets the lower bound), feasible (a schedule, gap > 0),
        infeasible, unknown (no schedule).
    objective: the schedule's makespan (its iteration time where the problem has the iteration's
        ends; `objective_kind` names which, or the longest device span), from the simulator.
    lower_bound: the best of the independent bounds and the solver's own bound.
    gap: (objective - lower_bound) / objective; 0 exactly when the status is optimal.
    resolution: one time unit of the solver's model in the problem's units (None when no model
        was built); decided_by: what proved the status (the solver, which lower bound, or the
        model's resolution when rounding keeps the proof from the problem's own costs).
    bounds: every independent lower bound's value by name; bound_seconds: the seconds each took;
        binding_bound: the name of the largest, binding_devices: the devices it reasons about
        (empty: the whole problem); bounds_complete: False when the time limit cut some short.
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
    binding_devices: tuple[int, ...] = ()
    bounds_complete: bool = True
    bound_seconds: dict = field(default_factory=dict)

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
                    bounds=self.bounds, bound_seconds=self.bound_seconds, binding_bound=self.binding_bound,
                    binding_devices=list(self.binding_devices), bounds_complete=self.bounds_complete)
        return data

    def to_dataframe(self):
        """Its schedule's devices (`Simulation.to_dataframe`); pandas is optional."""
        if self.simulation is None:
            raise ZboptError(f"the solver found no schedule ({self.status}): nothing to tabulate")
        return self.simulation.to_dataframe()
