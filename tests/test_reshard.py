"""FSDP's reshard after forward (issue 44, `allow_reshard`): a re-gather G of a stage and iteration
frees the stage's gathered parameters when its last forward ends and holds them again from the
G's start, on the device's all-gather lane; the stage's input gradients wait for it. Hand-computed
times and memory, the messages, CP-SAT against brute force over every order with every choice of
G's and places for them, and every bound below the optimum."""

import itertools

import numpy as np
import pytest

from tests.reference import device_linear_extensions
from zbopt import DeadlockError, Problem, ProblemError, Schedule, ScheduleError, compare, simulate, solve
from zbopt.core.ops import Op
from zbopt.schedules import generate
from zbopt.schedules.regathers import PLACES, regathered
from zbopt.schedules.registry import get
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.warm import best_heuristic

# one device, two chunks (stages 0 and 1), one microbatch; each stage's parameters take 3 and 1 to gather
TWO_CHUNKS = dict(num_devices=1, num_microbatches=1, chunks_per_device=2, forward_times=1, backward_times=1,
                  weight_times=1, unshard_times=1, unshard_memory=3)


def _orders(*texts: str) -> Schedule:
    return Schedule([[Op.from_str(text) for text in order.split()] for order in texts])


def _peak(simulation) -> float:
    return max(simulation.peak_memory)


def test_a_regather_frees_the_parameters_between_the_last_forward_and_itself():
    """By hand. Unshards 0-1 (stage 0) and 1-2 (stage 1); F0 on stage 0 1-2, on stage 1 2-3, B 3-4,
    W 4-5 (stage 1 resharded: 3 freed at 5); stage 0's G is listed after stage 1's W, so it is
    issued at 5 and runs 5-6; stage 0's B 6-7 and W 7-8. Memory: 3 from 0, 7 from 1 (stage 1's
    parameters and stage 0's activation), at 2 stage 0's parameters freed (its forward is done)
    and stage 1's activation held: 5; at 4 and 5 the two halves of stage 1's activation go, at 5
    its parameters: 1, and the G takes 3 again: 4. Peak 7; without the G 8 (both stages' parameters
    and both activations while stage 1's forward runs), one sooner: 7."""
    problem = Problem(**TWO_CHUNKS, allow_reshard=True)
    resharded = simulate(problem, _orders("0F0 1F0 1B0 1W0 0G0 0B0 0W0"))
    kept = simulate(problem, _orders("0F0 1F0 1B0 1W0 0B0 0W0"))
    assert resharded.times_of(Op("G", 0, 0)) == (5.0, 6.0)
    assert resharded.times_of(Op("B", 0, 0)) == (6.0, 7.0)
    assert (resharded.makespan, kept.makespan) == (8.0, 7.0)
    times, levels = resharded.memory_steps[0]
    assert times.tolist()[:5] == [0.0, 1.0, 2.0, 4.0, 5.0]
    assert levels.tolist()[:5] == [3.0, 7.0, 5.0, 4.5, 4.0]
    assert (_peak(resharded), _peak(kept)) == (7.0, 8.0)


def test_a_regather_waits_for_its_devices_unshards_after_the_step():
    """By hand, two iterations, stage 1's unshard 3, a step of 1. Iteration 0: unshards 0-1 and 1-4,
    F 1-2 and 4-5, stage 0's G listed after its forward but its lane is busy until 4: 4-5; stage 1's
    B 5-6, W 6-7, stage 0's B 7-8, W 8-9; step 9-10. Iteration 1: unshards 10-11 and 11-14, F 11-12,
    the G issued at 12 waits for the lane until 14: 14-15, stage 1's F 14-15."""
    problem = Problem(**{**TWO_CHUNKS, "unshard_times": [1, 3]}, iterations=2, optimizer_step_times=1,
                      allow_reshard=True)
    iteration = "0F{0} 0G{0} 1F{0} 1B{0} 1W{0} 0B{0} 0W{0}"
    result = simulate(problem, _orders(" ".join(iteration.format(k) for k in range(2))))
    assert [result.times_of(Op("G", 0, k)) for k in range(2)] == [(4.0, 5.0), (14.0, 15.0)]
    assert result.ends.step[0][0] == (9.0, 10.0)
    assert result.iteration_time == 20.0


