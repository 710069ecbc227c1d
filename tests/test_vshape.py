"""V-shape schedules: zb-v (the authors' greedy) and torch-zbv ("Zero Bubble Pipeline Parallelism",
Qi et al., ICLR 2024, section 6), v-min / v-half (the authors' reordering) / v-half-squeezed / v-zb
("Pipeline Parallelism with Controllable Memory", Qi et al., NeurIPS 2024).

Units: F, B, W are zbopt's per-virtual-stage costs and a device holds two virtual stages, so with
F = B = W = 1 one microbatch costs a device 6 (the building blocks' repetition interval T = 6) and
1F1B's "p full stages" of activations are 2p chunk activations. weight_memory = activation_memory
makes W release a microbatch's whole activation, the papers' accounting (F +1, W -1), so peaks are
counts of chunk activations. "Idle" is the longest device span minus a device's work 6m; the
papers' bubble rate 1 - m(F+B+W)/longest span is zbopt's zb_bubble_rate.
"""

import pytest
from hypothesis import given

from tests.reference import problems
from zbopt import NotApplicableError, Op, Problem, critical_path, device_work, generate, simulate
from zbopt.schedules import get

NAMES = ("zb-v", "torch-zbv", "v-min", "v-half", "v-half-squeezed", "v-zb")

