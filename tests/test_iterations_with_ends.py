"""Several iterations with their ends (issue 44): each device's optimizer step is its flush, the
next iteration's forwards wait for it and, with FSDP, for their stage's unshard gathered again
after it. Hand-computed times, verified start times, deadlocks named, the solvers against brute
force and the bounds below the optimum."""

import itertools

import pytest

from tests.reference import brute_force_optimum
from zbopt import DeadlockError, Problem, Schedule, ScheduleError, simulate, solve
from zbopt.core.ops import Op
from zbopt.schedules import generate
from zbopt.schedules.common import repeat_per_iteration
from zbopt.schedules.reductions import reductions_in_turn
from zbopt.solvers.bounds import lower_bounds

# p = 2, m = 2, F = B = W = 1, two iterations: 1F1B with each W after its B, iteration by iteration
ONE_ITERATION = [["0F{0}", "0F{1}", "0B{0}", "0W{0}", "0B{1}", "0W{1}"], ["1F{0}", "1B{0}", "1W{0}", "1F{1}", "1B{1}",
                                                                       "1W{1}"]]
TWICE = Schedule([[Op.from_str(text.format(2 * k, 2 * k + 1)) for k in range(2) for text in order]
                  for order in ONE_ITERATION])
FSDP = Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1, iterations=2,
               grad_reduce_times=[2, 1], optimizer_step_times=[1, 0.5], unshard_times=1, unshard_memory=1)


def test_the_next_iteration_waits_for_the_step_and_the_unshard_after_it():
    """By hand. Iteration 0: unshards 0-1; device 0 F0 1-2, F1 2-3, B0 4-5, W0 5-6, B1 7-8, W1 8-9,
    reduces 9-11, steps 11-12; device 1 F0 2-3, B0 3-4, W0 4-5, F1 5-6, B1 6-7, W1 7-8, reduces
    8-9, steps 9-9.5. Iteration 1: device 0 gathers 12-13, F2 13-14, F3 14-15; device 1 gathers
    9.5-10.5, F2 14-15 (after device 0's), B2 15-16, W2 16-17, F3 17-18, B3 18-19, W3 19-20;
    device 0 B2 16-17, W2 17-18, B3 19-20, W3 20-21, reduces 21-23, steps 23-24; device 1
    reduces 20-21, steps 21-21.5."""
    result = simulate(FSDP, TWICE)
    assert result.ends.step == (((11.0, 12.0), (9.0, 9.5)), ((23.0, 24.0), (21.0, 21.5)))
    assert result.ends.unshard[1] == ((12.0, 13.0), (9.5, 10.5))
    assert result.times_of(Op.from_str("0F2")) == (13.0, 14.0)
    assert result.makespan == 21.0 and result.iteration_time == 24.0
    # device 0 holds its gathered weights and two activations in both iterations (none between 9 and 12)
    assert result.peak_memory == (3.0, 2.0)
    times, levels = result.memory_steps[0]
    resharded = times.tolist().index(9.0)
    assert levels[resharded] == 0.0 and times[resharded + 1] == 12.0


def test_given_start_times_are_verified_against_the_step():
    timed = simulate(FSDP, TWICE).timed_orders()
    assert simulate(FSDP, timed).iteration_time == 24.0
    early = [list(times) for times in timed.start_times]
    early[0][6] -= 0.5  # 0F2 at 12.5, before its unshard after device 0's step ends at 13
    with pytest.raises(ScheduleError, match=r"0F2 starts at 12.5, before its stage's unshard .* ends at 13"):
        simulate(FSDP, Schedule(timed.orders, early))


def test_an_order_that_runs_the_next_iteration_before_the_step_is_a_named_deadlock():
    """v = 2 on one device: the flush of the weight update is per stage, the step's per device."""
    problem = Problem(num_devices=1, num_microbatches=1, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1, iterations=2, grad_reduce_times=1)
    order = ["0F0", "1F0", "1B0", "1W0", "0B0", "0F1", "0W0", "1F1", "1B1", "1W1", "0B1", "0W1"]
    with pytest.raises(DeadlockError, match=r"stuck at 0F1, waiting for the optimizer step of device 0 after "
                                            r"iteration 0 \(still needs 0W0\)"):
        simulate(problem, Schedule([[Op.from_str(text) for text in order]]))


