"""Zero Bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): zb-h1, zb-h2,
zb-auto, zb-1p, zb-2p, checked against the paper's closed forms, its Table 5 and the memory model."""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.reference import assert_paper_peak, costs, order_peak_memory
from zbopt import NotApplicableError, Problem, ZboptError, critical_path, device_work, generate, simulate
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS, ZERO_BUBBLE_TABLE_5
from zbopt.schedules import get

ZERO_BUBBLE = ("zb-h1", "zb-h2", "zb-auto", "zb-1p", "zb-2p")
latencies = st.sampled_from([0.0, 0.05, 0.3, 1.0])


def uniform(p, m, forward, backward, weight, latency=0.0, **extra) -> Problem:
    return Problem(num_devices=p, num_microbatches=m, forward_times=forward, backward_times=backward,
                   weight_times=weight, p2p_time=latency, **extra)


def longest_span(name: str, problem: Problem) -> float:
    return max(simulate(problem, generate(name, problem)).span)


@st.composite
def split_problems(draw, max_devices=6, max_microbatches=10):
    """Random v = 1 problems with a split backward: per-stage costs and memory, latency, iterations."""
    p = draw(st.integers(1, max_devices))
    per_stage = st.lists(costs, min_size=p, max_size=p)
    activation = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=p, max_size=p))
    return Problem(
        num_devices=p, num_microbatches=draw(st.integers(1, max_microbatches)),
        forward_times=draw(per_stage), backward_times=draw(per_stage), weight_times=draw(per_stage),
        p2p_time=draw(latencies), activation_memory=activation,
        weight_memory=[a * draw(st.sampled_from([0.0, 0.3, 1.0])) for a in activation],
        iterations=draw(st.sampled_from([1, 2])),
    )


@pytest.mark.parametrize("name", ZERO_BUBBLE)
def test_needs_split_backward_and_one_chunk(name):
    with pytest.raises(NotApplicableError, match=f"{name} needs a split backward"):
        generate(name, Problem(num_devices=2, num_microbatches=4))
    with pytest.raises(NotApplicableError, match=f"{name} needs chunks_per_device = 1"):
        generate(name, Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, weight_times=1))


# ------------------------------------------------------------------------------------------ closed forms


@given(st.integers(1, 6), st.integers(0, 6), costs, costs, st.floats(0.0, 1.0))
def test_zb_h1_bubble_without_latency(p, more, forward, backward, weight_share):
    """ZB-H1 (paper, section 3, Figure 3): with uniform F, B, W and no latency the bubble is
    (p-1)(F+B-W), so the critical device (device 0) spans m(F+B+W) + (p-1)(F+B-W).
    Derivation: device 0 runs 1F1B's order; it waits (p-1)B for the first B and, at the drain,
    (p-1)F of round trip less the (p-1)W of W's it still has. Holds for m >= p and W <= F."""
    m, weight = p + more, round(forward * weight_share, 3) or forward
    problem = uniform(p, m, forward, backward, weight)
    result = simulate(problem, generate("zb-h1", problem))
    expected = m * (forward + backward + weight) + (p - 1) * (forward + backward - weight)
    assert max(result.span) == pytest.approx(expected, rel=1e-9)
    assert result.span[0] == pytest.approx(expected, rel=1e-9)
    assert result.zb_bubble_rate == pytest.approx((p - 1) * (forward + backward - weight) / expected, abs=1e-9)


@given(st.integers(1, 6), st.integers(1, 6), costs, costs, latencies, st.floats(0.0, 1.0))
def test_zb_h1_pays_four_latencies_per_stage(p, more, forward, backward, latency, weight_share):
    """ZB-H1 with latency c: bubble (p-1)(F+B-W+4c). Device 0's first B waits (p-1)(B+2c) (F down
    and B up the pipeline each cross p-1 links) and its drain waits (p-1)(F+2c-W); this is the order
    whose numbers reproduce Table 5. Holds for m >= p+1 and 2c <= W <= F+2c (W >= 2c keeps the
    steady state free of stalls: the F->B round trip (p-1)(F+B+2c) fits in (p-1)(F+B+W))."""
    m = p + more
    weight = round(2 * latency + forward * weight_share, 3) or forward
    assume(2 * latency <= weight <= forward + 2 * latency)
    problem = uniform(p, m, forward, backward, weight, latency)
    expected = m * (forward + backward + weight) + (p - 1) * (forward + backward - weight + 4 * latency)
    assert longest_span("zb-h1", problem) == pytest.approx(expected, rel=1e-9)


