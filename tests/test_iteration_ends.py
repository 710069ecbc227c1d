"""The iteration's ends (issue 44): gradient reductions, FSDP's unshards and the optimizer step,
timed beside the pipeline, optimised by CP-SAT and bounded."""

import pytest

from tests.reference import brute_force_optimum
from zbopt import Problem, Schedule, ScheduleError, ZboptError, simulate, solve
from zbopt.core.ops import Op
from zbopt.schedules import generate
from zbopt.solvers.bounds import lower_bounds

# p = 2, m = 2, F = B = W = 1; 1F1B with each W right after its B, written out by hand:
#   device 0: F0 0-1, F1 1-2, B0 3-4 (after device 1's B0), W0 4-5, B1 6-7, W1 7-8
#   device 1: F0 1-2, B0 2-3, W0 3-4, F1 4-5, B1 5-6, W1 6-7
HAND = Schedule([[Op.from_str(text) for text in ["0F0", "0F1", "0B0", "0W0", "0B1", "0W1"]],
                 [Op.from_str(text) for text in ["1F0", "1B0", "1W0", "1F1", "1B1", "1W1"]]])
BASE = dict(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1)


def test_without_ends_the_iteration_time_is_the_makespan_and_zeros_change_nothing():
    plain = Problem(**BASE)
    zeros = Problem(**BASE, grad_reduce_times=0, optimizer_step_times=0, unshard_times=0, unshard_memory=0)
    assert plain.iteration_ends is None and zeros.iteration_ends is None
    for problem in (plain, zeros):
        result = simulate(problem, HAND)
        assert result.ends is None
        assert result.iteration_time == result.makespan == 8.0
    assert "grad_reduce_times" not in plain.to_dict()
    assert Problem.from_dict(zeros.to_dict()) == zeros


def test_a_reduction_overlaps_the_other_devices_drain():
    """Stage 1's last W ends at 7: its reduction (1) runs 7-8 while device 0 drains, its step 8-8.5;
    stage 0's last W ends at 8: reduction 3, 8-11, step 11-11.5: the iteration ends at 11.5."""
    problem = Problem(**BASE, grad_reduce_times=[3, 1], optimizer_step_times=0.5)
    result = simulate(problem, HAND)
    assert result.makespan == 8.0
    assert result.ends.reduce == (((8.0, 11.0), (7.0, 8.0)),)  # one iteration
    assert result.ends.step == (((11.0, 11.5), (8.0, 8.5)),)
    assert result.iteration_time == 11.5
    assert result.to_dict()["iteration_time"] == 11.5


def test_reductions_of_one_device_queue_on_its_stream_in_the_order_they_become_ready():
    """p = 1, v = 2: the second chunk's gradients are done first (its backward runs first), so its
    reduction goes first; the first chunk's waits for the stream."""
    problem = Problem(num_devices=1, num_microbatches=1, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1, grad_reduce_times=[2, 5])
    orders = [[Op.from_str(text) for text in ["0F0", "1F0", "1B0", "1W0", "0B0", "0W0"]]]
    result = simulate(problem, Schedule(orders))
    # 1W0 ends at 4: stage 1 reduces 4-9; 0W0 ends at 6, waits for the stream: 9-11
    assert result.ends.reduce == (((9.0, 11.0), (4.0, 9.0)),)
    assert result.iteration_time == 11.0


def test_unshards_delay_the_first_forwards_and_their_memory_raises_the_peak():
    """Unshards of 2 (device 0) and 1 (device 1) from time 0: device 0's F0 starts at 2, device 1's
    waits for it anyway, so every op runs 2 later. Gathered parameters of 5 are held throughout:
    device 0 peaks at 5 + two activations, device 1 at 5 + one."""
    problem = Problem(**BASE, unshard_times=[2, 1], unshard_memory=5, grad_reduce_times=[3, 1],
                      optimizer_step_times=0.5)
    result = simulate(problem, HAND)
    assert result.times_of(Op("F", 0, 0)) == (2.0, 3.0)
    assert result.makespan == 10.0 and result.iteration_time == 13.5
    assert result.peak_memory == (7.0, 6.0)
    limited = problem.replace(memory_limit=6.5)
    assert not simulate(limited, HAND).valid
    one_at_a_time = Schedule([[Op.from_str(t) for t in ["0F0", "0B0", "0W0", "0F1", "0B1", "0W1"]], HAND.orders[1]])
    assert simulate(limited, one_at_a_time).valid


