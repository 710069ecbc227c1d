"""Lower bounds: closed forms, and never above any schedule's makespan."""

import functools
import math
import random
import time

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from tests.reference import brute_force_optimum, problems, random_topological_schedule
from tests.test_schedules import FAMILIES, RANDOMLY_CHECKED
from zbopt import NotApplicableError, Op, Problem, critical_path, device_work, generate, op_graph, simulate, solve
from zbopt.schedules import applicable, registered
from zbopt.solvers import api
from zbopt.solvers.bounds import BOUND_NAMES, LowerBounds, lower_bounds
from zbopt.solvers.cross_device import cross_device_bound
from zbopt.solvers.implied import heads_and_tails, implied_graph, memory_disjunctions, memory_precedences
from zbopt.solvers.memory_bounds import activation_lifetimes, whole_activations_bound
from zbopt.solvers.sequencing import device_sequencing, jackson_preemptive, order_value


def test_uniform_1f1b_meets_the_device_load_bound():
    """F=B=W=1, c=0: device 0 can start at 0, works 3m, and its last op is W (tail 0), while the
    last device starts at 3 (p-1 forwards before) — the busiest-device bound is
    max_d head_d + 3m + tail_d; on device 0: 0 + 3m + 0; on device p-1: (p-1) + 3m + 0.
    The longest chain: one microbatch's 2p+1 ops, and m-1 more steps along one (kind, stage) column,
    whose ops run in microbatch order on one device."""
    p, m = 4, 8
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=1, backward_times=1, weight_times=1)
    bounds = lower_bounds(problem)
    assert critical_path(problem) == pytest.approx(2 * p + 1)
    assert bounds["critical_path"] == pytest.approx(2 * p + 1 + m - 1)
    assert bounds["device_load"] == pytest.approx((p - 1) + 3 * m)
    assert bounds["one_machine"] >= bounds["device_load"]


def test_memory_bound_closed_form():
    """p=4, F=B=W=1, c=0, M_B=1, M_W=0.5: on device 0 an activation lives at least 8 (F(0) start
    to B(0) end) for its first half and 9 (to W(0) end) for the rest: 8.5 memory-time per
    microbatch, m of them, at most `limit` at once: makespan >= 8.5 m / limit."""
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=1, weight_times=1,
                      weight_memory=0.5, memory_limit=2)
    assert lower_bounds(problem)["memory"] == pytest.approx(8.5 * 8 / 2)
    assert lower_bounds(problem.replace(memory_limit=None))["memory"] == 0.0


def test_memory_bound_with_recomputation_closed_form():
    """As above with m = 16, R = 1 and a checkpoint of 0: a recomputed activation on device 0 holds
    half of it for R + B = 2 and half for R + B + W = 3, 2.5 memory-time instead of 8.5, for one
    more unit of work. Recomputing y microbatches: makespan >= max(48 + y, (16 · 8.5 - 6y) / 2),
    equal at y = 5: 53 (keeping all: 68). The other devices give less (device 3: its first
    forward at 3 and 48 of work, 51)."""
    problem = Problem(num_devices=4, num_microbatches=16, forward_times=1, backward_times=1, weight_times=1,
                      weight_memory=0.5, memory_limit=2)
    assert lower_bounds(problem)["memory"] == pytest.approx(68)
    recomputing = problem.replace(allow_recompute=True, checkpoint_memory=0)
    assert lower_bounds(recomputing)["memory"] == pytest.approx(53)


def test_whole_activations_bound_closed_form():
    """p = 2, m = 2, every cost 1, M_B = 1, limit 1.5: device 0 holds one whole activation at a
    time. Kept, one spans F + rt + B = 1 + 2 + 1 with room 2 for the W and the recomputed F
    outside the spans; recomputed, R + B = 2. With k kept: 4 + 2k + max(0, 4 - 3k), least at
    k = 4/3: 20/3. Below 1 + checkpoint nothing overlaps: each takes F + rt + B = 4, W fits in
    the room: 8."""
    problem = Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1,
                      recompute_times=1, memory_limit=1.5, allow_recompute=True, checkpoint_memory=0.25)
    lifetimes = activation_lifetimes(problem)
    assert whole_activations_bound(problem, 0, lifetimes, device_load=6) == pytest.approx(20 / 3)
    assert whole_activations_bound(problem.replace(memory_limit=1.2), 0, lifetimes, device_load=6) == 8
    assert whole_activations_bound(problem.replace(memory_limit=2), 0, lifetimes, device_load=6) == 0


