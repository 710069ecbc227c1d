"""Reductions in turn (`schedules.reductions`): each device's trailing W regrouped by stage in
Johnson's order, against brute force over every order of the stages in those runs."""

import itertools
import random

import pytest

from zbopt import Problem, compare, generate, simulate
from zbopt.core.kinds import WEIGHT
from zbopt.core.schedule import Schedule
from zbopt.schedules.reductions import reductions_in_turn


def regroupings(schedule: Schedule):
    """Every schedule whose devices run their trailing W grouped by stage, in any order of the stages."""
    per_device = []
    for order in schedule.orders:
        kept = len(order)
        while kept and order[kept - 1].kind == WEIGHT:
            kept -= 1
        tail = order[kept:]
        stages = list(dict.fromkeys(op.stage for op in tail))
        per_device.append([(*order[:kept], *(op for stage in chosen for op in tail if op.stage == stage))
                           for chosen in itertools.permutations(stages)])
    return [Schedule(combination) for combination in itertools.product(*per_device)]


def random_problems(count: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(count):
        yield Problem(num_devices=2, num_microbatches=rng.randint(2, 4), chunks_per_device=2,
                      placement=rng.choice(["v", "loop"]), forward_times=[rng.choice([1, 2]) for _ in range(4)],
                      backward_times=1, weight_times=[rng.choice([1, 2, 3]) for _ in range(4)],
                      grad_reduce_times=[rng.choice([1, 2, 4, 6]) for _ in range(4)], optimizer_step_times=1)


@pytest.mark.parametrize("problem", list(random_problems(12)), ids=lambda problem: f"{problem.placement}")
def test_johnsons_order_reaches_the_best_order_of_the_stages_in_the_trailing_w(problem):
    for name in ("greedy", "zb-v" if problem.placement == "v" else "interleaved-1f1b"):
        schedule = generate(name, problem)
        timed = simulate(problem, Schedule(schedule.orders))  # re-timed, as the variant is
        variant = reductions_in_turn(problem, schedule)
        found = timed if variant is None else simulate(problem, variant)
        assert found.makespan == pytest.approx(timed.makespan)  # the same work, none of it moved earlier or later
        assert max(found.peak_memory) <= max(timed.peak_memory) + 1e-9  # W only free memory
        assert found.iteration_time == pytest.approx(min(simulate(problem, each).iteration_time
                                                         for each in regroupings(schedule)))


def test_compare_shows_the_variant_where_it_shortens_the_iteration():
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, weight_times=1, grad_reduce_times=[6, 2, 2, 2, 2, 2, 2, 6],
                      optimizer_step_times=1)
    rows = {row.name: row for row in compare(problem, ["greedy"]).rows}
    variant, greedy = rows["greedy (reductions in turn)"], rows["greedy"]
    assert variant.makespan == greedy.makespan and variant.iteration_time < greedy.iteration_time
    best = min(simulate(problem, each).iteration_time for each in regroupings(generate("greedy", problem)))
    assert variant.iteration_time == pytest.approx(best)


def test_nothing_moves_without_reductions_or_with_a_fused_backward():
    split = Problem(num_devices=2, num_microbatches=3, chunks_per_device=2, placement="v", forward_times=1,
                    backward_times=1, weight_times=1)
    assert reductions_in_turn(split, generate("greedy", split)) is None
    fused = Problem(num_devices=2, num_microbatches=3, chunks_per_device=2, placement="v", forward_times=1,
                    backward_times=2, grad_reduce_times=3)
    assert reductions_in_turn(fused, generate("greedy", fused)) is None
