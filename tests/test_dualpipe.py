"""DualPipeV ("DualPipe cut in half", deepseek-ai/DualPipe dualpipev.py; torch ScheduleDualPipeV).

Units: F, B, W are zbopt's per-virtual-stage costs (B = input gradient only). The README table's
"B" is a full backward chunk, zbopt's B + W, and its "F&B" (a forward overlapped with a backward)
has no overlap in zbopt: the pair runs F, then B and W, costing F + B + W. PP = number of stages =
2p for DualPipeV on p devices; activation is counted in one microbatch's activation of one stage.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reference import problems
from zbopt import NotApplicableError, Op, Problem, critical_path, device_work, generate, simulate
from zbopt.schedules import get


def dualpipe_v_problem(p, m, f=1.0, b=1.0, w=1.0, **changes):
    """DualPipeV's problem shape (two chunks, V placement), uniform costs, with `changes` applied."""
    parameters = dict(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="v",
                      forward_times=f, backward_times=b, weight_times=w)
    return Problem(**{**parameters, **changes})


# Derived by hand from dualpipev.py's eight steps for p = 2, m = 4 (device 0 holds stages 0 and 3,
# device 1 stages 1 and 2). Device 0 (rank 0): nF0 = 2, nF0F1 = 1, nB1W1F1 = 1, main step 1, nB1F1B0 = 1,
# nB1B0 = 1 (its B0 defers W), nWB0 = 1, nW = 1. Device 1 (rank 1): nF0F1 = 2, main step 2, nB1B0 = 2
# (the second pair defers W), nW = 2.
HAND_ORDERS = [order.split() for order in (
    "0F0 0F1 0F2 3F0 3B0 3W0 3F1 0F3 3B1 3W1 3F2 0B0 0W0 3B2 3W2 3F3 0B1 0W1 3B3 3W3 0B2 0W2 0B3 0W3",
    "1F0 2F0 1F1 2F1 1F2 2B0 2W0 2F2 1B0 1W0 1F3 2B1 2W1 2F3 1B1 1W1 2B2 2W2 1B2 1W2 2B3 1B3 2W3 1W3",
)]


def test_dualpipe_v_order_follows_the_eight_steps_for_two_devices():
    schedule = generate("dualpipe-v", dualpipe_v_problem(2, 4))
    assert [[str(op) for op in order] for order in schedule.orders] == HAND_ORDERS


@pytest.mark.parametrize(("f", "b", "w", "starts"), [
    # F = B = W = 1: device 1 waits only for its first input; makespan 1 + 2·4·3 = 25.
    (1.0, 1.0, 1.0, [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24],
                     [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]]),
    # F = B = 2, W = 1: makespan 3 + 2·4·5 = 43.
    (2.0, 2.0, 1.0, [[0, 2, 4, 6, 8, 10, 11, 13, 15, 17, 18, 20, 22, 23, 25, 27, 29, 31, 32, 34, 35, 37, 40, 42],
                     [2, 4, 6, 8, 10, 12, 14, 15, 17, 19, 20, 22, 24, 25, 27, 29, 30, 32, 33, 35, 36, 38, 40, 41]]),
])
def test_dualpipe_v_timeline_by_hand(f, b, w, starts):
    """Every start time for p = 2, m = 4, timed by hand op by op from HAND_ORDERS (each op starts
    when its device is free and its predecessor has ended)."""
    problem = dualpipe_v_problem(2, 4, f, b, w)
    result = simulate(problem, generate("dualpipe-v", problem))
    for order, expected in zip(HAND_ORDERS, starts, strict=True):
        assert [result.times_of(Op.from_str(text))[0] for text in order] == pytest.approx(expected)


REGIME_COSTS = [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.0, 1.0, 0.25), (1.5, 1.0, 1.0), (1.25, 0.5, 2.0), (3.0, 2.5, 0.5)]


