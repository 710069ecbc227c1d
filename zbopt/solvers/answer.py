"""A backend's answer on its way to the user: read through the one simulator, checked against the
model's own value, and rid of the recomputes, offloads and re-gathers it does not need."""

from __future__ import annotations

import dataclasses
import math

from zbopt.core import interrupt
from zbopt.core.kinds import OFFLOAD, RECOMPUTE, REGATHER, RELOAD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import compute_slowed
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import Simulation, simulate
from zbopt.core.ticks import waits_matter
from zbopt.schedules.common import schedule_from_starts
from zbopt.solvers.task import Found

__all__ = ["OBJECTIVES", "check_close", "objective_name", "objective_value", "simulated_answer",
           "start_times", "without_needless_mechanisms"]

OBJECTIVES = ("makespan", "span")


def objective_value(simulation: Simulation, kind: str) -> float:
    """The makespan (the iteration time, where the problem has the iteration's ends), or the
    longest per-device span (the Zero Bubble paper's objective)."""
    return simulation.iteration_time if kind == "makespan" else max(simulation.span)


def objective_name(problem: Problem, kind: str) -> str:
    """What `objective_value` measures, as results name it: "iteration_time" for the makespan
    objective where the problem has the iteration's ends."""
    return "iteration_time" if kind == "makespan" and problem.iteration_ends is not None else kind


def start_times(simulation: Simulation) -> dict[Op, float]:
    """The start of every op of a simulated schedule, by op (a warm start handed to a model)."""
    return dict(zip(simulation.table.ops(), simulation.start.tolist(), strict=True))


def simulated_answer(problem: Problem, found: Found, objective: str, solver: str) -> Simulation | None:
    """The backend's schedule through the one simulator (strict: a memory violation is a bug),
    its objective checked against the model's own where the backend gives one. Where compute
    slows while it communicates (`compute_slowed`), the model left that out: its schedule is
    simulated with it, may take longer than modelled, and is None where it then breaks the limit."""
    if found.starts is None:
        return None
    slowed = compute_slowed(problem)
    # as soon as possible, which is robust to rounded ticks; but a wait for memory (a forward until
    # an offload or a reduction has freed room, a recompute or reload not too early) and which copy
    # goes first on a shared host link are in the model's times only; a slowdown, in neither (its
    # stretched ops can meet the fixed unshards at other points of the order than the model's)
    simulation = None
    if problem.offload is None or not problem.offload.shared_host_link:
        simulation = simulate(problem, schedule_from_starts(problem, found.starts, solver, pairs=found.pairs),
                              strict=not (waits_matter(problem) or slowed))
    if simulation is None or not simulation.valid or _span_lengthened(simulation, found, objective):
        simulation = simulate(problem, schedule_from_starts(problem, found.starts, solver, timed=True,
                                                            pairs=found.pairs), strict=not slowed)
        if not simulation.valid:
            return None
    if found.modelled is not None and not slowed:
        check_close(solver, objective_value(simulation, objective), found.modelled, found.error_bound)
    return simulation


def _span_lengthened(simulation: Simulation, found: Found, objective: str) -> bool:
    """Whether timing as soon as possible lengthened a device's span past the model's: it started a
    device's first op at its release where the model kept it later (with FSDP's unshards, a
    device's second chunk waits for its own gather, so moving the first chunk up adds idle time).
    Only where the model's times are exact: rounded ticks would not pass as given start times."""
    return objective == "span" and found.modelled is not None and found.exact and \
        _exceeds(objective_value(simulation, objective), found.modelled, found.error_bound)


def check_close(name: str, simulated: float, modelled: float, error_bound: float) -> None:
    """The simulator's objective must not exceed the model's beyond the rounding bound."""
    if _exceeds(simulated, modelled, error_bound):
        raise RuntimeError(f"{name}: simulated objective {simulated} exceeds the model's {modelled}")


def _exceeds(simulated: float, modelled: float, error_bound: float) -> bool:
    return simulated > modelled + error_bound + 1e-9 * max(1.0, modelled)


def without_needless_mechanisms(problem: Problem, simulation: Simulation, objective: str,
                                deadline: float = math.inf) -> Simulation:
    """The schedule with every recompute (R), offload (O and L) and re-gather (G) dropped (the
    activation or the parameters kept instead) that is not needed: one at a time, in (stage,
    microbatch) order, while the schedule
    stays within the memory limit and its objective does not grow, until `deadline`
    (`interrupt.now()`; one simulation per activation; a timed schedule keeps its times). A
    solver may leave an R in idle time, or a pair of copies anywhere, where it costs nothing; a
    user reading the schedule should not have to wonder why it recomputes, offloads or re-gathers
    with memory to spare."""
    table = simulation.table
    for kinds, pairs in (((RECOMPUTE,), table.recomputed), ((OFFLOAD, RELOAD), table.offloaded),
                         ((REGATHER,), table.regathered)):
        for stage, microbatch in pairs:
            if interrupt.now() > deadline:
                return simulation
            candidate = simulate(problem, _dropped(simulation, {Op(kind, stage, microbatch) for kind in kinds}))
            if candidate.valid and objective_value(candidate, objective) <= objective_value(simulation, objective):
                simulation = candidate
    return simulation


def _dropped(simulation: Simulation, dropped: set[Op]) -> Schedule:
    """The simulated schedule without the ops `dropped`, its start times (where it has them) kept."""
    schedule = simulation.schedule
    kept = [[index for index, op in enumerate(order) if op not in dropped] for order in schedule.orders]
    orders = [[order[i] for i in indices] for order, indices in zip(schedule.orders, kept, strict=True)]
    times = None if schedule.start_times is None else \
        [[device_times[i] for i in indices] for device_times, indices in zip(schedule.start_times, kept, strict=True)]
    return dataclasses.replace(schedule, orders=orders, start_times=times)
