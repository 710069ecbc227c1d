"""The bidirectional placement (DeepSeek's DualPipe) and the `dualpipe` schedule.

Microbatches 0..ceil(m/2)-1 go down through virtual stages 0..p-1 on devices 0..p-1, the others up
through stages p..2p-1 on devices p-1..0 (`Problem`); each visits p of the 2p stage copies.
"""

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import _search_in_time, assert_cpsat_proves
from zbopt import (
    NotApplicableError,
    Op,
    Problem,
    ProblemError,
    Schedule,
    ScheduleError,
    ZboptError,
    critical_path,
    device_work,
    generate,
    load_problem,
    simulate,
    solve,
)
from zbopt.schedules import generate_applicable, get


def bidirectional(p, m, f=1.0, b=1.0, w=1.0, **changes):
    parameters = dict(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="bidirectional",
                      forward_times=f, backward_times=b, weight_times=w)
    return Problem(**{**parameters, **changes})


def test_each_microbatch_visits_one_stage_copy_per_device():
    problem = bidirectional(3, 5)
    assert problem.routes == ((range(0, 3), range(0, 3)), (range(3, 6), range(3, 5)))
    assert [problem.device_of(s) for s in range(6)] == [0, 1, 2, 2, 1, 0]
    assert problem.num_ops == 3 * 3 * 5 and problem.num_activations == 15
    assert device_work(problem) == [15.0] * 3  # 5 microbatches, F + B + W each, on every device
    assert "3 down and 2 up" in problem.describe()


def test_the_op_chain_follows_each_route():
    """Down: 0F0 -> 1F0 -> 1B0 -> 0B0; up: 2F1 -> 3F1 -> 3B1 -> 2B1, p = 2 with latency 0.5."""
    problem = bidirectional(2, 2, p2p_time=0.5)
    schedule = [["0F0", "3F1", "3B1", "0B0", "0W0", "3W1"], ["2F1", "1F0", "1B0", "2B1", "1W0", "2W1"]]
    result = simulate(problem, Schedule([[Op.from_str(text) for text in order] for order in schedule]))
    starts = {text: result.times_of(Op.from_str(text))[0] for order in schedule for text in order}
    # device 0: 0F0 at 0; 3F1 after 2F1 (device 1, ends 1) + 0.5; 3B1 right after; 0B0 after 1B0
    assert starts == {"0F0": 0, "2F1": 0, "3F1": 1.5, "1F0": 1.5, "3B1": 2.5, "1B0": 2.5, "0B0": 4, "2B1": 4,
                      "0W0": 5, "1W0": 5, "3W1": 6, "2W1": 6}
    assert critical_path(problem) == 6.0  # F, latency, F, B, latency, B, W: 1 + .5 + 1 + 1 + .5 + 1 + 1
    assert result.makespan == 7.0


def test_an_op_off_its_microbatch_route_is_named():
    problem = bidirectional(2, 4)
    orders = [[Op("F", 3, 0)], []]
    with pytest.raises(ScheduleError, match=r"op 3F0: microbatch 0 goes through stages 0\.\.1, never stage 3"):
        simulate(problem, Schedule(orders))


@pytest.mark.parametrize(("changes", "message"), [
    ({"chunks_per_device": 1}, "chunks_per_device = 1: placement 'bidirectional' holds as many chunks of the up"),
    ({"chunks_per_device": 3}, "chunks_per_device = 3: .* expected an even number"),
    ({"iterations": 2}, "iterations = 2: placement 'bidirectional' models one step"),
    ({"num_microbatches": 1}, "num_microbatches = 1: placement 'bidirectional' sends microbatches both ways"),
])
def test_bidirectional_preconditions_are_one_line_errors(changes, message):
    with pytest.raises(ProblemError, match=message):
        bidirectional(4, 8, **changes)


