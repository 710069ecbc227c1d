"""What the driver and a backend hand each other: the search task, the answer, and the one refusal
of the backends that keep every activation."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from zbopt.core import interrupt
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.simulation import Simulation

__all__ = ["Found", "SearchTask", "ignore", "simple_model_refusal"]


def ignore(*_args) -> None:
    """A hook nobody listens to: `report` without a live line, `on_stop` before the driver sets one."""


@dataclass
class SearchTask:
    """What the driver hands a backend.

    objective : "makespan" or "span". With `peak_cap` set (the second phase; `warm` is then the
        first phase's schedule and `peak_cap` its objective), the backend instead minimises the
        highest peak memory over the devices, keeping the objective at most the warm start's; a
        backend that cannot says so with `Found(status="unknown")`.
    warm : the warm start (valid under the memory limit) to hint and to cap the horizon with, or None.
    independent_bound : the driver's lower bound on the objective (problem units).
    deadline : `interrupt.now()` by which the backend should stop searching and return; the
        driver waits its `Backend.stop_s` past it for the answer, then leaves it behind.
    report : call with (incumbent, bound) in problem units whenever either improves.
    on_stop : register a callable that stops the search (Ctrl-C); the backend then returns its best.
    kept : where the backend keeps its best schedule so far (`kept["incumbent"]`, a Found, nothing
        proven), which the driver answers with when the backend does not return in time; a task
        copied with `dataclasses.replace` (a backend's first stage) shares it.
    """

    objective: str
    warm: Simulation | None
    independent_bound: float
    deadline: float
    workers: int
    seed: int
    report: Callable[[float | None, float | None], None] = ignore
    on_stop: Callable[[Callable[[], None]], None] = ignore
    peak_cap: float | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    kept: dict[str, Found] = field(default_factory=dict)  # "incumbent": the backend's best so far

    def remaining(self) -> float:
        """Seconds to the deadline (of work under a metered clock, `interrupt.now`)."""
        return self.deadline - interrupt.now()


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


def simple_model_refusal(problem: Problem, backend: str, ends: bool = False) -> str | None:
    """Why `backend` (one that keeps every activation and runs every op alone: the MILP, LNS; one
    that ends with the last op unless it models the iteration's `ends`, but never with FSDP's
    gathered parameters or gradients in memory) cannot take `problem`, or None."""
    iteration = problem.iteration_ends
    gathered, gradients = ((True if iteration is not None and any(getattr(iteration, key)) else None)
                           for key in ("unshard_memory", "gradient_memory"))
    for record, key, what in ((problem.recomputation, "allow_recompute", "recomputation"),
                              (problem.offload, "allow_offload", "offload"),
                              (problem.pairs, "overlap_times", "overlapped pairs"),
                              (None if ends else iteration, "grad_reduce_times, optimizer_step_times, unshard_times",
                               "the iteration's ends"),
                              (gathered, "unshard_memory", "FSDP's gathered parameters"),
                              (gradients, "gradient_memory", "FSDP's unsharded gradients")):
        if record is not None:
            return f"{backend} does not model {what} ({key}); use cpsat"
    return None
