"""Large-neighbourhood search: never worse than its start, always re-simulated and valid."""

from __future__ import annotations

import pytest

from tests.reference import brute_force_optimum
from zbopt import Problem, generate, simulate, solve

SMALL = dict(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2, weight_times=1, weight_memory=0.5)


@pytest.mark.parametrize("start", ["gpipe", "1f1b", "zb-h1"])
def test_lns_improves_its_start_and_never_passes_the_optimum(start):
    problem = Problem(**SMALL)
    result = solve(problem, "lns", time_limit=3, warm_start=start, lower_peak=False)
    started = simulate(problem, generate(start, problem)).makespan
    assert result.simulation.valid
    assert brute_force_optimum(problem) - 1e-9 <= result.objective <= started + 1e-9
    assert result.objective == simulate(problem, result.simulation.schedule).makespan  # re-simulated


def test_lns_keeps_the_memory_limit_and_reaches_the_optimum_of_a_small_problem():
    problem = Problem(**SMALL, memory_limit=1.5)
    result = solve(problem, "lns", time_limit=3, lower_peak=False)
    assert max(result.simulation.peak_memory) <= 1.5
    assert result.objective == pytest.approx(brute_force_optimum(problem))


def test_lns_without_a_schedule_it_can_improve_leaves_the_warm_start():
    """Two iterations (weight-update barriers, which it does not model): the warm start stands."""
    problem = Problem(**SMALL, iterations=2)
    result = solve(problem, "lns", time_limit=2, warm_start="1f1b", lower_peak=False)
    assert result.objective == simulate(problem, generate("1f1b", problem)).makespan
