"""The MILP (PuLP with CBC and HiGHS) against brute force, known optima and CP-SAT."""

import pytest
from hypothesis import given, settings

from tests.reference import brute_force_optimum, problems
from tests.test_cpsat import TINY, unit_problem
from zbopt import Problem, generate, simulate, solve
from zbopt.solvers.api import _verdict
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.task import Found


@pytest.mark.parametrize("backend", ["cbc", "highs"])
@pytest.mark.parametrize("problem", TINY[:4], ids=lambda p: p.describe())
def test_milp_agrees_with_brute_force(backend, problem):
    result = solve(problem, backend, time_limit=60)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(brute_force_optimum(problem), abs=1e-5)


@pytest.mark.parametrize("backend", ["cbc", "highs"])
@pytest.mark.parametrize(("memory", "optimum"), [(4, 27), (2, 41)])
def test_milp_known_optima(backend, memory, optimum):
    result = solve(unit_problem(4, 8, memory), backend, time_limit=120)
    assert result.status == "optimal" and result.objective == pytest.approx(optimum)
    assert max(result.simulation.peak_memory) <= memory


@settings(max_examples=6)
@given(problems(max_devices=3, max_microbatches=3))
def test_cpsat_and_highs_agree_on_random_problems(problem):
    """Problems this small (p, m <= 3) both prove, and their optima agree to CP-SAT's tick (costs
    have 3 decimals: whole ticks of 1e-3); where brute force over device orders is quick (p·m <= 4),
    both meet the optimum it finds."""
    limited = problem.replace(memory_limit=[need + 1 for need in problem.min_memory_limit])
    cpsat = solve(limited, "cpsat", time_limit=20)
    highs = solve(limited, "highs", time_limit=20)
    assert (cpsat.status, highs.status) == ("optimal", "optimal")
    assert cpsat.objective == pytest.approx(highs.objective, abs=2e-3)
    assert lower_bounds(limited).best <= min(cpsat.objective, highs.objective) + 1e-6
    if problem.num_devices * problem.num_microbatches <= 4:
        optimum = brute_force_optimum(limited)
        assert cpsat.objective == pytest.approx(optimum, abs=1e-5)
        assert highs.objective == pytest.approx(optimum, abs=1e-5)


def test_an_independent_bound_that_meets_the_objective_proves_optimality():
    """With one device the makespan is the total work, which the device-load bound already gives:
    whatever the solver reports about its own search, the answer is certified optimal."""
    problem = Problem(num_devices=1, num_microbatches=3, forward_times=1, backward_times=2)
    result = simulate(problem, generate("1f1b", problem))
    found = Found("feasible", None, 0.0, None, 1.0, exact=False)
    status, simulation, lower, decided_by = _verdict(found, result, None, "makespan", lower_bounds(problem).best,
                                                     "device_load")
    assert (status, simulation.makespan, lower, decided_by) == ("optimal", 9.0, 9.0, "lower bound (device_load)")