def test_memory_floor_is_the_larger_route_not_the_sum():
    """One microbatch visits one of the device's two stage copies: the floor is the larger
    activation (V placement, every microbatch visiting both: their sum)."""
    problem = bidirectional(2, 4, activation_memory=[1, 2, 3, 4])
    assert problem.one_microbatch_memory == (4.0, 3.0)  # device 0: stages 0 (1) and 3 (4)
    assert problem.replace(placement="v").one_microbatch_memory == (5.0, 5.0)
    with pytest.raises(ProblemError, match=r"device 0 must hold one microbatch's activations on its stages \(of "
                                           r"one route\) \(4\)"):
        problem.replace(memory_limit=3.5)
    recomputing = problem.replace(allow_recompute=True, checkpoint_memory=0.5)
    assert recomputing.recomputation_floor == (4.0, 3.0)  # no earlier stage of the same route on the device


# Derived by hand from dualpipe.py's eight steps for p = 2, m = 4 (two microbatches each way; rank 0
# holds the down stage 0 as phase 0 and the up stage 3 as phase 1, rank 1 the up stage 2 as phase 0
# and the down stage 1 as phase 1; h = 0 on both): nF0F1 once, the main step once (F0, full B1, F1,
# full B0), nB1B0 once with W deferred from its B0 on (h even), nW once.
HAND_ORDERS = [order.split() for order in (
    "0F0 3F2 0F1 3B2 3W2 3F3 0B0 0W0 3B3 3W3 0B1 0W1",
    "2F2 1F0 2F3 1B0 1W0 1F1 2B2 2W2 1B1 1W1 2B3 2W3",
)]


def test_dualpipe_order_follows_the_eight_steps_for_two_devices():
    schedule = generate("dualpipe", bidirectional(2, 4))
    assert [[str(op) for op in order] for order in schedule.orders] == HAND_ORDERS


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("extra", [0, 2, 6])
def test_dualpipe_peak_memory_is_the_readme_pp_plus_one(p, extra):
    """README table, DualPipe activation PP + 1 with PP = p ranks, in one stage's activation: on
    device r, p - r microbatches of its down stage and r + 1 of its up stage at once (told apart by
    giving the two ways activations 1 and 1000)."""
    problem = bidirectional(p, 2 * p + extra, activation_memory=[1.0] * p + [1000.0] * p, weight_memory=0.0)
    result = simulate(problem, generate("dualpipe", problem))
    assert list(result.peak_memory) == [(p - r) + 1000 * (r + 1) for r in range(p)]
    assert list(get("dualpipe").peak_memory_bound(problem)) == list(result.peak_memory)


@pytest.mark.parametrize(("name", "microbatches"), [
    ("dualpipe", lambda p, extra: 2 * p + 2 * extra),  # even, at least 2p
    ("chimera", lambda p, extra: (extra + 1) * p),  # whole basic units of p
])
@given(p=st.sampled_from([2, 4, 6]), extra=st.integers(0, 3), data=st.data())
@settings(max_examples=25, deadline=None)
def test_bidirectional_schedules_valid_on_random_costs(name, microbatches, p, extra, data):
    """Heterogeneous costs and memory, latency, split or fused: no deadlock, each device does its
    work, the makespan respects both bounds and the peak its promise."""
    costs = st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=2 * p, max_size=2 * p)
    split = data.draw(st.booleans())
    problem = bidirectional(p, microbatches(p, extra), f=data.draw(costs), b=data.draw(costs),
                            w=data.draw(costs) if split else None, p2p_time=data.draw(st.sampled_from([0, 0.3])),
                            activation_memory=data.draw(costs))
    result = simulate(problem, generate(name, problem))
    assert list(result.busy) == pytest.approx(device_work(problem))
    assert result.makespan >= max(critical_path(problem), max(device_work(problem))) - 1e-9
    assert all(peak <= bound + 1e-9 for peak, bound in
               zip(result.peak_memory, get(name).peak_memory_bound(problem), strict=True))


