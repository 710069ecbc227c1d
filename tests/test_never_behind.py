"""The optimizer is the best row of every table it prints (issue 41, item 1): over random small
problems (equal and unequal microbatches, memory limits, loop, V and both-ways placements,
recomputation, offload, overlapped pairs) `compare --optimal`'s answer is no longer than any row
within the limit, and a plan's optimal row no longer than any row on its split."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbopt import Device, Layer, Model, Pipeline, Problem, compare, generate, plan, simulate, solve
from zbopt.core.errors import NotApplicableError
from zbopt.core.problem.order import ORDER_RULES
from zbopt.core.tolerance import RELATIVE_TOLERANCE
from zbopt.planning.comparison import OPTIMAL_ROW
from zbopt.planning.planner.result import OPTIMAL
from zbopt.schedules import registered

MECHANISMS = ("none", "recompute", "offload", "pairs", "tokens", "both ways")


@st.composite
def problems(draw) -> Problem:
    """A small problem with one mechanism at most, and a memory limit between its floor and twice it."""
    mechanism = draw(st.sampled_from(MECHANISMS))
    devices = draw(st.sampled_from((2, 4) if mechanism == "both ways" else (2, 3)))
    chunks = 2 if mechanism == "both ways" else draw(st.sampled_from((1, 2)))
    placement = "bidirectional" if mechanism == "both ways" else draw(st.sampled_from(("loop", "v"))) \
        if chunks == 2 else "loop"
    microbatches = draw(st.integers(2, 4)) * (2 if mechanism == "both ways" else 1)
    cost = st.integers(1, 3).map(float)
    values = dict(num_devices=devices, num_microbatches=microbatches, chunks_per_device=chunks, placement=placement,
                  forward_times=draw(cost), backward_times=draw(cost), weight_times=draw(cost),
                  p2p_time=draw(st.sampled_from((0.0, 0.5))))
    if mechanism == "recompute":
        values.update(allow_recompute=True, checkpoint_memory=0.25)
    elif mechanism == "offload":
        values.update(allow_offload=True, offload_times=draw(cost))
    elif mechanism == "pairs":
        values.update(overlap_times={"FBW": values["forward_times"] + values["backward_times"]})
    elif mechanism == "tokens":
        values.update(microbatch_tokens=draw(st.lists(st.integers(1, 8), min_size=microbatches,
                                                      max_size=microbatches)), attention_share=0.3)
    floor = max(Problem(**values).min_memory_limit)
    values["memory_limit"] = draw(st.sampled_from((None, floor, 1.5 * floor, 2 * floor)))
    return Problem(**values)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_compares_optimal_row_is_never_behind_a_row_within_the_limit(problem):
    comparison = compare(problem, optimal=True, time_limit=5)
    rows = [row for row in comparison.rows if row.within_memory_limit]
    answers = [row for row in comparison.rows if row.name == OPTIMAL_ROW]
    assert answers and answers[0].within_memory_limit, "the optimizer has no row within the limit"
    answer = answers[0]
    best = min(row.makespan for row in rows)
    assert answer.makespan <= best * (1 + RELATIVE_TOLERANCE), [(row.name, row.makespan) for row in rows]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3)), min_size=4, max_size=7),
       st.sampled_from((1, 2)))
def test_a_plans_optimal_row_is_never_behind_a_row_on_its_split(layers, chunks):
    model = Model.from_repeats([(Layer(f"layer {index}", float(f), float(b), float(w), activation_gb=1.0,
                                       parameters_gb=0.5), 1) for index, (f, b, w) in enumerate(layers)])
    answer = plan(model, Device(memory_gb=64), Pipeline(2, chunks, "loop", 4), time_limit=8)
    compared = 0
    for pipeline in answer.pipelines:
        by_split: dict = {}
        for row in pipeline.rows:
            if row.simulation is not None and row.simulation.valid:
                by_split.setdefault(row.split, []).append(row)
        for split, rows in by_split.items():
            optimal = [row.makespan for row in rows if row.schedule == OPTIMAL]
            if optimal:
                best = min(row.makespan for row in rows)
                assert optimal[0] <= best * (1 + RELATIVE_TOLERANCE) + math.ulp(best), (split, rows)
                compared += 1
    assert compared, "no split had an optimal row to compare"


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 4), st.integers(3, 6), st.lists(st.integers(1, 16), min_size=6, max_size=6),
       st.sampled_from((None, 1.0, 1.5)))
def test_solves_answer_is_never_behind_a_heuristic_in_any_order(devices, microbatches, tokens, limit):
    """`solve` alone (no rows given) against every registered heuristic in every order rule,
    DynaPipe's searched one included: issue 41 found its start planned on the stage values, 17%
    behind greedy in DynaPipe's order. The time limit leaves the heuristics their time (their share
    of it is 30%): a row not built in it is not weighed."""
    problem = Problem(num_devices=devices, num_microbatches=microbatches, weight_times=1.0, attention_share=0.3,
                      microbatch_tokens=tokens[:microbatches])
    if limit is not None:
        problem = problem.replace(memory_limit=limit * max(problem.min_memory_limit))
    answer = solve(problem, time_limit=5, lower_peak=False)
    rows = {}
    for entry in registered():
        for rule in ORDER_RULES:
            try:
                simulation = simulate(problem, generate(entry.name, problem, order=rule))
            except NotApplicableError:
                continue
            if simulation.valid:
                rows[f"{entry.name} ({rule})"] = simulation.makespan
    best = sorted(rows.items(), key=lambda item: item[1])[:3]
    assert answer.objective <= min(rows.values()) * (1 + RELATIVE_TOLERANCE), (answer.warm_start, best)