TINY = dict(num_devices=2, num_microbatches=1, forward_times=[1, 2], backward_times=1, weight_times=[2, 1],
            iterations=3)
TINY_SEVERAL = [
    Problem(**TINY, grad_reduce_times=[3, 1], optimizer_step_times=0.5),
    Problem(**TINY, unshard_times=[1, 2], unshard_memory=[2, 1], grad_reduce_times=1, memory_limit=[3.5, 3]),
    Problem(num_devices=1, num_microbatches=1, chunks_per_device=2, forward_times=[1, 2], backward_times=1,
            weight_times=[1, 0.5], grad_reduce_times=[2, 3], optimizer_step_times=1, iterations=3),
    Problem(num_devices=1, num_microbatches=1, chunks_per_device=2, forward_times=[1, 2], backward_times=1,
            weight_times=[1, 0.5], grad_reduce_times=[2, 3], unshard_times=[1, 0.5], unshard_memory=1,
            optimizer_step_times=1, iterations=3, memory_limit=4),
    Problem(num_devices=2, num_microbatches=1, forward_times=1, backward_times=2, grad_reduce_times=[2, 0.5],
            p2p_time=0.5, iterations=3, optimizer_step_times=[0, 1]),
]


@pytest.mark.parametrize("problem", TINY_SEVERAL, ids=lambda p: p.describe())
def test_the_solvers_meet_brute_force_over_several_iterations(problem):
    optimum = brute_force_optimum(problem)
    assert lower_bounds(problem).best <= optimum + 1e-9
    result = solve(problem, "cpsat", time_limit=30)
    assert result.status == "optimal" and result.simulation.iteration_time == pytest.approx(optimum)
    if not any(problem.iteration_ends.unshard_memory):  # the MILP does not model the gathered memory
        found = solve(problem, "highs", time_limit=30, use_warm_start=False)
        assert found.status == "optimal" and found.objective == pytest.approx(optimum)


def test_the_bound_counts_a_cycle_per_iteration():
    """p = 1, one stage, m = 1, F = B = W = 1, reduction 2, step 1: each iteration runs its three
    ops, reduces and steps, 6 in all, one after another: the bound is the optimum, 6 per iteration."""
    for iterations in (1, 2, 4):
        problem = Problem(num_devices=1, num_microbatches=1, forward_times=1, backward_times=1, weight_times=1,
                          grad_reduce_times=2, optimizer_step_times=1, iterations=iterations)
        assert lower_bounds(problem)["iteration_ends"] == 6.0 * iterations
        assert simulate(problem, generate("1f1b", problem)).iteration_time == 6.0 * iterations