@pytest.mark.parametrize(("problem", "message"), [
    (bidirectional(3, 6), r"dualpipe needs an even num_devices \(got p = 3\)"),
    (bidirectional(4, 6), r"dualpipe needs an even num_microbatches >= 2 \* num_devices \(m >= 8, got m = 6\)"),
    (bidirectional(4, 9), r"dualpipe needs an even num_microbatches"),
    (bidirectional(4, 8).replace(placement="v"), "dualpipe needs placement 'bidirectional'"),
    (bidirectional(3, 6), r"chimera needs an even num_devices \(got p = 3\)"),
    (bidirectional(4, 6), r"chimera needs num_microbatches a multiple of num_devices"),
    (bidirectional(4, 8).replace(placement="v"), "chimera needs placement 'bidirectional'"),
    (bidirectional(4, 8, chunks_per_device=4), r"chimera needs chunks_per_device = 2 .*got 4"),
    (bidirectional(4, 8, chunks_per_device=4), r"dualpipe needs chunks_per_device = 2 .*got 4"),
    (bidirectional(3, 6, chunks_per_device=4), r"bitpipe needs an even num_devices \(got p = 3\)"),
    (bidirectional(4, 6, chunks_per_device=4), r"bitpipe needs num_microbatches a multiple of num_devices"),
    (bidirectional(4, 8), r"bitpipe needs chunks_per_device = 4 \(2 of each pipeline per device; got 2\)"),
])
def test_bidirectional_schedule_preconditions(problem, message):
    with pytest.raises(NotApplicableError, match=message):
        generate(message.split()[0], problem)  # the schedule the message names


def test_only_bidirectional_schedules_apply_to_the_placement():
    built, reasons = generate_applicable(bidirectional(4, 8))
    assert list(built) == ["dualpipe", "chimera", "greedy"]
    assert reasons["1f1b"] == "1f1b needs a placement other than 'bidirectional' (it sends every microbatch " \
                              "through every stage)"