# The authors' table (Hugging Face playground sail/pipeline-parallelism-with-controllable-memory):
# activation memory "by #micro-batch", one microbatch on a device = its two chunks; the paper's
# abstract: about 1/3, 1/2 and 1 of 1F1B's p.
TABLE_MICROBATCHES = {"v-min": lambda p: (p + 4) // 3, "v-half": lambda p: (p + 2) // 2,
                      "v-half-squeezed": lambda p: (p + 2) // 2, "v-zb": lambda p: p}


def v_problem(p, m, t=1.0, **changes):
    """Two chunks per device in V placement, F = B = W = t, W releases the whole activation."""
    parameters = dict(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="v",
                      forward_times=t, backward_times=t, weight_times=t, weight_memory=1.0)
    return Problem(**{**parameters, **changes})


def idle(result, m, t=1.0):
    return max(result.span) - 6 * m * t


def expected_bubble(p, peak):
    """The authors' bubble for the best V-shape block holding `peak` chunk activations, in slots
    (F = B = W = 1), from their building-block search (v_auto_schedule.py, "expected_bubble"):
        3p - 1 - 3·peak + max(3p, p - 1 + 2(1 + floor((peak + 1)/2))).
    It is 6p - 1 - 3·peak while peak <= 2p - 2 and 0 at 1F1B's peak 2p."""
    return 3 * p - 1 - 3 * peak + max(3 * p, p - 1 + 2 * (1 + (peak + 1) // 2))


@pytest.mark.parametrize("name", [*NAMES, "zb-v-auto"])
@pytest.mark.parametrize(("placement", "chunks"), [("loop", 2), ("v", 1), ("v", 3)])
def test_needs_v_placement_and_two_chunks(name, placement, chunks):
    problem = v_problem(3, 6, chunks_per_device=chunks, placement=placement)
    with pytest.raises(NotApplicableError, match=f"^{name} needs placement v and chunks_per_device = 2$"):
        generate(name, problem)


# ----------------------------------------------------------------------------------------- ZB-V


@pytest.mark.parametrize("name", ["zb-v", "torch-zbv"])
@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("extra", [0, 1, 5])
@pytest.mark.parametrize("t", [1.0, 0.5])
def test_zb_v_has_zero_bubble_when_f_b_w_are_equal(name, p, extra, t):
    """ZB paper, section 6: with T_F = T_B = T_W, ZB-V has zero bubble (m >= 2p - 1, the warm-up
    of device 0). The first microbatch reaches device d after d forwards; from then on every
    device runs its 6m ops without a gap, so each span is 6mt, the papers' bubble rate is 0 and
        makespan = (6m + p - 1)·t."""
    m = 2 * p - 1 + extra
    result = simulate(v_problem(p, m, t), generate(name, v_problem(p, m, t)))
    assert result.makespan == pytest.approx((6 * m + p - 1) * t)
    assert list(result.span) == pytest.approx([6 * m * t] * p)
    assert result.zb_bubble_rate == pytest.approx(0.0)


@pytest.mark.parametrize("name", ["zb-v", "torch-zbv"])
@pytest.mark.parametrize("p", range(1, 8))
def test_zb_v_peak_memory_is_1f1b_s(name, p):
    """ZB paper, section 6: ZB-V's peak activation memory equals 1F1B's, p full stages = 2p chunk
    activations (every microbatch, 2m, when m < p). Checked against zbopt's own 1f1b on the same
    model cut into p stages of two chunks each (activation 2 per stage)."""
    for m in sorted({1, max(1, p - 1), p, 2 * p, 3 * p + 1}):
        peak = max(simulate(v_problem(p, m), generate(name, v_problem(p, m))).peak_memory)
        one_f_one_b = Problem(num_devices=p, num_microbatches=m, forward_times=2, backward_times=2,
                              weight_times=2, activation_memory=2, weight_memory=2)
        assert peak == max(simulate(one_f_one_b, generate("1f1b", one_f_one_b)).peak_memory) == 2 * min(p, m)


@pytest.mark.parametrize("name", ["zb-v", "torch-zbv"])
@pytest.mark.parametrize("p", range(1, 7))
def test_zb_v_stable_phase_is_the_v_zb_building_block(name, p):
    """ZB-V's stable phase is a V-shape building block repeated every T = 6. Device d first runs
    2(p-d)-1 + 2d + 3(p-d) = 5p-2d-1 warm-up ops from time d without a gap (previous test), then
    steady steps k = 0, 1, ... of six ops F0 B0 W0 F1 B1 W1, step k starting at 5p-2d-1+6k and
    running F0 of microbatch 2p-1-d+k, B0 of k, F1 of p+k and B1 of p-d+k. Hence, while every
    step still has its F0 (2p-1 <= j <= m-2p), microbatch j starts
        F on chunk 0 (stage d):      6j - 7p + 4d + 5   (+4 per device down the V)
        F on chunk 1 (stage 2p-1-d): 6j - p - 2d + 2    (+2 per device up the V)
        B on chunk 1:                6j - p + 4d + 3    (+4 per device down)
        B on chunk 0:                6j + 5p - 2d       (+2 per device up)
    The lifespans (chunk 0: B0 - F0 = 12p - 6d - 5, chunk 1: 6d + 1, each plus its W) add up to
    about 12p, 2p activations: the V-ZB block with 1F1B's memory that v-zb stands for."""
    m = 4 * p + 2
    problem = v_problem(p, m)
    result = simulate(problem, generate(name, problem))
    last = 2 * p - 1
    for j in range(2 * p - 1, m - 2 * p + 1):
        for d in range(p):
            assert result.times_of(Op("F", d, j))[0] == 6 * j - 7 * p + 4 * d + 5
            assert result.times_of(Op("F", 2 * p - 1 - d, j))[0] == 6 * j - p - 2 * d + 2
            assert result.times_of(Op("B", last - d, j))[0] == 6 * j - p + 4 * d + 3
            assert result.times_of(Op("B", d, j))[0] == 6 * j + 5 * p - 2 * d


@pytest.mark.parametrize(("p", "m"), [(1, 3), (3, 2), (4, 9)])
def test_v_zb_runs_zb_v(p, m):
    problem = v_problem(p, m)
    assert generate("v-zb", problem).orders == generate("zb-v", problem).orders


# ------------------------------------------------------------------------- controllable memory


@pytest.mark.parametrize("name", ["v-min", "v-half", "v-half-squeezed", "v-zb"])
@pytest.mark.parametrize("p", range(1, 10))
def test_peak_memory_matches_the_papers_table(name, p):
    """Peak = 2 × the table's microbatches, chunk activations, once m >= p; never above it, nor
    above the 2m activations that exist."""
    promised = 2 * TABLE_MICROBATCHES[name](p)
    for m in sorted({1, 2, max(1, p - 1), p, 2 * p, 3 * p + 2}):
        peaks = simulate(v_problem(p, m), generate(name, v_problem(p, m))).peak_memory
        assert max(peaks) <= min(promised, 2 * m)
        if m >= p:
            assert max(peaks) == promised


@pytest.mark.parametrize(("name", "extra"), [("v-half", 3), ("v-half", 2 * 6 + 1), ("v-half-squeezed", 0),
                                           ("v-half-squeezed", 3), ("v-half-squeezed", 2 * 6 + 1)])
@pytest.mark.parametrize("p", range(3, 10))
def test_v_half_bubble_is_the_authors_formula(name, p, extra):
    """V-Half (peak 2·floor((p+2)/2)) idles exactly the authors' expected bubble for its memory,
    6p - 1 - 3·peak = 3p - 7 (p even) or 3p - 4 (p odd), about 3p slots: the papers' rate ~p/(2m).
    (p = 2 idles 1 slot where the formula gives 0.) The authors' own reordering (v-half) meets it
    from m = p + 3; at m = p see the next test."""
    m = p + extra
    result = simulate(v_problem(p, m), generate(name, v_problem(p, m)))
    bubble = expected_bubble(p, 2 * ((p + 2) // 2))
    assert idle(result, m) == bubble
    assert result.zb_bubble_rate == pytest.approx(bubble / (6 * m + bubble))


@pytest.mark.parametrize("p", range(3, 10))
def test_v_half_at_m_equal_p_never_idles_less_than_the_formula(p):
    """At m = p the authors' reordering idles at least the formula (the least for its memory), and
    more at most p (their cool-down keeps the stable phase's pattern, which m = p leaves little room
    for; zbopt's squeeze-first reading meets it, see above)."""
    result = simulate(v_problem(p, p), generate("v-half", v_problem(p, p)))
    assert idle(result, p) >= expected_bubble(p, 2 * ((p + 2) // 2))


@pytest.mark.parametrize("p", range(1, 10))
@pytest.mark.parametrize("extra", [0, 3, 2 * 6 + 1])
def test_v_min_bubble_is_about_4p(p, extra):
    """V-Min's bubble rate ~2p/(3m) (authors' table): at most 4p idle slots. Its fixed block meets
    the authors' expected bubble for its memory 2·floor((p+4)/3) when p mod 3 != 2 (p >= 3); when
    p mod 3 = 2 that memory has slack the fixed block does not use, and it idles 4 slots more."""
    m = p + extra
    result = simulate(v_problem(p, m), generate("v-min", v_problem(p, m)))
    assert idle(result, m) <= 4 * p
    if p >= 3 and p % 3 != 2:
        assert idle(result, m) == expected_bubble(p, 2 * ((p + 4) // 3))


@pytest.mark.parametrize("p", range(1, 11))
def test_less_memory_costs_bubble_as_the_paper_orders_them(p):
    """v-min <= v-half <= v-zb in peak memory and the reverse in bubble; the peaks differ strictly
    where the table's (p+4)//3 < (p+2)//2 < p, i.e. p = 4 and p >= 6."""
    m = 3 * p
    results = {name: simulate(v_problem(p, m), generate(name, v_problem(p, m))) for name in ("v-min", "v-half", "v-zb")}
    peaks = [max(results[name].peak_memory) for name in ("v-min", "v-half", "v-zb")]
    bubbles = [idle(results[name], m) for name in ("v-min", "v-half", "v-zb")]
    assert peaks == sorted(peaks) and bubbles == sorted(bubbles, reverse=True)
    if p == 4 or p >= 6:
        assert peaks[0] < peaks[1] < peaks[2]
        assert bubbles[0] > bubbles[1] > bubbles[2] == 0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("p", "m"), [(1, 2), (2, 5), (4, 8), (5, 3)])
def test_fused_backward_runs_the_split_order_with_bw(name, p, m):
    split = v_problem(p, m)
    fused = split.replace(weight_times=None, weight_memory=None, backward_times=2.0)
    expected = [[Op("BW", op.stage, op.microbatch) if op.kind == "B" else op for op in order if op.kind != "W"]
                for order in generate(name, split).orders]
    assert [list(order) for order in generate(name, fused).orders] == expected


@given(problems(max_devices=5, max_microbatches=8, chunks=(2,), iterations=(1, 2)))
def test_valid_on_random_heterogeneous_problems_with_latency(problem):
    """Random per-stage costs and activations, latency, split or fused, one or two iterations: the
    simulator accepts every V-shape schedule (no deadlock, every op once), it respects both lower
    bounds, and each device stays within the registered peak-memory promise."""
    problem = problem.replace(placement="v")
    bound = max(critical_path(problem), max(device_work(problem)))
    for name in NAMES:
        result = simulate(problem, generate(name, problem))
        assert result.makespan >= bound - 1e-9
        assert sum(result.busy) == pytest.approx(sum(device_work(problem)))
        promised = get(name).peak_memory_bound(problem)
        assert all(peak <= limit + 1e-9 for peak, limit in zip(result.peak_memory, promised, strict=True)), name


# ------------------------------------------------------------------ the authors' greedy and the rule

HALVED = dict(forward_times=9.261, backward_times=9.043, weight_times=4.6685, p2p_time=0.601, activation_memory=0.5,
              weight_memory=0.183)  # the 1.5B model's costs per chunk (benchmarks/bench_scale.py)


@pytest.mark.parametrize(("p", "m"), [(8, 16), (8, 24), (6, 18)])
def test_greedy_zb_v_is_never_longer_than_the_rule_at_unequal_costs(p, m):
    """At F > B > W (the 1.5B model's costs) the authors' greedy puts the W's where the waits are:
    zb-v is no longer than the fixed rule, both at 1F1B's memory (p chunk pairs of 0.5 each)."""
    problem = v_problem(p, m, **HALVED)
    greedy, rule = (simulate(problem, generate(name, problem)) for name in ("zb-v", "torch-zbv"))
    assert greedy.makespan <= rule.makespan + 1e-9
    assert max(greedy.peak_memory) <= p * 2 * 0.5 + 1e-9


def test_the_rule_is_kept_because_it_is_sometimes_shorter():
    """p = 4 at the same costs: the rule is shorter than the greedy, so the rule is kept (as
    torch-zbv) and the warm start tries both."""
    problem = v_problem(4, 8, **HALVED)
    greedy, rule = (simulate(problem, generate(name, problem)).makespan for name in ("zb-v", "torch-zbv"))
    assert rule < greedy


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 16)])
def test_zb_v_auto_at_zb_v_s_memory_is_zb_v(p, m):
    """Under a memory limit equal to ZB-V's target the greedy with the problem's limit builds ZB-V."""
    problem = v_problem(p, m, **HALVED).replace(memory_limit=p * 2 * 0.5)
    assert generate("zb-v-auto", problem).orders == generate("zb-v", problem).orders


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("waves", [1, 2, 3])
def test_v_placement_with_2w_chunks_is_hanayos_wave(p, waves):
    """Hanayo (Liu et al., SC'23, §3): W waves, the model cut into 2W·p stages, each wave one
    stage down the devices and one back up; device d holds stages 2kp + d and 2kp + 2p-1-d for each
    wave k, every stage once (no weight copies, unlike Chimera). zbopt's placement v with
    chunks_per_device = 2W is that map."""
    problem = Problem(num_devices=p, num_microbatches=p, chunks_per_device=2 * waves, placement="v")
    wave = [sorted(s for k in range(waves) for s in (2 * k * p + d, 2 * k * p + 2 * p - 1 - d)) for d in range(p)]
    assert [list(stages) for stages in problem.stages_of_device] == wave
    devices = [problem.device_of(s) for s in range(problem.num_stages)]
    assert devices == (list(range(p)) + list(range(p - 1, -1, -1))) * waves