def test_given_start_times_are_verified_against_the_lane_and_the_issue():
    """A G may not start before its device's unshards end, nor before the compute op listed before it."""
    problem = Problem(**TWO_CHUNKS, allow_reshard=True)
    timed = Schedule(_orders("0F0 0G0 1F0 1B0 1W0 0B0 0W0").orders, [[1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    assert simulate(problem, timed).makespan == 7.0
    early = Schedule(timed.orders, [[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0]])
    with pytest.raises(ScheduleError, match=r"0G0 starts at 1.5, before 0F0 \(listed before it\) ends at 2"):
        simulate(problem, early)
    slow = problem.replace(unshard_times=[1, 3])  # stage 1's unshard 1-4 holds the lane
    with pytest.raises(ScheduleError, match=r"0G0 starts at 2, before its device's unshards \(its all-gather "
                                            r"lane\) ends at 4"):
        simulate(slow, Schedule(timed.orders, [[1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0]]))


def test_the_messages_name_the_regather():
    problem = Problem(**TWO_CHUNKS, allow_reshard=True)
    with pytest.raises(DeadlockError, match=r"stuck at 0B0, waiting for its re-gather 0G0"):
        simulate(problem, _orders("0F0 1F0 1B0 1W0 0B0 0G0 0W0"))
    with pytest.raises(ScheduleError, match=r"op 0G1: a re-gather names its iteration by the iteration's first "
                                            r"microbatch \(0\)"):
        simulate(problem.replace(num_microbatches=2), _orders("0F0 0F1 1F0 1F1 1B0 1W0 1B1 1W1 0G1 0B0 0W0 0B1 0W1"))
    with pytest.raises(ScheduleError, match=r"op 0G0: a re-gather is not allowed in this problem \(allow_reshard "
                                            r"is false\)"):
        simulate(Problem(**TWO_CHUNKS), _orders("0F0 1F0 1B0 1W0 0G0 0B0 0W0"))
    with pytest.raises(ProblemError, match=r"allow_reshard.*needs unshard_times"):
        Problem(**{**TWO_CHUNKS, "unshard_times": None}, allow_reshard=True)


def test_the_memory_floor_counts_what_no_regather_can_have_freed():
    """Without resharding, stage 1's forward runs with both stages' parameters and both activations:
    8 (a limit of 7 is refused, naming them). With it, stage 0's may be freed by then (2 + 3 = 5),
    but not before the device's first forward: both unshards have started by its start (0-1 and
    1-2, the forward from 1), so 3 + 3 and its activation 1: 7, where brute force finds a schedule
    (8, with a G); below it a limit is refused."""
    with pytest.raises(ProblemError, match=r"gathered parameters .*\(8\)"):
        Problem(**TWO_CHUNKS, memory_limit=7)
    assert Problem(**TWO_CHUNKS, allow_reshard=True).min_memory_limit == (7.0,)
    assert regather_optimum(Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=7)) == 8.0
    with pytest.raises(ProblemError, match=r"memory_limit = 6.5: device 0 must hold"):
        Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=6.5)


def _regather_orders(problem: Problem, device: int):
    """Every order of the device's ops with any set of its G's, each at any place."""
    m = problem.num_microbatches
    regathers = [Op("G", stage, k * m) for stage in problem.stages_of_device[device] for k in range(problem.iterations)]
    for order in device_linear_extensions(problem, device):
        for size in range(len(regathers) + 1):
            for chosen in itertools.combinations(regathers, size):
                for places in itertools.product(range(len(order) + 1), repeat=size):
                    placed = list(order)
                    for regather, place in sorted(zip(chosen, places, strict=True), key=lambda item: -item[1]):
                        placed.insert(place, regather)
                    yield placed


def regather_optimum(problem: Problem) -> float:
    """The least iteration time over every combination of device orders with G's anywhere, timed as
    soon as possible. That loses nothing: a G listed after the compute op that ends last before its
    start in some timed schedule starts no later and, started earlier, holds its parameters only
    while that op's successor (which allocates at its start, or frees at its end) holds its own."""
    best = float("inf")
    for orders in itertools.product(*(list(_regather_orders(problem, d)) for d in range(problem.num_devices))):
        try:
            result = simulate(problem, Schedule([list(order) for order in orders]))
        except DeadlockError:
            continue
        if result.valid:
            best = min(best, result.iteration_time)
    return best


CASES = [  # each but the last needs a G (without allow_reshard its limit is below the floor)
    pytest.param(dict(TWO_CHUNKS, memory_limit=7), id="two-chunks-limit-7"),
    pytest.param(dict(TWO_CHUNKS, forward_times=[1, 2], backward_times=[2, 1], weight_times=None, memory_limit=6.5,
                      unshard_times=[2, 1], unshard_memory=[3, 2]), id="fused-limit-6.5"),
    pytest.param(dict(TWO_CHUNKS, weight_times=None, iterations=2, optimizer_step_times=1, grad_reduce_times=1,
                      memory_limit=7), id="two-iterations"),
    pytest.param(dict(num_devices=2, num_microbatches=1, chunks_per_device=2, forward_times=1,
                      backward_times=[2, 1, 1, 2], unshard_times=1, unshard_memory=[2, 2, 1, 1], memory_limit=4),
                 id="p2-v2"),
    pytest.param(dict(num_devices=1, num_microbatches=2, chunks_per_device=2, forward_times=1, backward_times=[1, 2],
                      unshard_times=[2, 1], unshard_memory=[2, 1], memory_limit=6), id="v2-m2-no-regather"),
]


@pytest.mark.parametrize("parameters", CASES)
def test_cpsat_meets_brute_force_with_regathers_and_the_bounds_stay_below(parameters):
    problem = Problem(**parameters, allow_reshard=True)
    optimum = regather_optimum(problem)
    result = solve(problem, time_limit=30)
    assert result.status == "optimal"
    assert result.simulation.iteration_time == pytest.approx(optimum)
    assert lower_bounds(problem).best <= optimum + 1e-9


def test_the_optimum_regathers_only_where_memory_makes_it_pay():
    """The two-chunk problem at limit 7 needs stage 0's G (peak 8 without, see the first test):
    optimum 8, its G in the answer; at limit 8 the parameters may stay: 7, and no G."""
    tight = solve(Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=7), time_limit=20)
    loose = solve(Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=8), time_limit=20)
    assert (tight.simulation.iteration_time, loose.simulation.iteration_time) == (8.0, 7.0)
    assert (tight.simulation.table.regathered, loose.simulation.table.regathered) == (((0, 0),), ())
    assert np.all(np.asarray(tight.simulation.peak_memory) <= 7.0)