def _route_search_optimum(problem: Problem) -> float:
    """The least makespan of a bidirectional problem by exhaustive search in time (tests.reference),
    its dependencies spelled out here from the documented routes, not from zbopt's op table: with
    v = 2 the down way runs devices 0..p-1, with v = 4 a V, 0..p-1 then p-1..0, with v = 6 down,
    up, down; the up way mirrored."""
    p, m = problem.num_devices, problem.num_microbatches
    down, half = (m + 1) // 2, problem.num_stages // 2
    legs = [list(range(p))[::1 if leg % 2 == 0 else -1] for leg in range(problem.chunks_per_device // 2)]
    down_devices = [device for leg in legs for device in leg]
    kinds = problem.kinds
    cost, needs, lane, grows, frees, device_of = {}, {}, {}, {}, {}, {}
    for j in range(m):
        route = list(range(half)) if j < down else list(range(half, 2 * half))
        devices = down_devices if j < down else [p - 1 - d for d in down_devices]
        for position, stage in enumerate(route):
            for kind in kinds:
                op = Op(kind, stage, j)
                cost[op] = problem.cost(kind, stage)
                lane[op], device_of[op] = ("compute", devices[position]), devices[position]
                grows[op], frees[op] = 0.0, 0.0
            activation = problem.activation_memory[stage]
            grows[Op("F", stage, j)] = activation
            sends = [problem.p2p_time if devices[other] != devices[position] else 0.0  # a V's turn: none
                     for other in (position - 1, min(position + 1, half - 1))]
            forward_source = [] if position == 0 else [(Op("F", route[position - 1], j), sends[0])]
            needs[Op("F", stage, j)] = forward_source
            last = position == half - 1
            needs[Op(kinds[1], stage, j)] = [(Op("F", stage, j), 0.0)] if last else \
                [(Op(kinds[1], route[position + 1], j), sends[1])]
            if problem.split_backward:
                kept = problem.weight_memory[stage]
                needs[Op("W", stage, j)] = [(Op("B", stage, j), 0.0)]
                frees[Op("B", stage, j)], frees[Op("W", stage, j)] = activation - kept, kept
            else:
                frees[Op("BW", stage, j)] = activation
    limits = [math.inf] * p if problem.memory_limit is None else list(problem.memory_limit)
    work = [sum(cost[op] for op in cost if device_of[op] == d) for d in range(p)]
    return _search_in_time(cost, needs, lane, grows, frees, device_of, limits, work, math.inf)


@given(st.data())
@settings(max_examples=12, deadline=None)
def test_cpsat_agrees_with_an_exhaustive_search_on_tiny_bidirectional_problems(data):
    """p = 2, m = 2 or 3 (one or two microbatches down, one up), random integer costs, latency and
    memory limits from the floor up: CP-SAT's proven optimum equals the exhaustive search's."""
    m = data.draw(st.sampled_from([2, 3]))
    costs = st.lists(st.sampled_from([1, 2, 3]), min_size=4, max_size=4)
    split = data.draw(st.booleans())
    problem = bidirectional(2, m, f=data.draw(costs), b=data.draw(costs), w=data.draw(costs) if split else None,
                            p2p_time=data.draw(st.sampled_from([0, 1])),
                            activation_memory=data.draw(st.lists(st.sampled_from([1, 2]), min_size=4, max_size=4)))
    floor = problem.one_microbatch_memory
    extra = data.draw(st.sampled_from([0, 1, 2, None]))
    if extra is not None:
        problem = problem.replace(memory_limit=[level + extra for level in floor])
    expected = _route_search_optimum(problem)
    assert_cpsat_proves(problem, expected)


def test_solver_proves_dualpipe_optimal_with_unit_costs():
    """examples/bidirectional.yaml (README), F = B = W = 1, p = 4, m = 8: every device works 24;
    devices 1 and 2 hold the first stage of neither way, so none of their ops starts before one
    forward has run: the bound is 25 (device load), and DualPipe meets it."""
    problem = load_problem(Path(__file__).parent.parent / "examples" / "bidirectional.yaml")
    assert problem == bidirectional(4, 8)
    result = solve(problem, time_limit=30, lower_peak=False)
    dual = simulate(problem, generate("dualpipe", problem))
    assert (result.status, result.objective, dual.makespan) == ("optimal", 25.0, 25.0)


@given(st.integers(2, 5), st.integers(2, 9), st.data())
@settings(max_examples=40, deadline=None)
def test_greedy_fits_any_limit_from_the_floor_without_deadlock(p, m, data):
    """The list schedule takes microbatches of both ways in; at the floor (one activation, the
    larger way's) a device taking in one way while the other holds it could deadlock both ends
    of the pipeline, which its spare-room rule prevents: valid, within the limit, every op run."""
    activation = data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=2 * p, max_size=2 * p))
    problem = bidirectional(p, m, f=data.draw(st.sampled_from([1.0, 2.0])), activation_memory=activation,
                            p2p_time=data.draw(st.sampled_from([0.0, 0.5])))
    extra = data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    problem = problem.replace(memory_limit=[level + extra for level in problem.one_microbatch_memory])
    result = simulate(problem, generate("greedy", problem))
    assert result.valid
    assert list(result.busy) == pytest.approx(device_work(problem))


@pytest.mark.parametrize("export", ["torch_csv", "megatron_order"])
def test_runtime_formats_refuse_both_ways(export):
    """torch and Megatron run every stage on every microbatch: the export says why it cannot."""
    from zbopt.io import torch_format
    problem = bidirectional(4, 8, weight_times=None) if export == "megatron_order" else bidirectional(4, 8)
    with pytest.raises(ZboptError, match="sends every microbatch through every stage, and placement 'bidirectional' "
                                         "sends half of them each way; export it as zbopt JSON"):
        getattr(torch_format, export)(problem, generate("dualpipe", problem))


# ------------------------------------------------------------------------------------- Chimera
# Fig. 3's example (D = 4 devices, N = 4 microbatches, 0 and 1 down, 2 and 3 up): the orders the
# authors' runtime issues (main_with_runtime_direct.py: rank r's schedule numbers a = 2 - h and
# b = h, h = min(r, 3 - r)), redrawn by hand. Device r holds down stage r and up stage 7 - r.
CHIMERA_FIG3 = [order.split() for order in (
    "0F0 0F1 7F2 7BW2 7F3 7BW3 0BW0 0BW1",
    "1F0 6F2 1F1 6F3 6BW2 1BW0 6BW3 1BW1",
    "5F2 2F0 5F3 2F1 2BW0 5BW2 2BW1 5BW3",
    "4F2 4F3 3F0 3BW0 3F1 3BW1 4BW2 4BW3",
)]


