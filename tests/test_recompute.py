"""Recomputation: the problem's keys, the R op in the simulator, Megatron's and Mario's schedules."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import brute_force_optimum, problems
from zbopt import NotApplicableError, Problem, ProblemError, ScheduleError, ZboptError, generate, simulate, solve
from zbopt.core.errors import DeadlockError
from zbopt.core.ops import Op
from zbopt.core.schedule import Schedule
from zbopt.planning.frontier import memory_frontier
from zbopt.presentation.tables import format_frontier
from zbopt.solvers.blocks.search import optimal_block
from zbopt.solvers.bounds import lower_bounds

SPLIT = dict(forward_times=3, backward_times=4, weight_times=2, recompute_times=5)


def recomputing(p, m, **changes) -> Problem:
    parameters = dict(num_devices=p, num_microbatches=m, allow_recompute=True, checkpoint_memory=0.25, **SPLIT)
    parameters.update(changes)
    return Problem(**parameters)


@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 1), (3, 5), (4, 8), (5, 3), (8, 16)])
def test_megatron_full_recomputation_1f1b_closed_form(p, m):
    """Megatron recomputes inside the backward: 1F1B with each backward costing R more,
    m(F + R + B + W) + (p - 1)(F + R + B) without latency, split backward."""
    F, B, W, R = 3, 4, 2, 5
    result = simulate(recomputing(p, m), generate("1f1b-recompute", recomputing(p, m)))
    assert result.makespan == m * (F + R + B + W) + (p - 1) * (F + R + B)
    fused = recomputing(p, m, weight_times=None)
    assert simulate(fused, generate("1f1b-recompute", fused)).makespan == m * (F + R + 4) + (p - 1) * (F + R + 4)


@pytest.mark.parametrize(("p", "m"), [(3, 5), (4, 8), (4, 2)])
def test_1f1b_recompute_holds_checkpoints_and_one_activation(p, m):
    """Device s has min(p - s, m) microbatches in flight: all but one as checkpoints (0.25)."""
    result = simulate(recomputing(p, m), generate("1f1b-recompute", recomputing(p, m)))
    assert result.peak_memory == pytest.approx([(min(p - s, m) - 1) * 0.25 + 1 for s in range(p)])


def test_recomputing_in_the_bubble_hides_it_in_1f1b():
    """Mario's rules on 1F1B without latency: every stage but the last recomputed, each R as early
    as its device is free, so it runs while its gradient is on its way: shorter than Megatron's
    m(F + R + B + W) + (p - 1)(F + R + B) = 148, and no shorter than device 0's work
    m(F + R + B + W) = 112."""
    p, m = 4, 8
    result = simulate(recomputing(p, m), generate("mario-1f1b", recomputing(p, m)))
    assert set(result.table.recomputed) == {(s, j) for s in range(p - 1) for j in range(m)}
    assert m * (3 + 5 + 4 + 2) <= result.makespan < m * (3 + 5 + 4 + 2) + (p - 1) * (3 + 5 + 4)
    order = [op for op in result.schedule.orders[3] if op.microbatch == 0]
    assert [op.kind for op in order] == ["F", "B", "W"]  # the last stage keeps its activation
    tight = recomputing(p, m, memory_limit=1.5)  # room for 2 checkpoints beside the recomputed activation
    assert max(simulate(tight, generate("mario-1f1b", tight)).peak_memory) == 1.5


def test_mario_warms_up_no_more_than_the_device_before():
    """Device 0 here has room for no checkpoint beside its activation (limit 2 = M_B): without
    capping device 1's warm-up by device 0's, device 1 waits for forwards device 0 never sends."""
    problem = Problem(num_devices=3, num_microbatches=4, forward_times=[3, 1, 2], backward_times=[2, 1, 2],
                      p2p_time=1, activation_memory=[2, 0.5, 1], memory_limit=2, allow_recompute=True,
                      recompute_times=[3, 3, 2], checkpoint_memory=[1, 0, 0])
    result = simulate(problem, generate("mario-1f1b", problem))
    assert result.valid and result.peak_memory[0] == 2
    first_backward = [next(i for i, op in enumerate(order) if op.kind == "BW") for order in result.schedule.orders]
    assert first_backward == [2, 2, 1]  # warm-ups 0, 0, 0 (+ the first pair's forward, and recompute but last)


def test_recomputation_floor_with_two_chunks_is_one_activation_and_a_checkpoint():
    problem = recomputing(4, 8, chunks_per_device=2, placement="v")
    assert problem.min_memory_limit == (1.25,) * 4
    assert problem.one_microbatch_memory == (2.0,) * 4
    assert recomputing(4, 8).min_memory_limit == (1.0,) * 4  # one stage per device: no lower
    with pytest.raises(ProblemError, match=r"one stage's activation and the checkpoints of its earlier stages, "
                                           r"with recomputation \(1.25\)"):
        recomputing(4, 8, chunks_per_device=2, placement="v", memory_limit=1.2)


@pytest.mark.parametrize(("changes", "message"), [
    ({"checkpoint_memory": 2}, r"checkpoint_memory = 2: exceeds activation_memory on virtual stage 0 \(2 > 1\)"),
    ({"checkpoint_memory": -1}, "checkpoint_memory = -1: every value must be >= 0"),
    ({"recompute_times": 0}, "recompute_times = 0: every value must be > 0"),
    ({"allow_recompute": "yes"}, "allow_recompute = 'yes': expected true or false"),
    ({"checkpoint_memory": None}, "allow_recompute = True: needs checkpoint_memory"),
    ({"allow_recompute": False}, "recompute_times = 5: needs allow_recompute: true"),
])
def test_bad_recomputation_keys_are_one_line_errors(changes, message):
    with pytest.raises(ProblemError, match=message):
        recomputing(2, 2, **changes)


def test_the_recompute_defaults_to_the_forward_cost_and_round_trips():
    problem = Problem(num_devices=2, num_microbatches=2, forward_times=[1, 2], allow_recompute=True,
                      checkpoint_memory=0.1)
    assert problem.recompute_times == (1.0, 2.0)
    assert Problem.from_dict(problem.to_dict()) == problem
    assert "allow_recompute" not in Problem(num_devices=2, num_microbatches=2).to_dict()


def test_r_holds_the_rest_of_the_activation_from_its_start():
    """F keeps the checkpoint (0.25), R adds the rest at its start, B and W free as without."""
    problem = recomputing(1, 1)
    result = simulate(problem, Schedule([["0F0", "0R0", "0B0", "0W0"]]))
    times, levels = result.memory_steps[0]
    assert times.tolist() == [0, 3, 12, 14] and levels.tolist() == [0.25, 1.0, 0.5, 0.0]
    assert result.makespan == 3 + 5 + 4 + 2


def test_the_simulator_names_what_is_wrong_with_a_recompute():
    problem = recomputing(2, 1)
    with pytest.raises(DeadlockError, match="device 0 is stuck at 0B0, waiting for its recompute 0R0"):
        simulate(problem, Schedule([["0F0", "0B0", "0R0", "0W0"], ["1F0", "1B0", "1W0"]]))
    with pytest.raises(ScheduleError, match="0R0: recomputation is not allowed in this problem"):
        simulate(problem.replace(allow_recompute=False, recompute_times=None, checkpoint_memory=None),
                 Schedule([["0F0", "0R0", "0B0", "0W0"], ["1F0", "1B0", "1W0"]]))
    timed = Schedule([["0F0", "0B0", "0R0", "0W0"], ["1F0", "1B0", "1W0"]], [[0, 10, 14, 19], [3, 6, 10]])
    with pytest.raises(ScheduleError, match="0B0 starts at 10, before its recompute 0R0 ends at 19"):
        simulate(problem, timed)
    with pytest.raises(ScheduleError, match="0R0 appears twice"):
        simulate(problem, Schedule([["0F0", "0R0", "0R0", "0B0", "0W0"], ["1F0", "1B0", "1W0"]]))


def test_r_has_a_text_form():
    assert Op.from_str("3R1") == Op("R", 3, 1) and str(Op("R", 0, 12)) == "0R12"


@pytest.mark.parametrize("problem", [
    # p = 2, m = 2, fused: keeping both activations on device 0 does not fit
    Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2, recompute_times=1,
            memory_limit=1.2, allow_recompute=True, checkpoint_memory=0.1),
    # two chunks on one device: the floor with recomputation (1.5) is below keeping (2)
    Problem(num_devices=1, num_microbatches=2, chunks_per_device=2, forward_times=[1, 2], backward_times=[2, 1],
            recompute_times=[1, 1], memory_limit=1.5, allow_recompute=True, checkpoint_memory=0.5),
    # below one activation and a checkpoint: nothing overlaps on a device
    Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2, memory_limit=1.0,
            allow_recompute=True, checkpoint_memory=0.1),
    # split backward, recompute cheaper than the forward, a latency
    Problem(num_devices=2, num_microbatches=2, forward_times=2, backward_times=2, weight_times=1, recompute_times=1,
            p2p_time=1, memory_limit=1.5, allow_recompute=True, checkpoint_memory=0.25),
])
def test_cpsat_agrees_with_brute_force_over_choices_and_orders(problem):
    """Every recompute choice and every order of every device, against the optimizer: an unsound
    symmetry breaking or memory fact would make CP-SAT claim a worse optimum."""
    expected = brute_force_optimum(problem)
    result = solve(problem, time_limit=30)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(expected)
    assert max(result.bounds.values()) <= expected + 1e-9


def test_at_the_floor_without_a_warm_start_the_optimizer_still_finds_a_schedule():
    """Limit 2 = stage 0's activation: no heuristic keeping every activation fits (keeping both
    stages needs 3). One microbatch at a time, stage 0 recomputed, fits (0.2 + 1, then 0.2 + 1.8);
    without a warm start to bound it, the model's horizon must leave room for the recomputes (it
    once said 'infeasible')."""
    problem = Problem(num_devices=1, num_microbatches=3, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=[2, 3], weight_times=2, activation_memory=[2, 1], weight_memory=[1, 0.5],
                      memory_limit=2, allow_recompute=True, recompute_times=[3, 2], checkpoint_memory=[0.2, 0.1])
    serial = Schedule([[op for j in range(3) for op in (f"0F{j}", f"1F{j}", f"1B{j}", f"1W{j}", f"0R{j}", f"0B{j}",
                                                          f"0W{j}")]])
    one_at_a_time = simulate(problem, serial, strict=True).makespan
    result = solve(problem, time_limit=20, use_warm_start=False)
    assert result.status == "optimal"
    assert result.lower_bound <= result.objective <= one_at_a_time == 3 * (1 + 1 + 3 + 2 + 3 + 2 + 2)


def test_with_memory_to_spare_the_optimum_recomputes_nothing_and_equals_the_one_without():
    """A recompute only adds work: with no binding limit the optimum is the one without the
    mechanism, and the answer carries no recompute that does not pay."""
    problem = recomputing(3, 4, p2p_time=0.5, memory_limit=12)
    result = solve(problem, time_limit=20)
    kept = solve(problem.replace(allow_recompute=False, recompute_times=None, checkpoint_memory=None), time_limit=20)
    assert result.status == kept.status == "optimal" and result.objective == kept.objective
    assert result.simulation.table.recomputed == ()


def test_the_frontier_counts_what_each_limit_recomputes():
    """p = 2, m = 3, fused, F = 1, BW = 2, R = 2: at limit 1.2 device 0 cannot keep two
    activations, so its answer recomputes and is slower; at 2 keeping them fits: 1F1B's
    (m + p - 1)(F + BW) = 12."""
    problem = Problem(num_devices=2, num_microbatches=3, forward_times=1, backward_times=2, recompute_times=2,
                      allow_recompute=True, checkpoint_memory=0.1)
    frontier = memory_frontier(problem, [1.2, 2.0], time_limit=10, executor=ThreadPoolExecutor(1))
    at_floor, roomy = frontier.points
    assert at_floor.recomputed >= 1 and at_floor.makespan > 12
    assert roomy.recomputed == 0 and roomy.makespan == 12
    assert "recomputed" in format_frontier(frontier)


@pytest.mark.parametrize(("schedule", "changes", "message"), [
    ("1f1b-recompute", {"chunks_per_device": 2}, "1f1b-recompute: 1f1b needs chunks_per_device = 1"),
    ("interleaved-1f1b-recompute", {}, "interleaved-1f1b-recompute: interleaved-1f1b needs chunks_per_device >= 2"),
    ("mario-1f1b", {"allow_recompute": False, "checkpoint_memory": None, "recompute_times": None},
     "mario-1f1b needs allow_recompute: true"),
])
def test_a_recomputing_schedule_names_itself_when_it_does_not_apply(schedule, changes, message):
    with pytest.raises(NotApplicableError, match=message):
        generate(schedule, recomputing(4, 8, **changes))


def test_the_block_search_refuses_recomputation():
    with pytest.raises(ZboptError, match="the block search keeps every activation"):
        optimal_block(recomputing(2, 4, memory_limit=1.2), time_limit=1)


@settings(max_examples=25, deadline=None)
@given(problems(max_devices=2, max_microbatches=2, recompute=True), st.sampled_from([1.0, 1.2, 1.5, 2.0]))
def test_no_bound_exceeds_the_brute_force_optimum_with_recomputation(problem, factor):
    """Every choice and every order of tiny problems, near the floor where recomputation matters."""
    limited = problem.replace(memory_limit=factor * max(problem.min_memory_limit))
    assert lower_bounds(limited).best <= brute_force_optimum(limited) + 1e-9


def test_serial_recompute_fits_the_least_limit_and_gives_the_optimizer_a_start():
    """One microbatch at a time: on one device its makespan is all the work, every stage but the
    last recomputed; its peak is the floor exactly. V placement, v = 2, at that floor (0.5 + 0.03):
    no other heuristic fits, and the optimizer starts from it."""
    one = Problem(num_devices=1, num_microbatches=3, chunks_per_device=2, forward_times=[1, 2], backward_times=[2, 3],
                  weight_times=1, recompute_times=[4, 5], allow_recompute=True, checkpoint_memory=[0.25, 0.5])
    result = simulate(one, generate("serial-recompute", one))
    assert result.makespan == 3 * (1 + 2 + 2 + 3 + 1 + 1 + 4)
    assert result.peak_memory == one.min_memory_limit == (1.25,)
    vee = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", forward_times=9,
                  backward_times=9, weight_times=4.5, p2p_time=0.6, activation_memory=0.5, allow_recompute=True,
                  checkpoint_memory=0.03, memory_limit=0.53)
    serial = simulate(vee, generate("serial-recompute", vee))
    assert serial.valid and max(serial.peak_memory) == pytest.approx(0.53)
    answer = solve(vee, time_limit=4)  # it proves nothing here: the assertions hold at any time
    assert answer.warm_start == "serial-recompute" and answer.objective <= serial.makespan