def test_the_regathered_variant_lists_a_g_latest_or_hidden_behind_compute():
    """Breadth first on one device (stage 0's forward, then stage 1's pass, then stage 0's
    backward): latest lists stage 0's G right before its B (the first test's order: 8, peak 7);
    hidden behind stage 1's W (its 1 covers the gather of 1), which brings the memory back while
    stage 1's activation half is still held: peak 7.5, over a limit of 7. Stage 1's forward and
    backward are adjacent: no G for it."""
    problem = Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=7)
    breadth_first = _orders("0F0 1F0 1B0 1W0 0B0 0W0")
    latest, hidden = (regathered(problem, breadth_first, place) for place in PLACES)
    assert latest.orders == _orders("0F0 1F0 1B0 1W0 0G0 0B0 0W0").orders
    assert hidden.orders == _orders("0F0 1F0 1B0 0G0 1W0 0B0 0W0").orders
    assert (simulate(problem, latest).iteration_time, _peak(simulate(problem, latest))) == (8.0, 7.0)
    assert _peak(simulate(problem, hidden)) == 7.5


def test_the_variant_adds_nothing_where_no_regather_can_pay():
    """No limit, the switch off, or a stage's backward right after its last forward: None."""
    breadth_first = _orders("0F0 1F0 1B0 1W0 0B0 0W0")
    assert regathered(Problem(**TWO_CHUNKS, allow_reshard=True), breadth_first, "latest") is None
    assert regathered(Problem(**TWO_CHUNKS, memory_limit=8), breadth_first, "latest") is None
    depth_first = _orders("0F0 0B0 0W0 1F0 1B0 1W0")  # not a valid order, but no stage has room
    assert regathered(Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=7), depth_first, "latest") is None