def test_chimera_order_is_the_runtime_s_on_fig3_example():
    schedule = generate("chimera", bidirectional(4, 4, w=None))
    assert [[str(op) for op in order] for order in schedule.orders] == CHIMERA_FIG3


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("units", [1, 2, 3])
def test_chimera_bubble_is_the_paper_s_d_minus_2_slots(p, units):
    """Table 2 of the paper: with F = B (one slot each) Chimera idles D - 2 slots per device, the
    ratio (D-2)/(2N+D-2); direct concatenation of whole units adds none when F = B."""
    problem = bidirectional(p, units * p, w=None)
    result = simulate(problem, generate("chimera", problem))
    assert result.makespan == 2 * units * p + p - 2
    assert result.bubble_rate == pytest.approx((p - 2) / (2 * units * p + p - 2))


@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_chimera_peak_memory_is_between_half_plus_one_and_d(p):
    """Table 2: activation memory from (D/2 + 1)·Ma to D·Ma; per device p/2 microbatches of its
    first-half stage and h + 1 of the other (told apart by activations 1 and 1000)."""
    activation = [1.0 if s % p < p // 2 else 1000.0 for s in range(2 * p)]  # first half of a route: 1
    problem = bidirectional(p, 2 * p, activation_memory=activation, weight_memory=0.0)
    result = simulate(problem, generate("chimera", problem))
    expected = [p // 2 + 1000 * (min(r, p - 1 - r) + 1) for r in range(p)]
    assert list(result.peak_memory) == expected
    assert list(get("chimera").peak_memory_bound(problem)) == expected
    plain = problem.replace(activation_memory=1.0)
    plain = simulate(plain, generate("chimera", plain))
    assert (min(plain.peak_memory), max(plain.peak_memory)) == (p // 2 + 1, p)


def test_chimera_is_no_alias_of_dualpipe_or_greedy():
    problem = bidirectional(4, 8)
    built, _ = generate_applicable(problem)
    assert built["chimera"].orders not in [schedule.orders for name, schedule in built.items() if name != "chimera"]


@pytest.mark.parametrize(("m", "w", "changes"), [
    (2, None, {}), (2, 1.0, {}), (3, 1.0, {"p2p_time": 0.5}),
    (3, None, {"p2p_time": 0.5, "forward_times": [1, 2, 1, 1, 2, 1, 1, 1]}),
])
def test_cpsat_agrees_with_an_exhaustive_search_on_two_vs(m, w, changes):
    """BitPipe's placement (v = 4: each way a V over 2p stages, its turn on one device: no
    latency), p = 2, unit costs and two cases with latency: CP-SAT's proven optimum is the
    exhaustive search's, and every lower bound is at most it."""
    from zbopt.solvers.bounds import lower_bounds

    problem = bidirectional(2, m, w=w, chunks_per_device=4, **changes)
    expected = _route_search_optimum(problem)
    assert_cpsat_proves(problem, expected)
    assert all(bound.value <= expected + 1e-9 for bound in lower_bounds(problem).bounds)


@pytest.mark.parametrize(("v", "m", "extra"), [(4, 2, 0.0), (4, 2, 1.0), (6, 2, None)])
def test_cpsat_agrees_with_an_exhaustive_search_under_limits_and_with_three_legs(v, m, extra):
    """The placement for any even v: with two V's under a limit at the floor and one above, and
    with v = 6 (each way down, up, down), latency 0.5: CP-SAT proves the exhaustive search's
    optimum and every lower bound is at most it."""
    from zbopt.solvers.bounds import lower_bounds

    problem = bidirectional(2, m, chunks_per_device=v, p2p_time=0.5, activation_memory=[1, 2] * v)
    if extra is not None:
        problem = problem.replace(memory_limit=[level + extra for level in problem.one_microbatch_memory])
    expected = _route_search_optimum(problem)
    assert_cpsat_proves(problem, expected)
    assert all(bound.value <= expected + 1e-9 for bound in lower_bounds(problem).bounds)
