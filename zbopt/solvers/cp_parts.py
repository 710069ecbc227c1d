"""The pieces of CP-SAT models that several methods share: an op's variables (the full model and its
pairs), activation lifetimes as intervals (the full model, LNS windows, the single-device
relaxation), a solver with a time limit (LNS windows, the block search, the relaxation), and the
watcher that stops a solve at its deadline or Ctrl-C (`solve_stoppable`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ortools.sat.python import cp_model

from zbopt.core import interrupt
from zbopt.core.kinds import FORWARD, OFFLOAD, RECOMPUTE, RELOAD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.ticks import memory_rounding, memory_scale
from zbopt.solvers.task import SearchTask

__all__ = ["Choice", "Lifetime", "OpVars", "lifetime_intervals", "limit", "solve_stoppable",
           "task_stopped", "timed_solver"]


class OpVars(NamedTuple):
    """One op in a model, as OR-Tools' job-shop sample keeps a task: its start (a variable), its end
    (an expression, or a variable where a pair may end it) and its interval (optional where the op
    may not run, or not alone)."""

    start: object
    end: object
    interval: object


class Lifetime(NamedTuple):
    """A part of an activation held on a device: from `allocated` to `released` (model variables),
    `amount` memory ticks, as `interval`; held only when `presence` (a literal) holds, or always
    when it is None."""

    allocated: object
    released: object
    amount: int
    interval: object
    presence: object = None


class Choice(NamedTuple):
    """How the model holds one activation: one literal per way (None where not allowed; exactly
    one holds)."""

    kept: object
    recomputed: object = None
    offloaded: object = None


def lifetime_intervals(model, problem: Problem, ops, start, end, horizon: int, amount=None,
                       choices: dict | None = None) -> list[list[Lifetime]]:
    """Per device, the `Lifetime` of every part of an activation among `ops`: F allocates its
    stage's activation, each op with a negative `Problem.memory_delta` frees its part (B and W
    when split, BW when fused). Always held, unless `choices` (a `Choice` per stage and
    microbatch) gives a choice: then the kept lifetimes hold when kept; when recomputed, the
    checkpoint from F's start to R's and each part from R's start; when offloaded, the activation
    from F's start to O's end and each part from L's start. `amount` turns a memory amount in
    `memory_scale` units into a whole number (default `memory_rounding`; the relaxation rounds down)."""
    unit = memory_scale(problem)
    amount = memory_rounding(problem, unit) if amount is None else amount
    per_device: list[list[Lifetime]] = [[] for _ in range(problem.num_devices)]

    def hold(device, allocated, released, memory, name, presence=None):
        size = model.NewIntVar(0, horizon, f"held_{name}")
        if presence is None:
            life = model.NewIntervalVar(allocated, size, released, f"life_{name}")
        else:
            life = model.NewOptionalIntervalVar(allocated, size, released, presence, f"life_{name}")
        per_device[device].append(Lifetime(allocated, released, amount(memory * unit), life, presence))

    for forward in (op for op in ops if op.kind == FORWARD):
        stage, microbatch = forward.stage, forward.microbatch
        device = problem.device_of(stage)
        choice = None if choices is None else choices[stage, microbatch]
        for kind, freed in problem.releases(stage, microbatch):
            release = Op(kind, stage, microbatch)
            hold(device, start[forward], end[release], freed, release, None if choice is None else choice.kept)
            if choice is not None and choice.recomputed is not None:
                hold(device, start[Op(RECOMPUTE, stage, microbatch)], end[release], freed, f"{release}_recomputed",
                     choice.recomputed)
            if choice is not None and choice.offloaded is not None:
                hold(device, start[Op(RELOAD, stage, microbatch)], end[release], freed, f"{release}_reloaded",
                     choice.offloaded)
        if choice is not None and choice.recomputed is not None:
            checkpoint = problem.memory_delta(FORWARD, stage, recomputed=True, microbatch=microbatch)
            hold(device, start[forward], start[Op(RECOMPUTE, stage, microbatch)], checkpoint,
                 f"checkpoint_{forward}", choice.recomputed)
        if choice is not None and choice.offloaded is not None:
            whole = problem.memory_delta(FORWARD, stage, microbatch=microbatch)
            hold(device, start[forward], end[Op(OFFLOAD, stage, microbatch)], whole,
                 f"offloading_{forward}", choice.offloaded)
    return per_device


def timed_solver(seconds: float, workers: int, seed: int) -> cp_model.CpSolver:
    """A CP-SAT solver limited to `seconds` (`limit`) with `workers` threads and `seed`, for the
    small models solved many times over (block search, LNS windows, the relaxation)."""
    solver = cp_model.CpSolver()
    limit(solver, seconds, workers, seed)
    return solver


def limit(solver: cp_model.CpSolver, seconds: float, workers: int, seed: int = 0) -> None:
    """Limit `solver` to `seconds` (at least 0.01) with `workers` threads and `seed`; under a
    metered clock (`interrupt.metered`), to `seconds` of deterministic time on one worker, which
    OR-Tools repeats exactly (several workers do not, seed or not; its interleaved search does,
    but proved less: a loop p = 4, m = 8, v = 2 model, optimal at 5.9 units on one worker, was
    still 1.2% off at 10 on two). CP-SAT's own SIGINT handler is off: installed and removed
    around every Solve, a Ctrl-C between the two aborts the process (`std::bad_function_call`);
    `solve_stoppable` stops it instead."""
    if interrupt.deterministic():
        solver.parameters.max_deterministic_time = max(0.01, seconds)
        solver.parameters.num_workers = 1
    else:
        solver.parameters.max_time_in_seconds = max(0.01, seconds)
        solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.catch_sigint_signal = False


def solve_stoppable(solver: cp_model.CpSolver, model, callback=None, *,
                    stop_when: Callable[[], bool] = interrupt.requested.is_set) -> int:
    """`solver.Solve(model, callback)`, stopped by StopSearch once `stop_when()` holds (by default:
    Ctrl-C came), through `interrupt.watched`: a callback never runs in the main thread, so nothing
    raises inside CP-SAT. Its deterministic time is counted on the one clock."""
    code = interrupt.watched(lambda: solver.Solve(model, callback), solver.StopSearch, stop_when)
    interrupt.spend(solver.deterministic_time)
    return code


def task_stopped(task: SearchTask) -> Callable[[], bool]:
    """Whether a backend's solve should stop: the driver stopped the task, Ctrl-C came, or the
    deadline passed (CP-SAT's workers can run past max_time_in_seconds on a busy machine)."""
    return lambda: task.stopped.is_set() or interrupt.requested.is_set() or task.remaining() <= 0
