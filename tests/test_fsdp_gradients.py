"""FSDP's unsharded gradients (issue 44, `gradient_memory`): a stage's gradients are held from the
start of its first gradient op (W, or BW) of an iteration until its reduction ends. Hand-computed
memory, the floor (below it an exact search finds nothing), CP-SAT against an exact search over
timed schedules (waits included: a forward held back until a reduction frees room), the
simulator's order of a device's reductions in the model, and the heuristics' promises."""

import pytest

import zbopt.core.problem.memory_floor as memory_floor
from tests.reference import brute_force_optimum, timed_search_with_gradients
from zbopt import Problem, ProblemError, Schedule, ZboptError, generate, simulate, solve
from zbopt.core.ops import Op
from zbopt.schedules.registry import get
from zbopt.solvers.bounds import lower_bounds

UNIT = dict(forward_times=1, backward_times=1, weight_times=1)


def _orders(*texts: str) -> Schedule:
    return Schedule([[Op.from_str(text) for text in order.split()] for order in texts])


def test_the_gradients_are_held_from_the_first_gradient_op_until_the_reduction_ends():
    """By hand, one device, m = 2, F = B = W = 1, M_B 1 (M_W 0.5), gradients 3, reduction 2: F's
    0-1 and 1-2 (1, 2), B 2-3 frees 0.5, W 3-4 takes the gradients at its start (4.5) and frees
    0.5 at its end (4), B 4-5 (3.5), W 5-6 (3), the reduction 6-8 frees the gradients (0)."""
    problem = Problem(num_devices=1, num_microbatches=2, **UNIT, gradient_memory=3, grad_reduce_times=2)
    result = simulate(problem, _orders("0F0 0F1 0B0 0W0 0B1 0W1"))
    times, levels = result.memory_steps[0]
    assert times.tolist() == [0.0, 1.0, 3.0, 4.0, 5.0, 6.0, 8.0]
    assert levels.tolist() == [1.0, 2.0, 4.5, 4.0, 3.5, 3.0, 0.0]
    assert (result.peak_memory, result.makespan, result.iteration_time) == ((4.5,), 6.0, 8.0)


def test_a_reduction_that_outlasts_the_other_devices_drain_holds_its_gradients():
    """By hand, p = 2, m = 1, gradients 2 and 1, reductions 1 and 3: device 1's B ends and its W
    takes the gradients at 3 (0.5 + 1), and it reduces 4-7, past device 0's W at 4-5, which takes 2
    (0.5 + 2, its peak: 1 without gradients) and reduces 5-6. The iteration ends at 7, the pipeline
    at 5."""
    problem = Problem(num_devices=2, num_microbatches=1, **UNIT, gradient_memory=[2, 1], grad_reduce_times=[1, 3])
    result = simulate(problem, generate("1f1b", problem))
    assert result.ends.reduce[0] == ((5.0, 6.0), (4.0, 7.0))
    assert [times.tolist() for times, _ in result.memory_steps] == [[0.0, 4.0, 5.0, 6.0], [1.0, 3.0, 4.0, 7.0]]
    assert [levels.tolist() for _, levels in result.memory_steps] == [[1.0, 2.5, 2.0, 0.0], [1.0, 1.5, 1.0, 0.0]]
    assert (result.peak_memory, result.makespan, result.iteration_time) == ((2.5, 1.5), 5.0, 7.0)
    assert simulate(problem.replace(gradient_memory=None), generate("1f1b", problem)).peak_memory == (1.0, 1.0)


def test_the_floor_counts_the_gradients_around_the_first_gradient_op_and_nothing_fits_below_it():
    """The example above: when its first W starts, either the other microbatch's forward is still
    to come (its whole activation 1 beside the gradients 3 then) or both forwards have run (0.5
    each): 4. It is met: F0 B0 W0 F1 B1 W1 holds 4 when F1 starts, and ends at 6 + the reduction."""
    problem = Problem(num_devices=1, num_microbatches=2, **UNIT, gradient_memory=3, grad_reduce_times=2)
    assert problem.min_memory_limit == (4.0,)
    with pytest.raises(ProblemError, match=r"memory_limit = 3.5: device 0 must hold one microbatch's activations on "
                                           r"its stages and its gradients \(gradient_memory\) \(4\)"):
        problem.replace(memory_limit=3.5)
    assert timed_search_with_gradients(problem.replace(memory_limit=4)) == 8.0