def test_a_forward_given_a_start_before_its_unshard_is_named():
    problem = Problem(**BASE, unshard_times=[2, 1])
    timed = simulate(Problem(**BASE), HAND).timed_orders()
    with pytest.raises(ScheduleError, match="0F0 starts at 0, before its stage's unshard"):
        simulate(problem, timed)


TINY_ENDS = [
    Problem(**BASE, grad_reduce_times=[3, 1], optimizer_step_times=0.5),
    Problem(**BASE, grad_reduce_times=[1, 4], optimizer_step_times=[1, 0], memory_limit=1.5),
    Problem(**BASE, unshard_times=[1, 2], unshard_memory=[2, 1], grad_reduce_times=1, memory_limit=[3.5, 3]),
    Problem(num_devices=1, num_microbatches=2, chunks_per_device=2, forward_times=[1, 2], backward_times=1,
            weight_times=[1, 0.5], grad_reduce_times=[2, 3], optimizer_step_times=1, memory_limit=3),
    Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=2, grad_reduce_times=[2, 0.5],
            p2p_time=0.5),
]


@pytest.mark.parametrize("problem", TINY_ENDS, ids=lambda p: p.describe())
def test_cpsat_minimises_the_iteration_time_as_brute_force_does(problem):
    optimum = brute_force_optimum(problem)
    result = solve(problem, "cpsat", time_limit=30)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(optimum)
    assert result.simulation.iteration_time == pytest.approx(optimum)
    assert lower_bounds(problem).best <= optimum + 1e-9


def test_the_ends_bound_sees_past_the_pipeline():
    """p = 4, m = 8, F = 1, BW = 2: the makespan's bound is 33 (device 3 starts at 3 and works 24);
    with a reduction of 5 per stage and a step of 1, no iteration ends before 33 + 5 + 1."""
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2, grad_reduce_times=5,
                      optimizer_step_times=1)
    bounds = lower_bounds(problem)
    assert bounds["iteration_ends"] == 39.0
    assert simulate(problem, generate("1f1b", problem)).iteration_time >= 39.0


def test_the_ranking_by_iteration_time_can_differ_from_the_makespans():
    """p = 4, v = 2, m = 8, every op 0.5, a reduction of 4 per stage: the greedy fills the bubbles
    with W's (a shorter pipeline) and so finishes both chunks' gradients late on each device, their
    reductions in a row at the end; interleaved 1F1B ends its second chunk's W early enough to
    reduce it during the drain."""
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, forward_times=0.5, backward_times=0.5,
                      weight_times=0.5, grad_reduce_times=4)
    greedy, interleaved = (simulate(problem, generate(name, problem)) for name in ("greedy", "interleaved-1f1b"))
    assert greedy.makespan < interleaved.makespan
    assert greedy.iteration_time > interleaved.iteration_time


@pytest.mark.parametrize("problem", [TINY_ENDS[index] for index in (0, 1, 3, 4)], ids=lambda p: p.describe())
def test_the_milp_minimises_the_iteration_time_as_brute_force_does(problem):
    """Its own search (no warm start): the reductions' disjunctions and the step in the model."""
    optimum = brute_force_optimum(problem)
    for warm in (False, True):  # warm: the horizon is the warm start's iteration, not its makespan
        result = solve(problem, "highs", time_limit=30, use_warm_start=warm)
        assert result.status == "optimal" and result.objective == pytest.approx(optimum)


