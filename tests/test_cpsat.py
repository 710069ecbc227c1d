"""The CP-SAT optimizer: known optima, brute force, symmetry breaking, bounds, re-verification."""

import pytest

from tests.reference import brute_force_optimum
from zbopt import Problem, simulate
from zbopt.solvers import solve
from zbopt.solvers.bounds import lower_bounds


def unit_problem(p, m, memory):
    return Problem(num_devices=p, num_microbatches=m, forward_times=1, backward_times=1, weight_times=1,
                   weight_memory=0.5, memory_limit=memory)


@pytest.mark.parametrize(
    ("p", "m", "memory", "optimum"), [(4, 8, 4, 27), (4, 8, 2, 41), (8, 16, 8, 55), (8, 16, 4, 79)]
)
def test_known_optima(p, m, memory, optimum):
    """Known optima (F=B=W=1, c=0, M_B=1, M_W=0.5), from the optimizer issue."""
    result = solve(unit_problem(p, m, memory), "cpsat", time_limit=180)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(optimum)
    assert result.lower_bound == pytest.approx(optimum) and result.gap == pytest.approx(0)
    assert max(result.simulation.peak_memory) <= memory


TINY = [
    Problem(num_devices=2, num_microbatches=2, forward_times=[1, 2], backward_times=[2, 1], weight_times=[1, 1.5],
            p2p_time=0.5, memory_limit=2),
    Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2, weight_times=1, weight_memory=0.25,
            memory_limit=[1, 2]),
    Problem(num_devices=3, num_microbatches=2, forward_times=[1, 1, 3], backward_times=2, weight_times=0.5,
            p2p_time=0.25),
    Problem(num_devices=3, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1, memory_limit=1),
    Problem(num_devices=2, num_microbatches=3, forward_times=[1, 2], backward_times=[3, 1], p2p_time=0.5,
            memory_limit=[2, 1]),
    Problem(num_devices=1, num_microbatches=2, chunks_per_device=2, forward_times=[1, 2], backward_times=2,
            weight_times=1, memory_limit=3),
]


@pytest.mark.parametrize("problem", TINY, ids=lambda p: p.describe())
def test_cpsat_agrees_with_brute_force(problem):
    optimum = brute_force_optimum(problem)
    result = solve(problem, "cpsat", time_limit=30)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(optimum)
    assert lower_bounds(problem).best <= optimum + 1e-9
    # the returned schedule is the simulator's, within the limit, with the reported objective
    again = simulate(problem, result.schedule.without_times(), strict=True)
    assert again.makespan == pytest.approx(result.objective)


@pytest.mark.parametrize("problem", [unit_problem(3, 4, 2), unit_problem(3, 5, 3), TINY[0], TINY[4]],
                         ids=lambda p: p.describe())
def test_symmetry_breaking_keeps_the_optimum(problem):
    with_symmetry = solve(problem, "cpsat", time_limit=30)
    without = solve(problem, "cpsat", time_limit=30, symmetry_breaking=False, use_warm_start=False)
    assert with_symmetry.status == without.status == "optimal"
    assert with_symmetry.objective == pytest.approx(without.objective)


def test_reservoir_and_cumulative_memory_agree():
    problem = unit_problem(4, 6, 2.5)
    cumulative = solve(problem, "cpsat", time_limit=30)
    reservoir = solve(problem, "cpsat", time_limit=30, memory_model="reservoir")
    assert cumulative.status == reservoir.status == "optimal"
    assert cumulative.objective == pytest.approx(reservoir.objective)


def test_one_worker_and_a_seed_repeat_exactly():
    problem = Problem(num_devices=4, num_microbatches=6, forward_times=1.1, backward_times=1.3, weight_times=0.7,
                      p2p_time=0.1, memory_limit=3)
    first = solve(problem, "cpsat", time_limit=120, workers=1, seed=7)
    second = solve(problem, "cpsat", time_limit=120, workers=1, seed=7)
    assert first.status == "optimal"  # a wall-clock stop would make the comparison timing-dependent
    assert first.schedule.orders == second.schedule.orders


def test_span_objective_is_never_above_the_makespan_optimum():
    problem = unit_problem(3, 4, 3)
    span = solve(problem, "cpsat", time_limit=30, objective="span")
    makespan = solve(problem, "cpsat", time_limit=30)
    assert span.status == "optimal"
    assert span.objective == pytest.approx(max(span.simulation.span))
    assert span.objective <= makespan.objective + 1e-9


def test_no_search_when_the_warm_start_meets_the_bound(monkeypatch):
    """Zero Bubble paper, 1.5B at p·M_B with Table 1's M_W: zb-h1 meets the device sequencing bound,
    so the answer is proven without building or running a model (the solver would raise here)."""
    from ortools.sat.python import cp_model

    from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS

    def no_search(*args, **kwargs):
        raise AssertionError("CP-SAT ran")

    monkeypatch.setattr(cp_model, "CpSolver", no_search)
    model = ZERO_BUBBLE_MODELS["1.5B"]
    result = solve(model.problem(memory_limit=model.num_devices), "cpsat", time_limit=60)
    assert (result.status, result.warm_start, result.gap) == ("optimal", "zb-h1", 0.0)
    assert result.objective == pytest.approx(result.bounds["device_sequencing"])