@given(st.integers(1, 6), st.integers(0, 6), costs, costs, costs, latencies)
def test_zb_h2_bubble(p, more, forward, backward, weight, latency):
    """ZB-H2 (paper, section 3, Figure 3): bubble (p-1)(F+B+2c-2W), zero for F = B = W, c = 0.
    Derivation: the last device runs without idling from its first F ((p-1)(F+c) after device 0's)
    to its last W, ending with 2p-1 W's after its last B; device 0 ends (p-1)(B+c) + W after that
    B, so its span exceeds the last device's by (p-1)(F+B+2c-2W). Holds for m >= 2p-1, W <= F,
    2W <= F+B+2c (otherwise the last device is the longer one) and W+2c <= F+B (no steady-state stall)."""
    assume(weight <= forward and 2 * weight <= forward + backward + 2 * latency
           and weight + 2 * latency <= forward + backward)
    m = 2 * p - 1 + more
    problem = uniform(p, m, forward, backward, weight, latency)
    expected = m * (forward + backward + weight) + (p - 1) * (forward + backward + 2 * latency - 2 * weight)
    assert longest_span("zb-h2", problem) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("p", [1, 2, 4, 7])
def test_zb_h2_has_no_bubble_when_f_b_w_are_equal(p):
    """ZB-H2's claim: with F = B = W and no latency every device is busy from its first op to its last."""
    problem = uniform(p, 3 * p, 1.0, 1.0, 1.0)
    result = simulate(problem, generate("zb-h2", problem))
    assert result.zb_bubble_rate == pytest.approx(0.0, abs=1e-12)
    assert list(result.span) == pytest.approx([3 * p * 3.0] * p)