@pytest.mark.parametrize("kind", ["split", "fused"])
def test_no_schedule_fits_below_the_floor(monkeypatch, kind):
    """Problems with several chunks and microbatches: just below the floor (its check set aside)
    the exact search over timed schedules finds none."""
    costs = UNIT if kind == "split" else dict(forward_times=1, backward_times=2)
    problems = [Problem(num_devices=1, num_microbatches=2, chunks_per_device=2, **costs, gradient_memory=[2, 1],
                        grad_reduce_times=[1, 2], activation_memory=[1, 2]),
                Problem(num_devices=2, num_microbatches=3, **costs, gradient_memory=[1, 3], grad_reduce_times=2)]
    monkeypatch.setattr(memory_floor, "check_memory_limit", lambda problem: None)
    for problem in problems:
        below = problem.replace(memory_limit=[floor - 0.25 for floor in problem.min_memory_limit])
        assert timed_search_with_gradients(below) == float("inf")


TINY = [
    # a wait pays: no order timed as soon as possible fits, a forward held back until a reduction does
    Problem(num_devices=1, num_microbatches=2, chunks_per_device=2, forward_times=[2, 1], backward_times=[1, 2],
            weight_times=[1, 2], grad_reduce_times=[3, 1], gradient_memory=[2, 3], memory_limit=4),
    Problem(num_devices=2, num_microbatches=2, **UNIT, grad_reduce_times=[1, 2], gradient_memory=[2, 1],
            memory_limit=[3.5, 3], optimizer_step_times=1),
    Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2, grad_reduce_times=[2, 1],
            gradient_memory=[1, 2], memory_limit=3, p2p_time=1),
    Problem(num_devices=2, num_microbatches=1, chunks_per_device=2, forward_times=[2, 1, 2, 1],
            backward_times=[1, 2, 2, 1], weight_times=[1, 1, 2, 2], grad_reduce_times=[1, 1, 2, 1],
            gradient_memory=[2, 2, 3, 2], optimizer_step_times=1, memory_limit=4.5),
]


@pytest.mark.parametrize("problem", TINY, ids=lambda p: p.describe())
def test_cpsat_meets_the_exact_search_and_the_bounds_stay_below(problem):
    optimum = timed_search_with_gradients(problem)
    assert optimum <= brute_force_optimum(problem)  # every order timed as soon as possible
    result = solve(problem, "cpsat", time_limit=30)
    assert result.status == "optimal" and result.objective == pytest.approx(optimum)
    assert result.simulation.iteration_time == pytest.approx(optimum) and result.simulation.valid
    assert lower_bounds(problem).best <= optimum + 1e-9


def test_the_optimizer_waits_where_no_order_fits_as_soon_as_possible():
    """The first tiny problem: every order timed as soon as possible breaks the limit; the answer
    holds an op back until a reduction has freed room, and keeps its own times."""
    assert brute_force_optimum(TINY[0]) == float("inf")
    result = solve(TINY[0], "cpsat", time_limit=30)
    assert result.simulation.valid and result.objective == timed_search_with_gradients(TINY[0])
    assert not simulate(TINY[0], result.simulation.schedule.without_times()).valid


def test_the_model_runs_a_devices_reductions_in_the_simulators_order():
    """Three chunks on one device, stage 0's W long: stage 2's reduction (4) is ready at 5 and
    stage 1's (1) at 7, when the simulator starts it after stage 2's, so stage 1's gradients (3)
    stay until 10, beside stage 0's (5) taken at 8. Taken the other way round the lane would free
    them at 8; the model must not count on that (an answer at 17 it claimed broke the limit of 9
    in the simulator)."""
    problem = Problem(num_devices=1, num_microbatches=1, chunks_per_device=3, forward_times=1, backward_times=1,
                      weight_times=[8, 1, 1], grad_reduce_times=[1, 1, 4], gradient_memory=[5, 3, 1], memory_limit=9)
    optimum = timed_search_with_gradients(problem)
    result = solve(problem, "cpsat", time_limit=30)
    assert result.status == "optimal" and result.objective == optimum == 17.0
    assert max(result.simulation.peak_memory) <= 9


