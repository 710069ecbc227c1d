"""Offload: the problem's keys, O and L on the copy lanes of the one simulator, the optimizer's
choice against an exhaustive search in time, PipeOffload's rule and the serial fallback."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import timed_search_optimum
from zbopt import Problem, ProblemError, ScheduleError, ZboptError, generate, simulate, solve
from zbopt.core.dag import device_work
from zbopt.core.errors import DeadlockError
from zbopt.core.ops import Op
from zbopt.core.schedule import Schedule
from zbopt.core.ticks import tick_scale
from zbopt.io.torch_format import torch_actions
from zbopt.planning.frontier import memory_frontier
from zbopt.presentation.plot import plot_frontier, plot_gantt
from zbopt.presentation.tables import format_frontier, format_simulation
from zbopt.solvers.blocks.search import optimal_block
from zbopt.solvers.bounds import lower_bounds

SPLIT = dict(forward_times=3, backward_times=4, weight_times=2)


def offloading(p, m, **changes) -> Problem:
    parameters = dict(num_devices=p, num_microbatches=m, allow_offload=True, offload_times=2, **SPLIT)
    parameters.update(changes)
    return Problem(**parameters)


@pytest.mark.parametrize(("changes", "message"), [
    (dict(offload_times=1), "offload_times = 1: needs allow_offload: true"),
    (dict(reload_times=1), "reload_times = 1: needs allow_offload: true"),
    (dict(shared_host_link=True), "shared_host_link = True: needs allow_offload: true"),
    (dict(allow_offload=True), "allow_offload = True: needs offload_times"),
    (dict(allow_offload="yes", offload_times=1), "allow_offload = 'yes': expected true or false"),
    (dict(allow_offload=True, offload_times=-1), r"offload_times = -1: every value must be > 0"),
    (dict(allow_offload=True, offload_times=1, reload_times=[1, 2, 3]),
     r"reload_times = \[1, 2, 3\]: expected one value per virtual stage \(2\), got 3"),
])
def test_bad_offload_keys_are_one_line_errors(changes, message):
    with pytest.raises(ProblemError, match=message):
        Problem(num_devices=2, num_microbatches=2, **changes)


def test_the_floor_with_offload_is_the_largest_activation_and_named():
    """One chunk per device: a backward needs its whole activation back, the floor stays 1. Two
    chunks: every activation but the running one can be on the host, so the floor is the larger
    of the device's two activations (V placement: stage 1 and 2 share device 1)."""
    assert offloading(2, 2).min_memory_limit == (1.0, 1.0)
    two_chunks = offloading(2, 2, chunks_per_device=2, placement="v", activation_memory=[1, 0.5, 2, 1])
    assert two_chunks.min_memory_limit == (1.0, 2.0)
    assert two_chunks.one_microbatch_memory == (2.0, 2.5)
    with pytest.raises(ProblemError, match=r"device 1 must hold its largest stage's activation, with offload \(2\)"):
        two_chunks.replace(memory_limit=1.5)


def test_offload_keys_round_trip_and_stay_out_when_off():
    problem = offloading(2, 3, reload_times=[1, 3], shared_host_link=True)
    assert problem.reload_times == (1.0, 3.0) and offloading(2, 3).reload_times == (2.0, 2.0)
    assert Problem.from_dict(problem.to_dict()) == problem
    assert "allow_offload" not in Problem(num_devices=2, num_microbatches=2).to_dict()


def test_o_and_l_have_text_forms():
    assert Op.from_str("3O1") == Op("O", 3, 1) and str(Op("L", 0, 12)) == "0L12"


def test_copies_run_beside_compute_and_move_memory():
    """One device, two microbatches, F = 3, B = 4, W = 2, O = L = 2. 0O0 is issued when 0F0 ends
    (3) and frees the activation at 5 while 0F1 runs (3-6); 0L0, listed after 0W1, is issued when
    0W1 ends (12: 0F1 6, 0B1 6-10, 0W1 10-12) and holds the activation again from 12; 0B0 waits
    for it (14). The copies are not compute: busy is F + B + W per microbatch."""
    problem = offloading(1, 2)
    result = simulate(problem, Schedule([["0F0", "0O0", "0F1", "0B1", "0W1", "0L0", "0B0", "0W0"]]))
    assert result.times_of(Op("O", 0, 0)) == (3, 5) and result.times_of(Op("L", 0, 0)) == (12, 14)
    assert result.times_of(Op("B", 0, 0)) == (14, 18) and result.makespan == 20
    times, levels = result.memory_steps[0]
    assert times.tolist() == [0, 3, 5, 10, 12, 18, 20]
    assert levels.tolist() == [1.0, 2.0, 1.0, 0.5, 1.0, 0.5, 0.0]
    assert result.busy == (18.0,) and list(result.busy) == device_work(problem)
    assert result.table.offloaded == ((0, 0),)