def test_device_sequencing_closed_form_at_one_activation():
    """Limit M_B = 1 with M_W = 0.5: device 0 can start F(0, i+1) only once B(0, i) and W(0, i) have
    ended, and B(0, i) waits for the round trip of microbatch i through the other p-1 devices
    ((p-1)(F+B) + 2(p-1)c): one microbatch at a time, m·(p(F+B) + W + 2(p-1)c). (The critical path
    of the implied graph finds it too; `lower_bounds` then skips the sequencing bound and reports 0.)"""
    p, m, f, b, w, c = 3, 4, 1.0, 1.5, 0.5, 0.25
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=f, backward_times=b, weight_times=w,
                      p2p_time=c, weight_memory=0.5, memory_limit=1)
    heads, tails = heads_and_tails(implied_graph(problem))
    closed_form = m * (p * (f + b) + w + 2 * (p - 1) * c)
    assert device_sequencing(problem, 0, heads, tails) == pytest.approx(closed_form)
    assert device_sequencing(problem, 0, heads, tails, needed=closed_form) == 0.0
    assert lower_bounds(problem).best == pytest.approx(closed_form)


def first_device_alone(p: int, m: int, limit: float) -> int:
    """Exhaustive search: the least time device 0 needs for its 3m unit ops (F = B = W = 1, c = 0,
    M_B = 1, M_W = 0.5) with every other device free: F, B and W each in microbatch order, W after
    its B, a forward only while what is held (F's minus half of each B and W) stays within `limit`,
    and B_i at least 2(p-1) after F_i ends (F_i through the p-1 other devices and B_i back). From a
    state (ops done per kind, waits of the B's still to run) the best finish is fixed: memoized."""
    lag = 2 * (p - 1)

    def after(elapsed: int, waits: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(max(0, wait - elapsed) for wait in waits)

    @functools.cache
    def left(f: int, b: int, w: int, waits: tuple[int, ...]) -> float:
        if w == m:
            return 0
        best = math.inf
        if f < m and f - 0.5 * (b + w) + 1 <= limit:
            best = min(best, 1 + left(f + 1, b, w, after(1, (*waits, 1 + lag))))
        if b < f:
            best = min(best, waits[0] + 1 + left(f, b + 1, w, after(waits[0] + 1, waits[1:])))
        if w < b:
            best = min(best, 1 + left(f, b, w + 1, after(1, waits)))
        return best

    return left(0, 0, 0, ())


@pytest.mark.parametrize(("p", "m", "limit", "optimum"), [(4, 8, 4, 27), (4, 8, 2, 41), (8, 16, 8, 55), (8, 16, 4, 79)])
def test_device_sequencing_on_the_known_unit_cost_optima(p, m, limit, optimum):
    """F=B=W=1, c=0, M_B=1, M_W=0.5 (the issue's known optima): device 0 alone is the bound, never
    above the optima, and above every other bound where memory binds. At limit p by hand: 0B0
    cannot start before 2p-1 (F through p devices, B back through p-1), memory lets at most p
    forwards run before it, so device 0 idles p-1 and ends its 3m of work at 3m + p - 1 at the
    earliest (27 and 55; ZB-H1 reaches it: m(F+B+W) + (p-1)(F+B-W)). At the tighter limit p/2 by
    exhaustive search over device 0's orders (39 and 77)."""
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=1, backward_times=1, weight_times=1,
                      weight_memory=0.5, memory_limit=limit)
    sequencing = 3 * m + p - 1 if limit == p else first_device_alone(p, m, limit)
    bounds = lower_bounds(problem)
    assert bounds["device_sequencing"] == pytest.approx(sequencing)
    assert bounds["device_sequencing"] <= optimum
    others = (bounds["critical_path"], bounds["device_load"], bounds["one_machine"], bounds["memory"])
    assert bounds["device_sequencing"] >= max(others)


def test_jackson_rule_matches_brute_force_on_a_small_case():
    # three jobs (head, duration, tail); by hand: run A 0-1, B preempts 1-3 (tail 9 -> 12),
    # A resumes 3-4 (tail 4 -> 8), C 4-5 (tail 1 -> 6)
    assert jackson_preemptive([(0, 2, 4), (1, 2, 9), (2, 1, 1)]) == 12.0


