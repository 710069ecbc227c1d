"""The span objective's lower bound (`span_bound`): below every proven optimum, and equal to values
derived by hand."""

import random

import pytest

from zbopt import Problem, solve
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS
from zbopt.solvers.span_bound import span_bound


def test_span_of_the_first_device_holds_the_second_devices_work():
    """p = 2, m = 2, F = 1, fused BW = 2: device 1's six units of work start at least 1 after device
    0's first forward, and device 0's last BW (2) follows device 1's last: device 0's span is at
    least 1 + 6 + 2 = 9, which the optimizer reaches (its device-work bound is 6)."""
    problem = Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2)
    assert span_bound(problem) == pytest.approx(9.0)
    result = solve(problem, objective="span", time_limit=10, workers=1)
    assert (result.status, result.objective) == ("optimal", pytest.approx(9.0))


def test_zb_2p_memory_span_is_the_last_devices_forwards_and_backwards():
    """The 1.5B costs at p = 4, m = 8, memory 2p: between device 0's first F and its last W lie the
    last device's eight F and B (8 (F + B)), the chain down to it (3 (F + comm)) and back
    (3 (B + comm)), and the last W: 415.631, where the busiest device's work says 367.56."""
    problem = ZERO_BUBBLE_MODELS["1.5B"].problem(8, num_devices=4, num_microbatches=8, weight_memory=0.3)
    f, b, w, comm = 18.522, 18.086, 9.337, 0.601
    assert span_bound(problem) == pytest.approx(3 * (f + comm) + 8 * (f + b) + 3 * (b + comm) + w)


def _random_problem(seed: int) -> Problem:
    """A small problem: 2 or 3 devices, 1 or 2 chunks (loop or V), split or fused, random costs,
    latency and sometimes a memory limit near the least one."""
    draw = random.Random(seed)
    p, v = draw.choice([(2, 1), (3, 1), (2, 2)])
    stages = p * v
    split = draw.random() < 0.6

    def costs():
        return [draw.choice([0.5, 1.0, 1.5, 2.0, 3.0]) for _ in range(stages)]

    problem = Problem(num_devices=p, num_microbatches=draw.choice([2, 3]), chunks_per_device=v,
                      placement=draw.choice(["loop", "v"]), forward_times=costs(), backward_times=costs(),
                      weight_times=costs() if split else None, p2p_time=draw.choice([0.0, 0.5]))
    if draw.random() < 0.5:
        problem = problem.replace(memory_limit=[level + draw.choice([0, 1]) for level in problem.one_microbatch_memory])
    return problem


@pytest.mark.parametrize("seed", range(6, 14))
def test_span_bound_below_the_proven_optimum(seed):
    problem = _random_problem(seed)
    result = solve(problem, objective="span", time_limit=10, workers=1, lower_peak=False)
    assert result.status == "optimal"
    assert span_bound(problem) <= result.objective + 1e-6


@pytest.mark.parametrize("changes", [
    dict(allow_recompute=True, checkpoint_memory=0.2, memory_limit=1.2),
    dict(placement="bidirectional", chunks_per_device=2, num_microbatches=2, overlap_times={"FBW": 2.2}),
    dict(chunks_per_device=2, placement="v", num_microbatches=2, overlap_times={"FB": 1.6}),
])
def test_span_bound_below_the_optimum_with_mechanisms_and_pairs(changes):
    problem = Problem(**{**dict(num_devices=2, num_microbatches=3, forward_times=1, backward_times=1,
                                weight_times=1), **changes})
    result = solve(problem, objective="span", time_limit=15, workers=1, lower_peak=False)
    assert result.status == "optimal"
    assert span_bound(problem) <= result.objective + 1e-6