def test_reductions_in_turn_regroup_every_iterations_tail_as_well_as_any_order_of_them():
    """p = 2, v = 2, two iterations, reductions 6, 2, 2, 6: the greedy's one-iteration order run
    twice, with the W at each iteration's end reordered by stage in every way; the variant is the
    best of them, and better than the greedy's own (its W of both chunks end interleaved)."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1, iterations=2, grad_reduce_times=[6, 2, 2, 6], optimizer_step_times=1)
    schedule = repeat_per_iteration(problem, generate("greedy", problem.replace(iterations=1)).orders)
    variant = reductions_in_turn(problem, schedule)
    best = min(simulate(problem, Schedule(orders)).iteration_time for orders in _tail_orders(problem, schedule))
    assert simulate(problem, variant).iteration_time == pytest.approx(best)
    assert best < simulate(problem, schedule).iteration_time


def _tail_orders(problem: Problem, schedule: Schedule):
    """Every device order with each iteration's trailing W grouped by stage, in every stage order."""
    per_device = []
    for order in schedule.orders:
        choices = []
        for k in range(problem.iterations):
            part = [op for op in order if op.microbatch // problem.num_microbatches == k]
            kept = len(part)
            while kept and part[kept - 1].kind == "W":
                kept -= 1
            stages = sorted({op.stage for op in part[kept:]})
            choices.append([part[:kept] + [op for stage in turn for op in part[kept:] if op.stage == stage]
                            for turn in itertools.permutations(stages)])
        per_device.append([list(itertools.chain(*parts)) for parts in itertools.product(*choices)])
    return itertools.product(*per_device)


def test_the_windows_repeat_in_every_iteration():
    result = simulate(FSDP, TWICE)
    names = [window.name for window in result.ends.windows(FSDP)]
    assert names == ["0UNSHARD", "1UNSHARD", "0REDUCE_GRAD", "1REDUCE_GRAD", "optimizer step", "optimizer step"] * 2


def test_the_first_stages_device_cycles_once_per_iteration():
    """p = 2, m = 1, F = B = W = 1, reduction 1, step 1: device 0 runs F 0-1, waits for device 1's
    F and B (1-3), runs B 3-4 and W 4-5, reduces 5-6 and steps 6-7; the next iteration's forward
    waits for that step, so K iterations take 7K, which the bound proves (device 0's cycle, then
    a last pipeline of 5, a reduction and a step: 7(K - 1) + 5 + 2)."""
    for iterations in (1, 2, 3):
        problem = Problem(num_devices=2, num_microbatches=1, forward_times=1, backward_times=1, weight_times=1,
                          grad_reduce_times=1, optimizer_step_times=1, iterations=iterations)
        assert lower_bounds(problem)["iteration_ends"] == 7.0 * iterations
        assert simulate(problem, generate("1f1b", problem)).iteration_time == 7.0 * iterations


RECOMPUTED = Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1,
                     allow_recompute=True, checkpoint_memory=0.1, recompute_times=0.1, memory_limit=[1.1, 10],
                     iterations=2, grad_reduce_times=0.5)


def test_with_recomputation_the_bounds_stay_below_a_schedule_that_recomputes():
    """Device 0 holds 1.1: one activation and a checkpoint. Mario's 1F1B recomputes and ends at 17;
    device sequencing, which keeps every activation, would claim 18 (it is left out there)."""
    reached = simulate(RECOMPUTED, generate("mario-1f1b", RECOMPUTED))
    assert reached.valid and reached.iteration_time == 17.0
    assert lower_bounds(RECOMPUTED).best <= 17.0
    found = solve(RECOMPUTED, "cpsat", time_limit=30)  # the ends beside optional recomputes in the model
    assert found.status == "optimal" and lower_bounds(RECOMPUTED).best <= found.objective <= 17.0
    two_chunks = Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, placement="v", forward_times=1,
                         backward_times=1, weight_times=1, allow_recompute=True, checkpoint_memory=0.1,
                         recompute_times=0.1, memory_limit=1.1, iterations=2, grad_reduce_times=0.5)
    serial = simulate(two_chunks, generate("serial-recompute", two_chunks))  # it crashed the bounds before
    assert lower_bounds(two_chunks).best <= serial.iteration_time


def test_serial_offload_waits_for_each_step_before_the_next_iteration():
    """The least-memory warm start with offload: its given start times pass the simulator's check of
    every forward of iteration 1 against its device's step."""
    problem = Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1,
                      allow_offload=True, offload_times=0.1, memory_limit=[1.5, 10], iterations=2,
                      grad_reduce_times=0.5, unshard_times=0.25)
    result = simulate(problem, generate("serial-offload", problem))
    step = max(end for _, end in result.ends.step[0])
    assert result.valid and min(result.times_of(Op.from_str(f"{s}F2"))[0] for s in (0, 1)) >= step
    assert solve(problem, "cpsat", time_limit=30).objective <= result.iteration_time


def test_the_span_objective_with_unshards_keeps_the_models_times():
    """As soon as possible, a device's first chunk would start at its gather's end while its second
    waits for its own: the span the model kept short would grow; the answer keeps the model's times."""
    problem = Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, forward_times=1, backward_times=2,
                      weight_times=1, unshard_times=[0.5, 2, 2, 0.5], grad_reduce_times=1)
    found = solve(problem, "cpsat", objective="span", time_limit=30)  # raised before: 18.5 exceeds the model's 18
    assert found.status == "optimal" and max(found.simulation.span) == pytest.approx(found.objective)