def test_no_bound_exceeds_any_schedule():
    """Every bound is at most every registered schedule's makespan, on random problems and on one
    problem per family (so that each of the 28 schedules random problems can reach runs)."""
    applied = set()

    @given(problems(max_devices=4, max_microbatches=6, chunks=(1, 2)))
    def check(problem):
        bounds = lower_bounds(problem)
        assert bounds["device_load"] >= max(device_work(problem)) - 1e-9
        assert bounds["one_machine"] >= bounds["device_load"] - 1e-9
        for entry in registered():
            try:
                result = simulate(problem, generate(entry.name, problem))
            except NotApplicableError:
                continue
            applied.add(entry.name)
            assert bounds.best <= result.makespan + 1e-9, entry.name

    for family in FAMILIES:
        check = example(family)(check)
    check()
    assert set(RANDOMLY_CHECKED) <= applied, sorted(set(RANDOMLY_CHECKED) - applied)


def heuristics_within_their_own_peak(problem):
    """(name, its simulation, the problem limited to its own peak) of every heuristic that applies."""
    for name, schedule in applicable(problem):
        result = simulate(problem, schedule)
        limited = problem.replace(memory_limit=[max(peak, need) for peak, need in
                                                zip(result.peak_memory, problem.min_memory_limit, strict=True)])
        yield name, result, limited


@settings(max_examples=50)
@given(problems(max_devices=3, max_microbatches=5, chunks=(1, 2), recompute=True))
def test_memory_bound_holds_for_schedules_within_the_limit(problem):
    """The memory bound is one of the graph's: 0.1 s leaves the device relaxations (up to 20 s on
    a V problem, where CP-SAT rarely closes them) nearly no time, not the bound under test."""
    for name, result, limited in heuristics_within_their_own_peak(problem):
        bounds = lower_bounds(limited, time.perf_counter() + 0.1)
        assert "memory" in bounds.by_name() and bounds["memory"] <= result.makespan + 1e-9, name


def test_memory_precedences_closed_form():
    """Limit 4, M_B = 1, M_W = 0.3: F(s, i+4) would be a fifth whole activation unless B(s, i) has
    ended; F(s, i+k) with W(s, i) pending holds k·0.3 + 1, over 4 first at k = 11."""
    problem = Problem(num_devices=2, num_microbatches=12, forward_times=1, backward_times=1, weight_times=1,
                      weight_memory=0.3, memory_limit=4)
    pairs = set(memory_precedences(problem, list(op_graph(problem))))
    expected = {(Op("B", s, i), Op("F", s, i + 4)) for s in range(2) for i in range(8)}
    expected |= {(Op("W", s, 0), Op("F", s, 11)) for s in range(2)}
    assert pairs == expected
    fused = problem.replace(weight_times=None, weight_memory=None, memory_limit=2.5)
    assert set(memory_precedences(fused, list(op_graph(fused)))) == {
        (Op("BW", s, i), Op("F", s, i + 2)) for s in range(2) for i in range(10)}


def test_memory_disjunctions_closed_form():
    """Limit 4, M_B = 1, M_W = 0.3, F(s, n) starting with B(s, j) pending holds n-j+1 whole
    activations, leaving room for (4 - (n-j+1)) / 0.3 pending W: for j = n-3, n-2, n-1 that is
    0, 3 and 6, so W(s, n-4), W(s, n-6) or W(s, n-8) must have ended, or that B."""
    problem = Problem(num_devices=2, num_microbatches=12, forward_times=1, backward_times=1, weight_times=1,
                      weight_memory=0.3, memory_limit=4)
    expected = {(Op("B", s, n - back), Op("W", s, n - weight), Op("F", s, n))
                for s in range(2) for n in range(12) for back, weight in ((3, 4), (2, 6), (1, 8)) if n >= weight}
    assert set(memory_disjunctions(problem, list(op_graph(problem)))) == expected
    assert memory_disjunctions(problem.replace(weight_times=None, weight_memory=None), list(op_graph(problem))) == []


@given(problems(max_devices=3, max_microbatches=6, chunks=(1, 2), iterations=(1, 2)), st.booleans(),
       st.integers(0, 10**6))