def test_the_milp_refuses_the_gradients_naming_them():
    with pytest.raises(ZboptError, match=r"the MILP does not model FSDP's unsharded gradients \(gradient_memory\)"):
        solve(TINY[1], "highs", time_limit=5)


def test_the_serial_fallback_promises_its_floor_and_all_of_a_devices_gradients():
    """Serial-offload runs microbatch 1's forwards with microbatch 0's gradients held: device 0
    its activation 1 and gradients 2, device 1 (its last stage keeps its activation) 1 and 3."""
    problem = Problem(num_devices=2, num_microbatches=2, **UNIT, gradient_memory=[2, 3], grad_reduce_times=1,
                      allow_offload=True, offload_times=1, memory_limit=4)
    assert get("serial-offload").peak_memory_bound(problem) == (3.0, 4.0)
    assert simulate(problem, generate("serial-offload", problem)).peak_memory == (3.0, 4.0)


def test_zb_v_counts_the_gradients_as_held_from_the_start_and_keeps_its_orders():
    """ZB-V's greedy caps its activations at 1F1B's; with the gradients on both sides (held from
    the start, and in the cap) it builds the orders it builds without them, and its simulated peak,
    gradients included, stays within that cap."""
    plain = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="v", **UNIT,
                    grad_reduce_times=2)
    held = plain.replace(gradient_memory=[2, 1, 1, 2])
    assert generate("zb-v", held).orders == generate("zb-v", plain).orders
    peaks = simulate(held, generate("zb-v", held)).peak_memory
    assert all(peak <= cap for peak, cap in zip(peaks, (4 + 2 + 2, 4 + 1 + 1), strict=True))


def test_with_a_split_backward_the_floor_counts_only_the_stages_own_parameters_at_its_first_w():
    """Stage 1's first W may wait until stage 0's W has freed stage 0's parameters (5): 0F0 1F0 1B0
    0B0 0W0 1W0 holds stage 1's gradients (10) and its W's kept half activation, 10.5, which the
    floor is (it said 15.5 counting stage 0's parameters, and refused this schedule's limit)."""
    problem = Problem(num_devices=1, num_microbatches=1, chunks_per_device=2, **UNIT, unshard_memory=[5, 0],
                      gradient_memory=[0, 10])
    assert problem.min_memory_limit == (10.5,)
    assert simulate(problem, _orders("0F0 1F0 1B0 0B0 0W0 1W0")).peak_memory == (10.5,)


def test_zero_bubbles_limits_count_fsdps_memory_on_top_and_keep_their_orders():
    """ZB-1p and ZB-2p cap activations at p and 2p M_B: with FSDP's parameters and gradients on top
    (held from the start by the greedy, and in the cap) the orders are those without them, and the
    simulated peaks stay within the promise."""
    plain = Problem(num_devices=4, num_microbatches=8, **UNIT, grad_reduce_times=1)
    held = plain.replace(unshard_memory=2, gradient_memory=1)
    for name in ("zb-1p", "zb-2p"):
        assert generate(name, held).orders == generate(name, plain).orders
        promised = get(name).peak_memory_bound(held)
        assert all(peak <= bound for peak, bound in zip(simulate(held, generate(name, held)).peak_memory, promised,
                                                         strict=True))


def test_the_greedy_stays_within_the_limit_with_the_gradients_its_ws_take():
    """The greedy caps forwards only; a stage's first W takes its gradients at its start, which it
    counts from the start instead (it broke the limit 1.5: its peak was 2)."""
    problem = Problem(num_devices=2, num_microbatches=4, forward_times=[1, 3], backward_times=[3, 1],
                      weight_times=[2, 3], grad_reduce_times=[1, 3], gradient_memory=[0.5, 1], memory_limit=[1.5, 2])
    assert simulate(problem, generate("greedy", problem)).valid
