"""Large-neighbourhood search: never worse than its start, always re-simulated and valid; and the
default backend that runs it after an unproven full model."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tests.reference import brute_force_optimum, longest_path_starts
from zbopt import Problem, generate, simulate, solve
from zbopt.schedules.common import schedule_from_starts
from zbopt.solvers import api, cpsat, full_model, lns
from zbopt.solvers.answer import start_times
from zbopt.solvers.bounds import LowerBounds
from zbopt.solvers.task import Found, SearchTask

SMALL = dict(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2, weight_times=1, weight_memory=0.5)


# SMALL's starts, p = m = 2, F = 1, B = 2, W = 1, by closed form: GPipe and 1F1B with W right after B
# (m+p-1)(F+B) + mW = 3·3 + 2 = 11; ZB-H1 m(F+B+W) + (p-1)(F+B-W) = 2·4 + 1·2 = 10 (Zero Bubble
# paper, section 3; m >= p, W <= F)
STARTS = {"gpipe": 11.0, "1f1b": 11.0, "zb-h1": 10.0}


@pytest.mark.parametrize("start", STARTS)
def test_lns_improves_its_start_and_never_passes_the_optimum(start):
    """From each start LNS reaches the brute-force optimum (10), so it improves the starts above it;
    its objective is its orders' makespan as an independent longest-path timing gives it."""
    problem = Problem(**SMALL)
    result = solve(problem, "lns", time_limit=3, warm_start=start, lower_peak=False)
    started = simulate(problem, generate(start, problem)).makespan
    optimum = brute_force_optimum(problem)
    assert started == STARTS[start] and optimum == 10.0
    assert result.simulation.valid and result.objective == pytest.approx(optimum)
    schedule = result.simulation.schedule
    assert schedule.start_times is None  # the orders alone, timed as early as they allow: re-simulated
    starts = longest_path_starts(problem, schedule)
    assert result.objective == pytest.approx(max(begin + problem.cost(op.kind, op.stage)
                                                 for op, begin in starts.items()))


def test_lns_keeps_the_memory_limit_and_reaches_the_optimum_of_a_small_problem():
    problem = Problem(**SMALL, memory_limit=1.5)
    result = solve(problem, "lns", time_limit=3, lower_peak=False)
    assert max(result.simulation.peak_memory) <= 1.5
    assert result.objective == pytest.approx(brute_force_optimum(problem))


def test_lns_without_a_schedule_it_can_improve_leaves_the_warm_start():
    """Two iterations (weight-update barriers, which it does not model): the warm start stands."""
    problem = Problem(**SMALL, iterations=2)
    result = solve(problem, "lns", time_limit=2, warm_start="1f1b", lower_peak=False)
    assert result.objective == simulate(problem, generate("1f1b", problem)).makespan


def _task(problem: Problem, warm: str, seconds: float) -> SearchTask:
    return SearchTask("makespan", simulate(problem, generate(warm, problem)), 0.0, time.perf_counter() + seconds,
                      workers=1, seed=0)


def test_the_default_backend_hands_an_unproven_full_model_answer_to_lns(monkeypatch):
    """Where the full model does not prove its answer (stood in for: it returns its warm start,
    unproven, with a bound), LNS continues from that schedule for the rest of the time and reaches
    the optimum; the full model's bound stays the answer's, and it had only its share of the time."""
    problem = Problem(**SMALL)
    task = _task(problem, "1f1b", 3.0)
    given = []

    def unproven(problem, first, **options):
        given.append(first.deadline)
        return Found("feasible", start_times(first.warm), 4.25, None, 1.0)

    monkeypatch.setattr(full_model, "search", unproven)
    found = cpsat.search(problem, task, lns_share=0.5)
    optimum = brute_force_optimum(problem)
    assert task.warm.makespan > optimum + 1e-9  # there was something to improve
    assert simulate(problem, schedule_from_starts(problem, found.starts, "test")).makespan == pytest.approx(optimum)
    assert (found.status, found.bound) == ("feasible", 4.25)
    assert given[0] < task.deadline - 1.0  # half of the ~3 s went to LNS


def test_the_default_backend_runs_lns_only_past_a_size(monkeypatch):
    """The full model alone on problems of fewer than LNS_MIN_OPS ops, LNS after it from that size on."""
    problem = Problem(**SMALL)
    ran = []
    monkeypatch.setattr(lns, "search", lambda problem, task: ran.append(task) or Found("unknown", None, 0.0, None, 1.0))
    for least, expected in ((problem.num_ops + 1, 0), (problem.num_ops, 1)):
        monkeypatch.setattr(cpsat, "LNS_MIN_OPS", least)
        monkeypatch.setattr(full_model, "search",
                            lambda problem, first, **options: Found("feasible", None, 0.0, None, 1.0))
        ran.clear()
        cpsat.search(problem, _task(problem, "1f1b", 1.0))
        assert len(ran) == expected


def test_the_default_backend_runs_no_lns_after_a_proof(monkeypatch):
    """A full model that proves its answer (here: optimal on a small problem) ends the search."""
    problem = Problem(**SMALL, memory_limit=1.5)  # 1f1b needs 2

    def no_lns(*_args, **_options):
        raise AssertionError("LNS ran after a proof")

    monkeypatch.setattr(lns, "search", no_lns)
    found = cpsat.search(problem, _task(problem, "zb-1p", 10.0), lns_share=0.5)
    assert found.status == "optimal"
    assert found.modelled == pytest.approx(brute_force_optimum(problem))