def test_memory_precedences_and_disjunctions_hold_in_every_microbatch_ordered_schedule(problem, flush, seed):
    """The theorem behind them, on random schedules whose columns run in microbatch order, under a
    limit equal to each device's own peak (or the least valid limit)."""
    problem = problem.replace(flush=flush)
    timed = simulate(problem, random_topological_schedule(problem, seed, microbatch_order=True))
    limited = problem.replace(memory_limit=[max(peak, need) for peak, need in
                                            zip(timed.peak_memory, problem.min_memory_limit, strict=True)])
    for before, forward in memory_precedences(limited, list(op_graph(limited))):
        assert timed.times_of(before)[1] <= timed.times_of(forward)[0] + 1e-9, (before, forward)
    for backward, weight, forward in memory_disjunctions(limited, list(op_graph(limited))):
        begins = timed.times_of(forward)[0] + 1e-9
        assert timed.times_of(backward)[1] <= begins or timed.times_of(weight)[1] <= begins, (backward, weight)
    heads, tails = heads_and_tails(implied_graph(limited))
    for device in range(limited.num_devices):
        assert device_sequencing(limited, device, heads, tails) <= timed.makespan + 1e-9, device


def test_device_sequencing_is_as_tolerant_as_the_simulator_in_large_memory_units():
    """M_B = 10⁶: a schedule peaking at 3·10⁶ is valid under a limit 10⁻⁴ lower (the simulator's
    tolerance is relative), so no bound there may exceed its makespan."""
    problem = Problem(num_devices=4, num_microbatches=8, weight_times=1, p2p_time=0.5, activation_memory=1e6,
                      memory_limit=3e6)
    best = solve(problem, time_limit=30).simulation
    tighter = problem.replace(memory_limit=3e6 - 1e-4)
    assert simulate(tighter, best.schedule).valid
    assert lower_bounds(tighter).best <= best.makespan + 1e-9


@settings(max_examples=15)
@given(problems(max_devices=2, max_microbatches=2, chunks=(2,)), st.sampled_from([0.0, 0.5, 1.0, None]))
def test_single_device_bounds_never_exceed_the_brute_force_optimum(problem, extra_memory):
    """Fused backward (F, BW), or one device split: small enough to try every order."""
    assume(not problem.split_backward or problem.num_devices == 1)
    if extra_memory is not None:
        problem = problem.replace(memory_limit=[need + extra_memory for need in problem.min_memory_limit])
    bounds = lower_bounds(problem)
    optimum = brute_force_optimum(problem)
    assert bounds["device_relaxation"] <= optimum + 1e-9
    assert bounds["device_sequencing"] <= optimum + 1e-9


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_device_sequencing_closed_form_with_two_chunks(m):
    """p = 2, V placement (device 0 holds stages 0 and 3), F = 1, BW = 2, p2p c, memory for one
    microbatch (2 activations). After F(3, i) device 0 is full: F(0, i+1) waits for BW(3, i), and
    F(3, i+1) for BW(0, i), which waits for BW(3, i) and the round trip BW(2, i), BW(1, i) on device
    1 (4 + 2c). From the end t of F(3, i) to that of F(3, i+1): 2 + 2c + 4 + 2 + 1 = 9 + 2c; the
    first F(3, 0) ends at 4 + 2c, the last BW(0) 8 + 2c after the last F(3):
    (9 + 2c)·m + 3 + 2c. Device 1 fits its work in those gaps, so that is the optimum too."""
    c = 0.25
    problem = Problem(num_devices=2, num_microbatches=m, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=2, p2p_time=c, memory_limit=2)
    closed_form = (9 + 2 * c) * m + 3 + 2 * c
    heads, tails = heads_and_tails(implied_graph(problem))
    assert device_sequencing(problem, 0, heads, tails) == pytest.approx(closed_form)
    assert lower_bounds(problem).best == pytest.approx(closed_form)
    optimum = _solved_without_bounds(problem)
    assert optimum.status == "optimal" and optimum.objective == pytest.approx(closed_form)


