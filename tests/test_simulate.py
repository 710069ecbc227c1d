import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reference import brute_force_peak_memory, longest_path_starts, problems, random_topological_schedule
from zbopt import DeadlockError, MemoryLimitError, Op, Problem, Schedule, ScheduleError, generate, simulate

GRID = [(p, m) for p in range(1, 7) for m in range(1, 13)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), GRID)
def test_makespan_closed_form_without_latency(name, p, m):
    f, b, w = 1.25, 1.5, 0.75
    # the form (m+p-1)(F+B+W): the backward as one op costing B+W
    fused = Problem(num_devices=p, num_microbatches=m, forward_times=f, backward_times=b + w)
    assert simulate(fused, generate(name, fused)).makespan == pytest.approx((m + p - 1) * (f + b + w))
    # split, W straight after B: the gradient travels on after B, so the drain saves (p-1)W
    split = fused.replace(backward_times=b, weight_times=w)
    assert simulate(split, generate(name, split)).makespan == pytest.approx((m + p - 1) * (f + b) + m * w)


@pytest.mark.parametrize(("p", "m"), GRID)
def test_1f1b_bubble_rates(p, m):
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=1, backward_times=1, weight_times=1)
    fused = problem.replace(weight_times=None, weight_memory=None, backward_times=2)
    result = simulate(fused, generate("1f1b", fused))
    assert result.bubble_rate == pytest.approx((p - 1) / (m + p - 1))
    assert result.zb_bubble_rate == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("c", [0.05, 0.4, 3.0])
def test_1f1b_makespan_with_latency_fused(p, m, c):
    """Fused 1F1B, uniform F and B, latency c:
        makespan = (m+p-1)(F+B) + 2c(p-1) + 2c·ceil((p-1)(m-2)/p).
    2c(p-1): the first forward goes down and the last backward comes up through p-1 links.
    The steady state pays more: in 1F1B device 0 runs F(j+p) right after B(j), and microbatch j's
    ring (down p stages and back up) takes p(F+B) + 2(p-1)c while device 0 does p steps of F+B,
    so each step waits 2c(p-1)/p on average. The warm-up covers the first two microbatches; whole
    waits over the remaining m-2 give the ceiling. (Checked for c from 0.05 to 20 over this grid.)"""
    f, b = 1.0, 2.0
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=f, backward_times=b, p2p_time=c)
    expected = (m + p - 1) * (f + b) + 2 * c * ((p - 1) + math.ceil((p - 1) * (m - 2) / p))
    assert simulate(problem, generate("1f1b", problem)).makespan == pytest.approx(expected)


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("c", [0.0, 0.2, 0.5])
def test_1f1b_makespan_with_latency_split(p, m, c):
    """Split 1F1B (W right after B), latency c <= W/2:  makespan = (m+p-1)(F+B) + mW + 2c(p-1).
    The ring through all devices now takes p(F+B) + W + 2(p-1)c over p steps of p(F+B+W) on
    device 0, which fits when (p-1)W >= 2(p-1)c: W hides the latency, only fill and drain pay it."""
    f, b, w = 1.0, 2.0, 1.0
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=f, backward_times=b, weight_times=w,
                      p2p_time=c)
    expected = (m + p - 1) * (f + b) + m * w + 2 * c * (p - 1)
    assert simulate(problem, generate("1f1b", problem)).makespan == pytest.approx(expected)


@pytest.mark.parametrize(("p", "m"), GRID)
def test_peak_memory_of_1f1b_and_gpipe(p, m):
    problem = Problem(num_devices=p, num_microbatches=m, weight_times=1, activation_memory=2.0, weight_memory=0.5)
    one_f_one_b = simulate(problem, generate("1f1b", problem)).peak_memory
    assert one_f_one_b == pytest.approx([2.0 * min(p - d, m) for d in range(p)])  # p·M_B on device 0 when m >= p
    assert simulate(problem, generate("gpipe", problem)).peak_memory == pytest.approx([2.0 * m] * p)