@pytest.mark.parametrize(("f", "b", "w"), REGIME_COSTS)
@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("extra", [0, 1, 3])
def test_dualpipe_v_bubble_closed_form(f, b, w, p, extra):
    """Bubble = makespan - 2m(F+B+W) (each device's work; uniform costs, no latency, m >= 2p):

        bubble = (p - 1) · (F + max(0, B - W))    for B <= F <= B + W, independent of m.

    The README table (deepseek-ai/DualPipe, "Pipeline Bubbles and Memory Usage Comparison") gives
    DualPipeV (PP/2 - 1)(F&B + B - 3W); in zbopt units (PP = 2p, F&B = F + B + W, full B = B + W)
    that is (p - 1)(F + 2B - W). The table's formula times each overlapped pair as one unit that
    waits for both its inputs and sends both outputs when it ends; timed that way (a throwaway
    check, not zbopt's model) the table comes out exactly when F = B. zbopt runs one op at a time:
    the pair's F starts as soon as its own input is there and sends its output when it ends, which
    changes the table's bubble by -(p - 1)·min(F, 2F - W) when F = B. The closed form above is what
    the model gives: by hand for p = 1 (one device, never waits) and for p = 2 at one point with
    B <= W and one with B > W (the timelines of test_dualpipe_v_timeline_by_hand: bubble F = 1 and
    F + B - W = 3), and over this grid by simulation. The term (p - 1)F is the last device's start,
    the first microbatch's way down the V. Outside B <= F <= B + W the bubble is a longer max of
    terms (found by fitting, not derived); it is not asserted.
    """
    m = 2 * p + extra
    problem = dualpipe_v_problem(p, m, f, b, w)
    result = simulate(problem, generate("dualpipe-v", problem))
    assert result.makespan - 2 * m * (f + b + w) == pytest.approx((p - 1) * (f + max(0.0, b - w)))


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize(("f", "b"), [(1.0, 1.0), (1.0, 0.75), (2.5, 2.0)])
def test_dualpipe_v_bubble_equals_the_readme_table_when_w_is_twice_b(p, f, b):
    """Where the table's (p - 1)(F + 2B - W) and the model's (p - 1)(F + max(0, B - W)) agree:
    W = 2B (within B <= F <= B + W = 3B). Elsewhere the table's value is not what zbopt's
    one-op-at-a-time model gives (see test_dualpipe_v_bubble_closed_form)."""
    w, m = 2 * b, 2 * p + 2
    problem = dualpipe_v_problem(p, m, f, b, w)
    result = simulate(problem, generate("dualpipe-v", problem))
    readme_bubble = (p - 1) * ((f + b + w) + (b + w) - 3 * w)  # (PP/2 - 1)(F&B + B - 3W), PP = 2p
    assert result.makespan - 2 * m * (f + b + w) == pytest.approx(readme_bubble)


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("split", [True, False])
def test_dualpipe_v_peak_memory_is_the_readme_pp_plus_one(p, split):
    """README table, DualPipeV activation per device: PP + 1 = 2p + 1 stage activations, on every
    device (uniform M_B = 1.5; split or fused backward)."""
    problem = dualpipe_v_problem(p, 2 * p + 1, activation_memory=1.5)
    if not split:
        problem = problem.replace(weight_times=None, weight_memory=None)
    result = simulate(problem, generate("dualpipe-v", problem))
    assert list(result.peak_memory) == pytest.approx([(2 * p + 1) * 1.5] * p)


@given(problems(max_devices=5, max_microbatches=1, chunks=(2,), iterations=(1, 2)), st.integers(0, 4))
def test_dualpipe_v_valid_on_random_problems(problem, extra):
    """Heterogeneous costs and memory, latency, split or fused, one or two iterations: the simulator
    times it without deadlock, each device does exactly its work, the makespan respects both lower
    bounds, and the peak memory on device r is exactly (2p - r)·M_B(stage r) + (r + 1)·M_B(stage
    2p-1-r): 2p - r microbatches held on the way down the V, r + 1 on the way up (README: PP + 1)."""
    p = problem.num_devices
    problem = problem.replace(placement="v", num_microbatches=2 * p + extra)
    result = simulate(problem, generate("dualpipe-v", problem))
    assert list(result.busy) == pytest.approx(device_work(problem))
    assert result.makespan >= max(critical_path(problem), max(device_work(problem))) - 1e-9
    expected = [(2 * p - r) * problem.activation_memory[r] + (r + 1) * problem.activation_memory[2 * p - 1 - r]
                for r in range(p)]
    assert list(result.peak_memory) == pytest.approx(expected)
    assert list(get("dualpipe-v").peak_memory_bound(problem)) == pytest.approx(expected)


@pytest.mark.parametrize(("changes", "message"), [
    ({"chunks_per_device": 1}, "dualpipe-v needs chunks_per_device = 2"),
    ({"chunks_per_device": 3}, "dualpipe-v needs chunks_per_device = 2"),
    ({"placement": "loop"}, "dualpipe-v needs placement 'v'"),
    ({"m": 7}, r"dualpipe-v needs num_microbatches >= 2 \* num_devices \(m >= 2p = 8, got m = 7\)"),
])
def test_dualpipe_v_preconditions(changes, message):
    """dualpipev.py asserts num_chunks >= num_ranks * 2 (torch: microbatches >= stages = 2p) and
    takes exactly two modules per rank, placed as a V. No even device count: only the bidirectional
    DualPipe needs one (odd p runs in test_dualpipe_v_bubble_closed_form)."""
    problem = dualpipe_v_problem(**{"p": 4, "m": 8, **changes})
    with pytest.raises(NotApplicableError, match=message):
        generate("dualpipe-v", problem)