def test_a_copy_waits_for_its_lane():
    """Two offloads back to back on one lane: the second starts when the first ends, though its F
    ended earlier; compute goes on meanwhile."""
    problem = offloading(1, 2, offload_times=5)
    result = simulate(problem, Schedule([["0F0", "0O0", "0F1", "0O1", "0L1", "0B1", "0W1", "0L0", "0B0", "0W0"]]))
    assert result.times_of(Op("O", 0, 0)) == (3, 8) and result.times_of(Op("O", 0, 1)) == (8, 13)
    assert result.times_of(Op("L", 0, 1)) == (13, 18) and result.times_of(Op("B", 0, 1))[0] == 18


def test_the_simulator_names_what_is_wrong_with_an_offload():
    problem = offloading(1, 1)
    with pytest.raises(ScheduleError, match=r"op 0L0 \(device 0\) is missing from the schedule"):
        simulate(problem, Schedule([["0F0", "0O0", "0B0", "0W0"]]))
    with pytest.raises(DeadlockError, match="device 0 is stuck at 0B0, waiting for its reload 0L0"):
        simulate(problem, Schedule([["0F0", "0O0", "0B0", "0L0", "0W0"]]))
    with pytest.raises(ScheduleError, match="0O0: offload is not allowed in this problem"):
        simulate(Problem(num_devices=1, num_microbatches=1, **SPLIT), Schedule([["0F0", "0O0", "0L0", "0B0", "0W0"]]))
    both = problem.replace(allow_recompute=True, checkpoint_memory=0.5)
    with pytest.raises(ScheduleError, match="0R0 and 0O0: an activation is kept, recomputed or offloaded"):
        simulate(both, Schedule([["0F0", "0O0", "0L0", "0R0", "0B0", "0W0"]]))
    early = Schedule([["0F0", "0O0", "0L0", "0B0", "0W0"]], [[0, 3, 5, 6, 10]])
    with pytest.raises(ScheduleError, match="0B0 starts at 6, before its reload 0L0 ends at 7"):
        simulate(problem, early)
    before_compute = Schedule([["0F0", "0O0", "0L0", "0B0", "0W0"]], [[0, 2, 5, 7, 11]])
    with pytest.raises(ScheduleError, match=r"0O0 starts at 2, before 0F0 \(listed before it\) ends at 3"):
        simulate(problem, before_compute)


def test_a_shared_host_link_carries_one_copy_each_way_per_pair():
    """Devices 0 and 1 share a link: their forwards end together, so their offloads would clash;
    timed as soon as possible the simulator says which and asks for start times, and given times
    that take turns pass."""
    problem = offloading(2, 1, forward_times=[3, 3], p2p_time=0, shared_host_link=True)
    orders = [["0F0", "0O0", "0L0", "0B0", "0W0"], ["1F0", "1O0", "1L0", "1B0", "1W0"]]
    with pytest.raises(ScheduleError, match=r"1O0 \(device 1\) starts at 6, while 0O0 \(device 0\) holds their "
                                            r"shared host link \(device-to-host\) until 7; .*give start times"):
        simulate(problem.replace(offload_times=4), Schedule(orders))
    own = simulate(problem.replace(shared_host_link=False, offload_times=4), Schedule(orders))
    assert own.times_of(Op("O", 1, 0)) == (6, 10)
    turns = Schedule(orders, [[0, 3, 13, 17, 21], [3, 7, 11, 13, 17]])
    assert simulate(problem.replace(offload_times=4), turns).makespan == 23


integers = st.integers(1, 3)