def test_the_variant_names_each_iterations_g_by_its_first_microbatch():
    problem = Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=7, iterations=2, optimizer_step_times=1)
    twice = _orders("0F0 1F0 1B0 1W0 0B0 0W0 0F1 1F1 1B1 1W1 0B1 0W1")
    latest = regathered(problem, twice, "latest")
    assert [op for op in latest.orders[0] if op.kind == "G"] == [Op("G", 0, 0), Op("G", 0, 1)]
    assert simulate(problem, latest).valid


def test_compare_shows_the_regathered_row_where_it_fits_the_limit():
    """At limit 7 every breadth-first order keeps both stages' parameters (8) and breaks it; its
    re-gathered row fits, at the optimum's 8."""
    problem = Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=7)
    table = compare(problem, ["looped-bfs"], optimal=True, time_limit=10)
    rows = {row.name: row for row in table.rows}
    assert not rows["looped-bfs"].simulation.valid
    assert rows["looped-bfs (re-gathered)"].simulation.valid
    assert rows["looped-bfs (re-gathered)"].iteration_time == rows["cpsat"].iteration_time == 8.0


def test_the_warm_start_takes_a_regathered_heuristic_where_no_plain_one_fits():
    """At limit 7 every heuristic keeps both stages' parameters through stage 1's forward (8): the
    solver's start is a re-gathered one, at the optimum's 8."""
    name, simulation = best_heuristic(Problem(**TWO_CHUNKS, allow_reshard=True, memory_limit=7))
    assert name.endswith("(re-gathered)")
    assert (simulation.valid, simulation.iteration_time) == (True, 8.0)


def test_costs_that_are_no_whole_ticks_still_give_a_valid_answer_with_a_regather():
    """Thirds and sevenths: unshards 0-1/3 and 1/3-16/21, F on stage 0 1/3-2/3, on stage 1 from
    16/21 (its unshard) for 2/7, B 1/7, W 1/3 (to 32/21); the G only then (at 1B0's end stage 1's
    parameters and half an activation are still held: 7.5 with it), 1/3, then B 2/3 and W 1/3:
    20/7. Rounded to nearest ticks the model's order broke the real costs (a forward listed before
    another that really ended later); ticks now round up where re-gathers matter."""
    problem = Problem(**{**TWO_CHUNKS, "forward_times": [1 / 3, 2 / 7], "backward_times": [2 / 3, 1 / 7],
                         "weight_times": 1 / 3, "unshard_times": [1 / 3, 3 / 7]}, allow_reshard=True, memory_limit=7)
    result = solve(problem, time_limit=10)
    assert result.simulation.valid and result.simulation.table.regathered == ((0, 0),)
    assert result.simulation.iteration_time == pytest.approx(20 / 7)


def test_the_variant_leaves_timed_schedules_and_shared_host_links_alone():
    """PipeOffload's start times are part of it (which copy goes first on the shared link): a G
    would move them, and its orders alone clash there. No variant of it; compare's table (which
    raised on the clash) stands, its best row at the independent lower bound (26, device load)."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1, unshard_times=1, unshard_memory=2, allow_offload=True, offload_times=1,
                      shared_host_link=True, allow_reshard=True, memory_limit=8)
    assert regathered(problem, generate("pipeoffload", problem), "latest") is None
    table = compare(problem)
    best = min(row.iteration_time for row in table.rows if row.simulation.valid)
    assert best == table.lower_bound == 26.0


def test_the_serial_fallbacks_promise_what_they_hold_with_the_parameters_kept():
    """Serial-offload lists no G: with three chunks its last stage's forward runs with all three
    stages' parameters (3 each) and one activation, 10, which its registered bound says; the
    floor with re-gathers allowed is lower (its first forward's 1 + 3 + 3 = 7)."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=3, forward_times=1, backward_times=1,
                      weight_times=1, unshard_times=1, unshard_memory=3, allow_offload=True, offload_times=1,
                      allow_reshard=True, memory_limit=12)
    assert get("serial-offload").peak_memory_bound(problem) == (10.0, 10.0)
    assert simulate(problem, generate("serial-offload", problem)).peak_memory == (10.0, 10.0)
    assert problem.min_memory_limit == (7.0, 7.0)