def test_iterations_repeat_a_flush_schedule_back_to_back():
    single = Problem(num_devices=4, num_microbatches=6, forward_times=1, backward_times=2, p2p_time=0.1)
    for name in ("gpipe", "1f1b"):
        once = simulate(single, generate(name, single)).makespan
        triple = single.replace(iterations=3)
        assert simulate(triple, generate(name, triple)).makespan == pytest.approx(3 * once)


# ------------------------------------------------------------------ broken schedules
def _fused_1f1b(p=3, m=3):
    problem = Problem(num_devices=p, num_microbatches=m)
    return problem, [list(order) for order in generate("1f1b", problem).orders]


def test_missing_op_is_named_with_its_device():
    problem, orders = _fused_1f1b()
    orders[1].remove(Op("BW", 1, 2))
    with pytest.raises(ScheduleError, match=r"op 1BW2 \(device 1\) is missing"):
        simulate(problem, Schedule(orders))


def test_duplicate_op_is_named():
    problem, orders = _fused_1f1b()
    orders[2].append(Op("F", 2, 0))
    with pytest.raises(ScheduleError, match="op 2F0 appears twice on device 2"):
        simulate(problem, Schedule(orders))


def test_op_on_the_wrong_device_is_named():
    problem, orders = _fused_1f1b()
    orders[0].append(orders[1].pop())
    with pytest.raises(ScheduleError, match="op 1BW2 is on device 0, but stage 1 runs on device 1"):
        simulate(problem, Schedule(orders))


@pytest.mark.parametrize(
    ("bad", "message"),
    [(Op("W", 0, 0), "kind W does not exist"), (Op("F", 7, 0), "stage 7 out of range"),
     (Op("F", 0, 9), "microbatch 9 out of range")],
)
def test_unknown_ops_are_named(bad, message):
    problem, orders = _fused_1f1b()
    orders[0].append(bad)
    with pytest.raises(ScheduleError, match=message):
        simulate(problem, Schedule(orders))


def test_wrong_number_of_devices():
    problem, orders = _fused_1f1b()
    with pytest.raises(ScheduleError, match="orders for 2 devices, the problem has 3"):
        simulate(problem, Schedule(orders[:2]))


def test_deadlock_names_the_devices_and_what_they_wait_for():
    problem, orders = _fused_1f1b()
    # device 0 wants the backward of microbatch 0 before it has sent microbatch 0 forward
    orders[0].remove(Op("BW", 0, 0))
    orders[0].insert(0, Op("BW", 0, 0))
    with pytest.raises(DeadlockError) as error:
        simulate(problem, Schedule(orders))
    message = str(error.value)
    assert "device 0 is stuck at 0BW0, waiting for 1BW0 (device 1)" in message
    assert "device 1 is stuck at 1F0, waiting for 0F0 (device 0)" in message


def test_deadlock_on_the_weight_update_between_iterations():
    problem = Problem(num_devices=2, num_microbatches=2, iterations=2)
    orders = [list(order) for order in generate("gpipe", problem).orders]
    orders[0].remove(Op("F", 0, 2))
    orders[0].insert(0, Op("F", 0, 2))
    with pytest.raises(DeadlockError, match="the weight update of stage 0 after iteration 0"):
        simulate(problem, Schedule(orders))


def test_memory_violation_reports_device_time_and_amount():
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2, memory_limit=2)
    result = simulate(problem, generate("1f1b", problem))
    assert not result.valid
    first = result.violations[0]
    # device 0's third warm-up forward (start 2F) brings it to 3 activations
    assert (first.device, first.time, first.amount, first.limit) == (0, 2.0, 3.0, 2.0)
    assert [v.device for v in result.violations] == [0, 1]
    with pytest.raises(MemoryLimitError, match="device 0 holds 3 at t=2, over its memory limit 2"):
        simulate(problem, generate("1f1b", problem), strict=True)