@st.composite
def tiny_offload_problems(draw):
    """At most four activations (p·v·m <= 4), integer costs (the exhaustive search is exact for
    those), a limit from the floor to twice it; recomputation and a shared link sometimes too."""
    p, v = draw(st.sampled_from([(1, 1), (1, 2), (2, 1), (2, 2)]))
    stages = p * v
    m = draw(st.integers(1, max(1, 4 // stages)))
    split = draw(st.booleans())
    parameters = dict(num_devices=p, num_microbatches=m, chunks_per_device=v,
                      placement=draw(st.sampled_from(["loop", "v"])),
                      forward_times=draw(st.lists(integers, min_size=stages, max_size=stages)),
                      backward_times=draw(st.lists(integers, min_size=stages, max_size=stages)),
                      p2p_time=draw(st.sampled_from([0, 1])),
                      allow_offload=True, offload_times=draw(st.lists(integers, min_size=stages, max_size=stages)),
                      reload_times=draw(st.lists(integers, min_size=stages, max_size=stages)),
                      shared_host_link=draw(st.booleans()))
    if split:
        parameters["weight_times"] = draw(st.lists(integers, min_size=stages, max_size=stages))
        parameters["weight_memory"] = draw(st.sampled_from([0.0, 0.5]))
    if draw(st.booleans()):
        parameters.update(allow_recompute=True, checkpoint_memory=0.5)
    floor = max(Problem(**parameters).min_memory_limit)
    parameters["memory_limit"] = floor * draw(st.sampled_from([1.0, 1.5, 2.0]))
    return Problem(**parameters)


@settings(max_examples=12, deadline=None)
@given(tiny_offload_problems())
def test_cpsat_agrees_with_an_exhaustive_search_in_time(problem):
    """Every choice (kept, recomputed, offloaded) and every way of starting ops at the moments
    something ends, searched independently of the simulator, against the optimizer and its
    bounds: an unsound model, symmetry breaking or bound would show here."""
    expected = timed_search_optimum(problem)
    result = solve(problem, time_limit=30)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(expected)
    assert lower_bounds(problem).best <= expected + 1e-9


def test_with_memory_to_spare_offload_changes_nothing():
    """Where the limit already allows the unlimited optimum (2p activations here), offload cannot
    beat it: dropping the copies of any schedule leaves a valid one without a limit, as fast. So
    the optimum with offload equals the one without (a copy costs no compute time, so one may
    appear; it may not lower the makespan)."""
    problem = offloading(3, 4, memory_limit=6)
    plain = Problem(num_devices=3, num_microbatches=4, **SPLIT)
    unlimited = solve(plain, time_limit=30).objective
    assert solve(plain.replace(memory_limit=6), time_limit=30).objective == pytest.approx(unlimited)
    result = solve(problem, time_limit=30)
    assert result.objective == pytest.approx(unlimited)
    assert result.simulation.table.offloaded == ()  # a copy the answer does not need is dropped
    # without a limit the warm start is no offloading heuristic (PipeOffload ties 1F1B at a lower
    # peak) and the answer copies nothing; with a shared link its copies would not even time alone
    free = solve(offloading(4, 8, shared_host_link=True), time_limit=10)
    assert free.warm_start != "pipeoffload" and free.simulation.table.offloaded == ()


def test_offload_beats_keeping_at_the_floor():
    """p = 2, m = 3, F = B = W = 1, O = 0.5, limit 1: keeping, device 0 runs one microbatch at a
    time end to end (15, proven); offloading, its forwards go on while the copies run (12); both
    proven by the optimizer and checked by the exhaustive search."""
    costs = dict(forward_times=1, backward_times=1, weight_times=1, memory_limit=1)
    kept = Problem(num_devices=2, num_microbatches=3, **costs)
    moved = kept.replace(allow_offload=True, offload_times=0.5)
    assert solve(kept, time_limit=30).objective == 15
    result = solve(moved, time_limit=30)
    assert (result.status, result.objective) == ("optimal", 12)
    # the bound alone proves it: limit 1 holds one whole activation at a time, so on device 0 each
    # microbatch takes the cheaper of kept (F + its round trip + B = 4) and offloaded
    # (F + O + L + B = 3), plus W (its half and a whole activation exceed the limit): 3 (1 + 3)
    assert lower_bounds(moved)["memory"] == 12
    # recomputing too (R = 1, checkpoint 0.1: no activation and a checkpoint fit) is no cheaper:
    # a recomputed one is whole for R + B and its F runs while no other is, F + R + B = 3
    both = moved.replace(allow_recompute=True, checkpoint_memory=0.1)
    assert lower_bounds(both)["memory"] == 12 and solve(both, time_limit=30).objective == 12


@pytest.mark.parametrize(("p", "m", "limit"), [(4, 8, 2), (4, 8, 3), (6, 12, 3)])
def test_pipeoffload_keeps_the_compute_and_lowers_the_peak(p, m, limit):
    """PipeOffload moves no compute op: the makespan and every compute start are 1F1B's; only
    activations whose backward is more than 3 (O + L) after one backward's buffer are offloaded,
    and the peak drops below 1F1B's p - s on the devices with room for copies."""
    problem = offloading(p, m, memory_limit=limit)
    base = simulate(problem.replace(memory_limit=None), generate("1f1b", problem.replace(memory_limit=None)))
    result = simulate(problem, generate("pipeoffload", problem))
    assert result.makespan == base.makespan
    for op in base.table.ops():
        assert result.times_of(op) == base.times_of(op)
    for stage, microbatch in result.table.offloaded:
        forward_end = base.times_of(Op("F", stage, microbatch))[1]
        begin, end = base.times_of(Op("B", stage, microbatch))
        assert begin - (end - begin) - forward_end > 3 * (2 + 2)
        assert result.times_of(Op("L", stage, microbatch))[1] <= begin - (end - begin)
    assert result.peak_memory[0] < base.peak_memory[0]
    assert all(peak <= before for peak, before in zip(result.peak_memory, base.peak_memory, strict=True))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(1, 1, "loop"), (2, 2, "v"), (3, 2, "v"), (2, 2, "loop"), (3, 1, "loop")]),
       st.integers(1, 5), st.booleans(), st.booleans(), st.sampled_from([0.0, 0.5]))