def test_the_default_backend_refuses_an_lns_share_of_all_the_time():
    problem = Problem(**SMALL)
    with pytest.raises(ValueError, match="lns_share 1"):
        cpsat.search(problem, _task(problem, "1f1b", 1.0), lns_share=1)


def test_the_default_backend_without_a_warm_start_gives_the_full_model_all_the_time(monkeypatch):
    """LNS needs a schedule to start from: with none, the full model keeps the whole search time
    (with half, it may find nothing and the call would end early without a schedule)."""
    problem = Problem(**SMALL)
    task = replace(_task(problem, "1f1b", 5.0), warm=None)
    given = []
    monkeypatch.setattr(full_model, "search", lambda problem, first, **options: given.append(first.deadline)
                        or Found("unknown", None, 0.0, None, 1.0))
    monkeypatch.setattr(lns, "search", lambda *_args: pytest.fail("LNS ran without a schedule to start from"))
    cpsat.search(problem, task, lns_share=0.5)
    assert given == [task.deadline]


def test_an_answer_that_meets_the_full_models_bound_is_optimal_decided_by_the_solver(monkeypatch):
    """LNS reaches the bound the full model proved (stood in for: an unproven warm start with the
    true optimum as its bound; the independent bounds all 0): optimal, and the solver decided it."""
    problem = Problem(**SMALL)
    optimum = brute_force_optimum(problem)
    monkeypatch.setattr(api, "lower_bounds", lambda *_args: LowerBounds())
    monkeypatch.setattr(full_model, "search", lambda problem, first, **options:
                        Found("feasible", start_times(first.warm), optimum, None, 1.0))
    result = solve(problem, "cpsat", time_limit=3, warm_start="1f1b", lower_peak=False, lns_share=0.5)
    assert (result.status, result.objective, result.decided_by) == ("optimal", pytest.approx(optimum), "solver")


@pytest.mark.parametrize("limit", [None, 3.0])
def test_under_a_memory_limit_the_default_backend_starts_from_the_optimal_block(monkeypatch, limit):
    """A full model handed the block-built start that answers with a longer schedule, unscored (as
    one stopped before a solution of its own answers with its hint): the answer is the start it was
    handed, the optimal block repeated and squeezed, shorter than the best heuristic and valid
    under the limit. Without a limit no block is searched: the full model gets the warm start."""
    from zbopt.solvers.warm import best_heuristic

    problem = Problem(num_devices=3, num_microbatches=6, chunks_per_device=2, forward_times=[2, 1, 2, 1, 2, 1],
                      backward_times=2, weight_times=1, p2p_time=0.5, memory_limit=limit)
    warm = best_heuristic(problem)[1]  # at the limit: greedy, 132 against the block's 103.5
    task = replace(_task(problem, "interleaved-1f1b", 10.0), warm=warm)
    handed = []

    def longer(problem, first, **options):
        handed.append(first.warm)
        return Found("feasible", start_times(warm), 0.0, None, 1.0)

    monkeypatch.setattr(full_model, "search", longer)
    monkeypatch.setattr(cpsat, "LNS_MIN_OPS", 10**9)  # the full model alone
    found = cpsat.search(problem, task)
    answer = simulate(problem, schedule_from_starts(problem, found.starts, "test"))
    if limit is None:
        assert handed == [warm] and answer.makespan == pytest.approx(warm.makespan)
        return
    block = handed[0]
    assert block is not warm and block.valid and block.makespan < warm.makespan
    assert found.status == "feasible" and task.kept["incumbent"].modelled == pytest.approx(block.makespan)
    assert answer.valid and answer.makespan == pytest.approx(block.makespan)


def test_two_microbatches_trading_places_keep_a_valid_schedule_under_the_limit():
    """LNS's swap move where microbatches differ: every device's order with two microbatches
    traded, compacted under the caps, is a valid schedule of the problem (the simulator's word)."""
    import random

    from zbopt.core.ops import op_table
    from zbopt.core.ticks import tick_problem, tick_scale

    problem = Problem(num_devices=3, num_microbatches=6, forward_times=1, backward_times=1, weight_times=1,
                      microbatch_tokens=[512, 4096, 1024, 2048, 768, 3072], attention_share=0.3)
    problem = problem.replace(memory_limit=max(simulate(problem, generate("zb-h1", problem)).peak_memory))
    integral = tick_problem(problem, tick_scale(problem))
    table = op_table(integral)
    started = simulate(integral, generate("zb-h1", integral))
    in_time_order = [op for _, op in sorted(zip(started.start.tolist(), started.table.ops(), strict=True))]
    current = lns._timed(integral, in_time_order, problem.memory_caps)
    rng, moved = random.Random(0), 0
    for _ in range(20):
        swapped = lns._swapped(integral, table, current, problem.memory_caps, rng)
        if swapped is not None:
            order = sorted(range(table.size), key=lambda i: swapped[i])
            schedule = schedule_from_starts(integral, {table.op(i): swapped[i] for i in order}, "swapped")
            assert simulate(integral, schedule).valid
            moved += swapped != current  # microbatches of other costs traded: other start times
    assert moved > 0