# ------------------------------------------------------------------ given start times
def test_given_start_times_are_verified_and_reproduce_the_metrics():
    """Given times are the ones run: the earliest times reproduce the orders' longest-path makespan;
    shifting every op by a constant moves every start, end and memory step by it and changes no
    metric (makespan and spans run from the first start); shifting device 1 earlier by 0.1 breaks
    1F0's input (0F0 ends at F = 1, plus latency 0.2: 1F0 may start at 1.2, not 1.1) and is refused."""
    problem = Problem(num_devices=3, num_microbatches=4, weight_times=0.5, p2p_time=0.2)
    timed = simulate(problem, generate("1f1b", problem)).timed_orders()
    again = simulate(problem, timed)
    earliest = longest_path_starts(problem, timed)
    assert again.makespan == pytest.approx(max(start + problem.cost(op.kind, op.stage)
                                               for op, start in earliest.items()))
    assert again.makespan == pytest.approx(simulate(problem, timed.without_times()).makespan)
    shift = 1.0
    shifted = simulate(problem, Schedule(timed.orders, [[t + shift for t in times] for times in timed.start_times]))
    for order in timed.orders:
        for op in order:
            assert shifted.times_of(op) == pytest.approx(tuple(t + shift for t in again.times_of(op))), op
    assert shifted.origin == pytest.approx(again.origin + shift) == pytest.approx(shift)
    assert (shifted.makespan, shifted.bubble_rate) == pytest.approx((again.makespan, again.bubble_rate))
    assert shifted.span == pytest.approx(again.span)
    assert (shifted.busy, shifted.peak_memory) == (again.busy, again.peak_memory)
    for (times, levels), (was_times, was_levels) in zip(shifted.memory_steps, again.memory_steps, strict=True):
        assert times.tolist() == pytest.approx([t + shift for t in was_times.tolist()])
        assert levels.tolist() == was_levels.tolist()
    assert again.times_of(Op("F", 1, 0))[0] == pytest.approx(1.2)
    early = [[t - 0.1 for t in times] if device == 1 else list(times) for device, times in enumerate(timed.start_times)]
    with pytest.raises(ScheduleError, match=r"1F0 starts at 1\.1, before its dependency 0F0 \(device 0\) "
                                            r"ends at 1 plus latency 0\.2"):
        simulate(problem, Schedule(timed.orders, early))


def test_start_before_a_dependency_plus_latency_is_named():
    problem = Problem(num_devices=2, num_microbatches=2, p2p_time=0.5)
    timed = simulate(problem, generate("1f1b", problem)).timed_orders()
    times = [list(t) for t in timed.start_times]
    times[1][0] -= 0.25  # 1F0 now starts before 0F0's end plus latency
    with pytest.raises(ScheduleError, match=r"1F0 starts at 1.25, before its dependency 0F0 \(device 0\) "
                                            r"ends at 1 plus latency 0.5"):
        simulate(problem, Schedule(timed.orders, times))


def test_overlapping_start_times_are_named():
    problem = Problem(num_devices=2, num_microbatches=2)
    timed = simulate(problem, generate("gpipe", problem)).timed_orders()
    times = [list(t) for t in timed.start_times]
    times[0][1] = 0.5  # 0F1 overlaps 0F0 on device 0
    with pytest.raises(ScheduleError, match=r"device 0: 0F1 starts at 0\.5, before 0F0"):
        simulate(problem, Schedule(timed.orders, times))


# ------------------------------------------------------------------ against independent references
@given(problems(chunks=(1, 2), iterations=(1, 2)), st.integers(0, 10**6))
def test_simulated_times_are_the_longest_paths(problem, seed):
    schedule = random_topological_schedule(problem, seed)
    result = simulate(problem, schedule)
    expected = longest_path_starts(problem, schedule)
    for op, start in expected.items():
        assert result.times_of(op)[0] == pytest.approx(start, abs=1e-9)


@given(problems(max_devices=3, max_microbatches=4, chunks=(1, 2)), st.integers(0, 10**6))
def test_peak_memory_matches_brute_force(problem, seed):
    schedule = random_topological_schedule(problem, seed)
    result = simulate(problem, schedule)
    start = {op: result.times_of(op)[0] for order in schedule.orders for op in order}
    assert list(result.peak_memory) == pytest.approx(brute_force_peak_memory(problem, schedule, start))
    levels_end = [levels[-1] for _, levels in result.memory_steps]
    assert levels_end == pytest.approx([0.0] * problem.num_devices, abs=1e-9)