def test_serial_offload_fits_the_floor(shape, m, split, shared, latency):
    """One microbatch at a time with everything but the last stage offloaded: valid at exactly the
    least limit with offload, on any shape; on one device, all its work back to back."""
    p, v, placement = shape
    problem = offloading(p, m, chunks_per_device=v, placement=placement, weight_times=2 if split else None,
                         shared_host_link=shared, p2p_time=latency, activation_memory=[1 + s % 2 for s in range(p * v)])
    problem = problem.replace(memory_limit=problem.min_memory_limit)
    result = simulate(problem, generate("serial-offload", problem))
    assert result.valid and result.peak_memory == pytest.approx(problem.min_memory_limit)
    if p == 1 and v == 1:
        assert result.makespan == pytest.approx(device_work(problem)[0])


def test_torch_export_refuses_an_offloading_schedule():
    problem = offloading(4, 8, memory_limit=2)
    with pytest.raises(ZboptError, match=r"has no offload or reload action, and the schedule offloads \d+ activation"):
        torch_actions(problem, generate("pipeoffload", problem))


def test_the_other_solvers_refuse_offload():
    problem = offloading(2, 2, memory_limit=1)
    for solver in ("highs", "lns"):
        with pytest.raises(ZboptError, match=r"offload \(allow_offload\); use cpsat"):
            solve(problem, solver=solver, time_limit=5)
    with pytest.raises(ZboptError, match=r"offload \(allow_offload\); use cpsat"):
        solve(problem, solver="cbc", time_limit=5)
    with pytest.raises(ZboptError, match=r"does not model offload \(allow_offload\); use zbopt solve"):
        optimal_block(problem, time_limit=5)


def test_costs_that_are_not_whole_ticks_still_give_a_valid_answer():
    """1.23414321 and 18.5 need 10^8 ticks to be whole, so the model rounds; with offload it rounds
    up, so an answer that waits for an offload (a forward after a copy frees room) is still valid at
    the real costs, and its makespan is within the rounding bound of the model's."""
    problem = offloading(2, 3, forward_times=[1.23414321, 18.5], backward_times=[2.5, 18.5], weight_times=None,
                         offload_times=[3.3, 3.3], memory_limit=1, shared_host_link=True)
    assert not tick_scale(problem).exact
    result = solve(problem, time_limit=10)
    assert result.simulation.valid and result.simulation.table.offloaded
    assert result.lower_bound <= result.objective + 1e-9
    # The optimum by hand: device 1 starts when 0F0 ends (F0), then runs its 3(F1 + B1) = 111 back
    # to back, and 0B2 (2.5) follows its last B: 1.23414321 + 111 + 2.5, which no schedule beats.
    assert result.objective == pytest.approx(1.23414321 + 3 * (18.5 + 18.5) + 2.5, rel=1e-12)
    # The model: at most 10^5 ticks for the longest op (18.5) makes one tick 1e-3; rounded up, F0 is
    # 1.235 and every other cost is whole. Its exact optimum is at least the real answer (nothing
    # runs shorter in it) and at most the three F0's rounding, 3·(1.235 - 1.23414321), above it.
    model = solve(problem.replace(forward_times=[1.235, 18.5]), time_limit=10)
    assert model.status == "optimal" and tick_scale(model.simulation.problem).exact
    assert 0 <= model.objective - result.objective <= 3 * (1.235 - 1.23414321) + 1e-9