def test_the_milps_span_objective_ignores_the_ends_as_cpsats_does():
    """The span measures the devices' compute: the reductions and steps are not part of it."""
    problem = Problem(num_devices=2, num_microbatches=3, chunks_per_device=2, placement="v", forward_times=2,
                      backward_times=3, weight_times=1, grad_reduce_times=5, optimizer_step_times=0.5)
    spans = [solve(problem, solver, objective="span", time_limit=30, use_warm_start=warm).objective
             for solver, warm in (("cpsat", True), ("highs", False), ("highs", True))]
    assert spans[1] == pytest.approx(spans[0]) and spans[2] == pytest.approx(spans[0])


def test_lns_refuses_the_ends_and_the_milp_the_gathered_memory_naming_them():
    with pytest.raises(ZboptError, match="LNS does not model the iteration's ends"):
        solve(TINY_ENDS[0], "lns", time_limit=5)
    with pytest.raises(ZboptError, match=r"the MILP does not model FSDP's gathered parameters \(unshard_memory\)"):
        solve(TINY_ENDS[2], "cbc", time_limit=5)


def test_ends_without_a_flush_are_refused_naming_the_key():
    with pytest.raises(ZboptError, match=r"grad_reduce_times .*the optimizer step between iterations is a flush"):
        Problem(**BASE, iterations=2, flush=False, grad_reduce_times=1)


def test_the_gantt_chart_draws_the_ends_on_a_communication_lane_and_runs_to_the_iterations_end():
    """The windows of `test_a_reduction_overlaps_the_other_devices_drain` as boxes: the reductions
    on each device's lane under its compute boxes, the steps on its compute row."""
    from zbopt.presentation.plot import plot_gantt

    problem = Problem(**BASE, grad_reduce_times=[3, 1], optimizer_step_times=0.5)
    axes = plot_gantt(simulate(problem, HAND)).axes[0]
    boxes = {collection.get_gid(): [(path.vertices[:, 0].min(), path.vertices[:, 0].max(), path.vertices[:, 1].mean())
                                    for path in collection.get_paths()] for collection in axes.collections}
    assert [(begin, end) for begin, end, _ in boxes["ends-reduce"]] == [(8.0, 11.0), (7.0, 8.0)]
    assert [(begin, end) for begin, end, _ in boxes["ends-step"]] == [(11.0, 11.5), (8.0, 8.5)]
    lane = [row for *_, row in boxes["ends-reduce"]]
    first, second = sorted({round(row, 6) for *_, row in boxes["ops-F-chunk0"]})  # device 0's row, device 1's
    assert first < lane[0] < 0.5 and second < lane[1] < 1.5  # under each device's compute boxes
    assert axes.get_xlim()[1] == 11.5


def test_the_trace_has_a_communication_track_named_as_torchs_actions():
    from zbopt.io.trace import COMMUNICATION_TRACK, chrome_trace

    problem = Problem(**BASE, grad_reduce_times=[3, 1], optimizer_step_times=0.5, unshard_times=[2, 1])
    events = chrome_trace(simulate(problem, HAND))["traceEvents"]
    ends = {(event["name"], event["pid"]): (event["tid"], event["ts"], event["dur"]) for event in events
            if event.get("cat") in ("unshard (FSDP all-gather)", "gradient reduction", "optimizer step")}
    lane = COMMUNICATION_TRACK + 1
    assert ends == {("0UNSHARD", 1): (lane, 0, 2000), ("1UNSHARD", 2): (lane, 0, 1000),
                    ("0REDUCE_GRAD", 1): (lane, 10000, 3000), ("1REDUCE_GRAD", 2): (lane, 9000, 1000),
                    ("optimizer step", 1): (1, 13000, 500), ("optimizer step", 2): (1, 10000, 500)}
    names = {(event["pid"], event["tid"]): event["args"]["name"] for event in events
             if event.get("name") == "thread_name"}
    assert names[1, lane] == names[2, lane] == "communication"