@pytest.mark.parametrize("weight_memory", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("p", [1, 3, 6])
def test_handcrafted_peak_memory(p, weight_memory):
    """Memory model (paper, Table 1): F holds M_B until B frees M_B - M_W; W frees M_W. Device s of
    ZB-H1 starts a forward holding p-s-1 activations and s delayed W's: peak (p-s)M_B + s·M_W, so
    p·M_B on device 0 (1F1B's peak) and never more. ZB-H2: 2(p-s)-1 activations and 2s delayed W's,
    (2p-1)M_B on device 0. Needs m >= 2p so every device reaches its steady state."""
    problem = uniform(p, 2 * p + 1, 1.0, 1.2, 0.7, 0.1, activation_memory=2.0, weight_memory=2.0 * weight_memory)
    mb, mw = 2.0, 2.0 * weight_memory
    h1 = simulate(problem, generate("zb-h1", problem)).peak_memory
    h2 = simulate(problem, generate("zb-h2", problem)).peak_memory
    assert list(h1) == pytest.approx([(p - s) * mb + s * mw for s in range(p)])
    assert list(h2) == pytest.approx([(2 * (p - s) - 1) * mb + 2 * s * mw for s in range(p)])
    assert max(h1) == pytest.approx(p * mb)
    assert max(h2) == pytest.approx((2 * p - 1) * mb)


# ------------------------------------------------------------------------------------------ Table 5


SCHEDULES_OF_TABLE_5 = ("zb-h1", "zb-h2", "zb-1p", "zb-2p")


def test_table_1_weight_memory_share():
    """M_W / M_B = 32sbh / (34sbh + 5as²b) at s = 1024: for the 1.5B model (h 2304, a 24) that is
    73728 / (78336 + 122880)."""
    assert ZERO_BUBBLE_MODELS["1.5B"].weight_memory == pytest.approx(73728 / 201216)


@pytest.mark.parametrize("name", SCHEDULES_OF_TABLE_5)
@pytest.mark.parametrize("model", ZERO_BUBBLE_MODELS)
def test_table_5_bubble_rates(model, name):
    """Zero Bubble paper, Table 5: bubble rate (span - m(F+B+W)) / span, span the longest device
    span, from the Table 9 costs with comm as p2p latency; memory unit M_B = 1, M_W from Table 1.
    The handcrafted schedules must match within 0.001; the greedy ZB-1p / ZB-2p may not be more than
    0.005 worse. Each schedule also keeps its memory promise: p·M_B, (2p-1)·M_B, p·M_B, 2p·M_B."""
    problem = ZERO_BUBBLE_MODELS[model].problem()
    result = simulate(problem, generate(name, problem))
    published = ZERO_BUBBLE_TABLE_5[model][name]
    if name in ("zb-h1", "zb-h2"):
        assert result.zb_bubble_rate == pytest.approx(published, abs=0.001)
    else:
        assert result.zb_bubble_rate <= published + 0.005
    p = problem.num_devices
    memory = {"zb-h1": p, "zb-h2": 2 * p - 1, "zb-1p": p, "zb-2p": 2 * p}[name]
    assert max(result.peak_memory) <= memory + 1e-9


# ------------------------------------------------------------------------------------------ automatic


@given(split_problems())
def test_every_zero_bubble_schedule_is_valid_within_its_memory_bound(problem):
    """On random problems (per-stage costs and memory, latency, 1-2 iterations): the simulator accepts
    each of the five schedules, its makespan respects both lower bounds, its peak memory is what its
    order holds (counted op by op) and within the paper's (ZB-H1 p·M_B, ZB-H2 (2p-1)·M_B, ZB-1p
    p·M_B, ZB-2p 2p·M_B: sec. 3, Table 5; zb-auto, unlimited here, m·M_B) and its stated bound."""
    bound = max(critical_path(problem), max(device_work(problem)))
    checked = []
    for name in ZERO_BUBBLE:
        schedule = generate(name, problem)
        result = simulate(problem, schedule)
        assert result.makespan >= bound - 1e-9, name
        assert list(result.peak_memory) == pytest.approx(order_peak_memory(problem, schedule)), name
        if name == "zb-auto":
            everything = [problem.num_microbatches * activation for activation in problem.activation_memory]
            assert all(peak <= most + 1e-9 for peak, most in zip(result.peak_memory, everything, strict=True))
        else:
            assert_paper_peak(name, problem, result.peak_memory)
        promised = get(name).peak_memory_bound(problem)
        assert all(peak <= limit + 1e-9 for peak, limit in zip(result.peak_memory, promised, strict=True)), name
        checked.append(name)
    assert tuple(checked) == ZERO_BUBBLE == ("zb-h1", "zb-h2", "zb-auto", "zb-1p", "zb-2p")


@given(split_problems(), st.data())
def test_zb_auto_keeps_any_memory_limit(problem, data):
    """zb-auto under a random per-device limit, down to the minimum (one microbatch's activations),
    given as the problem's memory_limit or as the option: the simulator finds no violation."""
    p = problem.num_devices
    factors = data.draw(st.lists(st.sampled_from([1.0, 1.3, 2.0, 3.0, 5.0]), min_size=p, max_size=p))
    limits = [factor * held for factor, held in zip(factors, problem.activation_memory, strict=True)]
    if data.draw(st.booleans()):
        constrained = problem.replace(memory_limit=limits)
        result = simulate(constrained, generate("zb-auto", constrained))
        assert result.valid, result.violations
    else:
        result = simulate(problem, generate("zb-auto", problem, memory_limit=limits))
        assert all(peak <= limit + 1e-9 for peak, limit in zip(result.peak_memory, limits, strict=True))


def test_zb_1p_and_zb_2p_are_zb_auto_at_their_limits():
    """ZB-1p / ZB-2p are the automatic schedule with memory limit p·M_B / 2p·M_B, M_B the largest
    activation_memory of a stage."""
    problem = uniform(4, 12, [1.0, 1.5, 1.0, 0.8], 1.2, 0.6, 0.1, activation_memory=[1.0, 2.0, 1.0, 1.0])
    for name, limit in (("zb-1p", 4 * 2.0), ("zb-2p", 8 * 2.0)):
        assert generate(name, problem).orders == generate("zb-auto", problem, memory_limit=limit).orders


def test_zb_auto_rejects_a_bad_memory_limit_option():
    problem = uniform(3, 6, 1.0, 1.0, 1.0, activation_memory=2.0)
    with pytest.raises(ZboptError, match="device 0 must hold one microbatch's activations"):
        generate("zb-auto", problem, memory_limit=1.0)
    with pytest.raises(ZboptError, match=r"zb-auto option memory_limit = \[4.0, 4.0\]: expected one value per device"):
        generate("zb-auto", problem, memory_limit=[4.0, 4.0])
