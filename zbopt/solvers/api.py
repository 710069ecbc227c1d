"""`solve`: one entry point for every exact solver, same inputs and outputs."""

from __future__ import annotations

from zbopt.errors import ZboptError
from zbopt.problem import Problem
from zbopt.solvers.result import OBJECTIVES, SolveResult

SOLVERS = ("cpsat", "cbc", "highs")


def solve(problem: Problem, solver: str = "cpsat", *, time_limit: float = 60.0, objective: str = "makespan",
          warm_start: str | None = None, workers: int = 2, seed: int = 0, progress: bool = False) -> SolveResult:
    """The schedule with the smallest makespan (or longest device span) within the memory limit,
    with its status, lower bound and gap. `solver`: "cpsat" (OR-Tools CP-SAT, see `solve_cpsat`),
    "cbc" or "highs" (the disjunctive MILP through PuLP, see `solve_milp`).

    >>> from zbopt import Problem
    >>> result = solve(Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2), time_limit=10)
    >>> result.status, result.objective
    ('optimal', 9.0)
    """
    if solver not in SOLVERS:
        raise ZboptError(f"unknown solver '{solver}' (known: {', '.join(SOLVERS)})")
    if objective not in OBJECTIVES:
        raise ZboptError(f"unknown objective '{objective}' (known: {', '.join(OBJECTIVES)})")
    if time_limit <= 0:
        raise ZboptError(f"time limit {time_limit:g}: must be positive")
    if workers < 1:
        raise ZboptError(f"workers {workers}: must be at least 1")
    if solver in ("cbc", "highs"):
        from zbopt.solvers.milp import solve_milp

        return solve_milp(problem, backend=solver, time_limit=time_limit, objective=objective,
                          warm_start=warm_start, workers=workers)
    from zbopt.solvers.cpsat import solve_cpsat

    return solve_cpsat(problem, time_limit=time_limit, objective=objective, warm_start=warm_start,
                       workers=workers, seed=seed, progress=progress)