def test_the_reports_viewer_gets_the_ends_and_runs_to_the_iterations_end():
    from zbopt.presentation.report import COMMUNICATION_LANE, schedule_data

    problem = Problem(**BASE, grad_reduce_times=[3, 1], optimizer_step_times=0.5)
    data = schedule_data(simulate(problem, HAND))
    assert data["iteration"] == 11.5 and data["makespan"] == 8.0
    ends = data["ends"]
    assert list(zip(ends["name"], ends["d"], ends["t0"], ends["t1"], ends["lane"], strict=True)) == [
        ("0REDUCE_GRAD", 0, 8.0, 11.0, COMMUNICATION_LANE), ("1REDUCE_GRAD", 1, 7.0, 8.0, COMMUNICATION_LANE),
        ("optimizer step", 0, 11.0, 11.5, 0), ("optimizer step", 1, 8.0, 8.5, 0)]
    assert "ends" not in schedule_data(simulate(Problem(**BASE), HAND))


def test_the_frontier_measures_the_solved_points_and_the_heuristics_alike():
    """With the iteration's ends, the solved points are iteration times: so are the heuristics'."""
    from zbopt import memory_frontier
    from zbopt.presentation.tables import format_frontier

    problem = Problem(num_devices=4, num_microbatches=8, backward_times=1, weight_times=1, grad_reduce_times=2)
    frontier = memory_frontier(problem, [4], time_limit=10)
    zb_h1 = next(point for point in frontier.heuristics if point.name == "zb-h1")
    assert zb_h1.makespan == simulate(problem, generate("zb-h1", problem)).iteration_time == 29.0
    assert frontier.points[0].makespan == 29.0 and frontier.points[0].status == "optimal"
    assert format_frontier(frontier).count(" iteration") == 2


def test_a_limit_below_the_activations_and_gathered_parameters_is_refused_naming_them():
    """v = 2, one microbatch's two activations on device 0 (1 each) and its first stage's gathered
    parameters (2; the second's are 0): 4 at least, when the last stage's forward runs. A limit of
    3 fits no schedule (the greedy once stalled on it); at 4 the optimizer finds one within it."""
    problem = dict(num_devices=2, num_microbatches=2, chunks_per_device=2, forward_times=1, backward_times=1,
                   weight_times=1, grad_reduce_times=1, unshard_memory=[2, 2, 0, 0])
    with pytest.raises(ZboptError, match=r"device 0 must hold .* and its gathered parameters .*\(4\)"):
        Problem(**problem, memory_limit=3)
    fits = Problem(**problem, memory_limit=4)
    assert fits.min_memory_limit == (4.0, 4.0)
    result = solve(fits, time_limit=10)
    assert result.simulation.valid and max(result.simulation.peak_memory) == 4.0


def test_the_ends_bound_does_not_add_the_ends_to_the_heaviest_microbatches_bound():
    """The heaviest microbatches' full model already ends with the reductions and steps: adding them
    once more gave 20.5 here, above the brute-force optimum (found by this session's review)."""
    problem = Problem(num_devices=2, num_microbatches=3, forward_times=1, backward_times=2, microbatch_tokens=[4, 1, 1],
                      grad_reduce_times=3, optimizer_step_times=1)
    optimum = brute_force_optimum(problem)
    assert lower_bounds(problem).best <= optimum + 1e-9


def test_zb_v_counts_fsdps_gathered_weights_beside_its_activation_target():
    """ZB-V's greedy aims at 1F1B's activations; with FSDP each device also holds its chunks'
    gathered weights throughout, counted on both sides: the same orders as without them."""
    plain = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", forward_times=1,
                    backward_times=1, weight_times=1, grad_reduce_times=2)
    gathered = plain.replace(unshard_times=0.5, unshard_memory=[3, 1, 1, 1, 1, 1, 1, 3])
    schedule = generate("zb-v", gathered)
    assert schedule.orders == generate("zb-v", plain).orders
    # 1F1B's activations: p = 4 microbatches on both chunks (1 each); the weights: 3 + 3 on device 0
    assert simulate(gathered, schedule).peak_memory == (8 + 6, 8 + 2, 8 + 2, 8 + 2)