def test_the_gantt_draws_copies_on_thin_lanes_under_their_device():
    problem = offloading(4, 8, memory_limit=2)
    simulation = simulate(problem, generate("pipeoffload", problem))
    figure = plot_gantt(simulation)
    collections = {collection.get_gid(): collection for collection in figure.axes[0].collections}
    for kind, offset in (("O", 0.245), ("L", 0.365)):
        boxes = collections[f"ops-{kind}-chunk0"].get_paths()
        centers = sorted(round(float(np.mean(path.vertices[:-1, 1])), 3) for path in boxes)
        devices = sorted(problem.device_of(stage) for stage, _ in simulation.table.offloaded)
        assert centers == pytest.approx([device + offset for device in devices])
        heights = {round(float(np.ptp(path.vertices[:, 1])), 3) for path in boxes}
        assert heights == {0.11}
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "O offload" in legend and "L reload" in legend
    plt.close(figure)


def test_the_frontier_counts_what_each_limit_offloads():
    """At the floor (1) keeping cannot pipeline at all; offloading does, and says how many; with
    memory to spare (6) nothing is offloaded."""
    problem = offloading(3, 4)
    frontier = memory_frontier(problem, [1, 6], time_limit=10)
    low, high = frontier.points
    assert low.offloaded > 0 and high.offloaded == 0 and low.recomputed is None
    table = format_frontier(frontier)
    assert "offloaded" in table and "recomputed" not in table
    assert f"{low.offloaded:>4} of 12" in table.splitlines()[5]  # below the problem, sweep, solves, blank, header
    figure = plot_frontier(frontier)
    marks = {text.get_text() for axes in figure.axes for text in axes.texts}
    assert f"O {low.offloaded}/12" in marks
    plt.close(figure)
    simulation = simulate(problem.replace(memory_limit=2), generate("pipeoffload", problem.replace(memory_limit=2)))
    assert f"offloaded       {len(simulation.table.offloaded)} of 12 activations" in format_simulation(simulation)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 8), (3, 5), (6, 12)])
def test_full_offload_with_short_copies_and_room_is_1f1b(p, m):
    """Without a limit nothing waits for memory, and a reload of 0.1 issued when the forward before
    its backward ends is back before the gradient arrives (split backward): 1F1B's makespan, with
    every activation but the last stage's offloaded."""
    problem = offloading(p, m, offload_times=0.1)
    result = simulate(problem, generate("full-offload", problem))
    assert result.makespan == simulate(problem, generate("1f1b", problem)).makespan
    assert set(result.table.offloaded) == {(s, j) for s in range(p - 1) for j in range(m)}


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 5), st.integers(1, 8), st.sampled_from([1.0, 1.5, 2.0, 3.0]), st.booleans(), st.booleans(),
       st.sampled_from([0.5, 2.0, 6.0]))
def test_full_offload_fits_its_limit(p, m, limit, split, shared, copy):
    """On 1F1B's order, each allocation waiting for room: valid within the limit, down to the floor
    of one activation, on every shape tried (a forward waits for the offload before it, a reload
    for the backward before it to free room). Not always faster than one microbatch at a time:
    p = 3, m = 3, limit 1, fused, a shared host link and copies of 6 (twice F) take 97 against
    serial-offload's 93 (found by this test; the claim it used to make is dropped)."""
    problem = offloading(p, m, weight_times=2 if split else None, memory_limit=limit, shared_host_link=shared,
                         offload_times=copy, p2p_time=0.5)
    result = simulate(problem, generate("full-offload", problem))
    assert result.valid and max(result.peak_memory) <= limit + 1e-9


@pytest.mark.parametrize("shared", [False, True])
def test_pipeoffload_copies_out_as_soon_as_its_lane_allows(shared):
    """Each offload starts when its forward has ended or when the offload before it on its link
    ends, whichever is later: also after activations whose reload did not fit were dropped (their
    lane time is given back). Long copies (6 against F = 3) make some reloads not fit."""
    problem = offloading(6, 12, offload_times=6, memory_limit=3, shared_host_link=shared)
    result = simulate(problem, generate("pipeoffload", problem))
    assert 0 < len(result.table.offloaded) < 5 * 12
    lane_free: dict[int, float] = {}
    offloads = sorted((result.times_of(Op("O", *pair)), pair) for pair in result.table.offloaded)
    for (begin, finish), (stage, microbatch) in offloads:
        link = problem.host_link(problem.device_of(stage))
        forward_end = result.times_of(Op("F", stage, microbatch))[1]
        assert begin == max(forward_end, lane_free.get(link, 0.0))
        lane_free[link] = finish
