"""The memory-capped list schedule `greedy`: any placement and limit, never above it, never stuck."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zbopt import Problem, generate, simulate, solve
from zbopt.core.errors import NotApplicableError
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.warm import best_heuristic

from .reference import problems


@given(problems(max_devices=4, max_microbatches=6, chunks=(1, 2, 3)), st.sampled_from([0.0, 0.3, 1.0, 4.0]))
def test_greedy_fits_every_limit_from_the_floor_up(problem, extra):
    """At the floor (one microbatch's activations per device) and above: the simulator accepts it
    and no device exceeds its limit (a deadlock would raise)."""
    limited = problem.replace(memory_limit=[need + extra for need in problem.min_memory_limit])
    result = simulate(limited, generate("greedy", limited))
    assert result.valid, result.violations[:1]
    assert all(peak <= limit + 1e-9 for peak, limit in zip(result.peak_memory, limited.memory_limit, strict=True))


@pytest.mark.parametrize("m", [1, 3, 6])
def test_greedy_at_one_activation_is_the_serial_optimum(m):
    """Limit M_B with M_W = 0.5 (as in test_bounds): a device takes microbatch i+1 in only once its
    B and W of microbatch i have freed everything, so device 0 runs each round trip alone:
    m·(p(F+B) + W + 2(p-1)c), which the device sequencing bound proves optimal."""
    p, f, b, w, c = 3, 1.0, 1.5, 0.5, 0.25
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=f, backward_times=b, weight_times=w,
                      p2p_time=c, weight_memory=0.5, memory_limit=1)
    closed_form = m * (p * (f + b) + w + 2 * (p - 1) * c)
    assert simulate(problem, generate("greedy", problem)).makespan == pytest.approx(closed_form)
    assert lower_bounds(problem).best == pytest.approx(closed_form)


def test_greedy_is_the_warm_start_where_no_published_schedule_fits():
    """Interleaved placement at 2 whole-stage activations per device (interleaved 1F1B needs
    more): only greedy fits, so the search starts from it and never returns anything worse."""
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=0.5, activation_memory=0.5, weight_memory=0.2, memory_limit=2)
    name, start = best_heuristic(problem)
    assert name == "greedy"
    result = solve(problem, time_limit=5, lower_peak=False)
    assert result.warm_start == "greedy"
    assert result.objective <= start.makespan + 1e-9


def test_greedy_plans_one_iteration():
    with pytest.raises(NotApplicableError, match="greedy needs iterations = 1"):
        generate("greedy", Problem(num_devices=2, num_microbatches=2, iterations=2))