def _solved_without_bounds(problem: Problem, time_limit: float = 30):
    """CP-SAT's own optimum, the driver's bounds all 0: a check on the bounds that does not lean on them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "lower_bounds", lambda *_args: LowerBounds())
        return solve(problem, time_limit=time_limit, lower_peak=False)


@settings(max_examples=12, deadline=None)
@given(st.integers(2, 3), st.integers(2, 3), st.sampled_from(["loop", "v"]), st.integers(0, 10**6))
def test_device_sequencing_never_exceeds_the_cpsat_optimum_with_split_backward(v, m, placement, seed):
    """The dynamic program's main case, which brute force cannot reach: p = 2, split backward,
    unequal costs, memory at the floor or half an activation above it."""
    rng = random.Random(seed)
    stages = 2 * v
    problem = Problem(num_devices=2, num_microbatches=m, chunks_per_device=v, placement=placement,
                      forward_times=[rng.choice([1, 2]) for _ in range(stages)],
                      backward_times=[rng.choice([1, 2, 3]) for _ in range(stages)],
                      weight_times=[rng.choice([1, 2]) for _ in range(stages)], weight_memory=0.3,
                      p2p_time=rng.choice([0, 0.5]))
    problem = problem.replace(memory_limit=[need + rng.choice([0, 0.5]) for need in problem.min_memory_limit])
    optimum = _solved_without_bounds(problem)
    assert optimum.status == "optimal"
    heads, tails = heads_and_tails(implied_graph(problem))
    for device in range(2):
        assert device_sequencing(problem, device, heads, tails) <= optimum.objective + 1e-9, device


@settings(max_examples=7)  # every registered heuristic per example: 1.1 s each
@given(problems(max_devices=3, max_microbatches=4, chunks=(2,)))
def test_single_device_bounds_hold_for_every_heuristic_within_its_own_peak(problem):
    for name, result, limited in heuristics_within_their_own_peak(problem):
        bounds = lower_bounds(limited, time.perf_counter() + 2)  # cut by time, each is still a bound
        assert max(bounds["device_relaxation"], bounds["device_sequencing"]) <= result.makespan + 1e-9, name


def test_a_stage_that_holds_nothing_sets_no_memory_precedence():
    """activation_memory 0 (and a limit of 0, the floor): memory never binds, so the best bound is
    one device's work (p = 1: F + B per microbatch)."""
    problem = Problem(num_devices=1, num_microbatches=2, forward_times=1, backward_times=2, activation_memory=0,
                      memory_limit=0)
    assert memory_precedences(problem, list(op_graph(problem))) == []
    assert lower_bounds(problem).best == pytest.approx(6)


@settings(max_examples=10, deadline=None)
@given(problems(max_devices=3, max_microbatches=3, chunks=(2,)), st.sampled_from([0.0, 0.5, None]))
def test_a_devices_reach_is_never_below_its_single_device_bounds(problem, extra_memory):
    """`order_value` decides which devices' single-device bounds are skipped (those whose reach the
    best bound already meets): it must be at least both of them on every device."""
    if extra_memory is not None:
        problem = problem.replace(memory_limit=[need + extra_memory for need in problem.min_memory_limit])
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(graph)
    for device in range(problem.num_devices):
        reach = order_value(problem, device, heads, tails)
        assert device_sequencing(problem, device, heads, tails) <= reach + 1e-9, device
        assert cross_device_bound(problem, (device,), graph, heads, tails, 5.0) <= reach + 1e-9, device


def test_every_bound_is_listed_with_its_time_and_the_device_it_binds_on():
    """V placement at V-Min's memory (p = 4, m = 8): the last device binds, and the bound record
    says so, with the value the device's own dynamic program gives; every bound has its seconds."""
    base = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", forward_times=9.261,
                   backward_times=9.043, weight_times=4.6685, p2p_time=0.601, activation_memory=0.5,
                   weight_memory=0.183)
    problem = base.replace(memory_limit=max(simulate(base, generate("v-min", base)).peak_memory))
    began = time.perf_counter()
    bounds = lower_bounds(problem, began + 6)  # the dynamic program needs 0.04 s, the relaxations get the rest
    elapsed = time.perf_counter() - began
    assert [bound.name for bound in bounds.bounds] == [name for name in BOUND_NAMES if name not in
                                                       ("pair_count", "heaviest_microbatches", "iteration_ends",
                                                        "device_work", "span")]
    assert all(bound.seconds >= 0 for bound in bounds.bounds) and sum(b.seconds for b in bounds.bounds) <= elapsed
    heads, tails = heads_and_tails(implied_graph(problem))
    binding = bounds.binding_bound
    assert binding.name in ("device_sequencing", "device_relaxation") and binding.devices == (3,)
    assert bounds["device_sequencing"] == pytest.approx(device_sequencing(problem, 3, heads, tails))
    assert binding.describe() == f"{binding.name} on device 3"
