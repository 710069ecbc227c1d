"""Compute slowed while its device communicates (issue 44, `comm_slowdown`): a compute op runs at
1/factor of its speed while an unshard, a reduction or a re-gather of its device runs. Hand-computed
times, given start times kept as earliest starts, the case where nothing can overlap (one chunk per
device), and the solvers' answers judged against bounds that leave the slowdown out."""

import pytest

from tests.reference import brute_force_optimum
from zbopt import Problem, ProblemError, Schedule, ScheduleError, compare, generate, simulate, solve
from zbopt.core.ops import Op, op_table
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS
from zbopt.core.simulation.slowdown import Slowdown

# one device, two chunks, one microbatch: stage 1's reduction (2) runs from its W's end at 4
TWO_CHUNKS = dict(num_devices=1, num_microbatches=1, chunks_per_device=2, forward_times=1, backward_times=1,
                  weight_times=1, grad_reduce_times=[1, 2])
ORDER = "0F0 1F0 1B0 1W0 0B0 0W0"


def _orders(text: str) -> Schedule:
    return Schedule([[Op.from_str(op) for op in text.split()]])


def test_a_backward_under_a_reduction_takes_twice_as_long_at_a_factor_of_two():
    """By hand: 1W0 ends at 4 and stage 1 reduces 4-6; 0B0 starts at 4 with 1 of work at half speed
    until 6, so it ends at 6; 0W0 6-7 at full speed; stage 0 reduces 7-8. Without the slowdown 0B0
    ends at 5, 0W0 at 6, and stage 0 reduces 6-7 (the stream is free at 6)."""
    slowed = simulate(Problem(**TWO_CHUNKS, comm_slowdown=2), _orders(ORDER))
    assert [slowed.times_of(Op.from_str(op)) for op in ("0B0", "0W0")] == [(4.0, 6.0), (6.0, 7.0)]
    assert slowed.ends.reduce[0] == ((7.0, 8.0), (4.0, 6.0))
    assert (slowed.makespan, slowed.iteration_time) == (7.0, 8.0)
    plain = simulate(Problem(**TWO_CHUNKS), _orders(ORDER))
    assert (plain.makespan, plain.iteration_time) == (6.0, 7.0)


def test_work_slows_once_under_overlapping_transfers_and_resumes_between_them():
    """Factor 2, transfers 1-3 and 2-4 (one slow stretch 1-4) and 6-7: 1 of work from 0 is done at
    1 before any; 3 of work from 0: 1 by 1, 1.5 in 1-4, the last 0.5 in 4-4.5; 6 of work: 2.5 by 4,
    2 more at full speed until 6, 0.5 in 6-7 at half speed, the last 1 in 7-8."""
    slowdown = Slowdown(op_table(Problem(num_devices=1, num_microbatches=1, grad_reduce_times=1, comm_slowdown=2)))
    for begin, end in ((1.0, 3.0), (2.0, 4.0), (6.0, 7.0)):
        slowdown.add(0, begin, end)
    assert [slowdown.finish(0, 0.0, work) for work in (1.0, 3.0, 6.0)] == [1.0, 4.5, 8.0]


def test_an_unshard_slows_the_first_chunks_forwards():
    """FSDP, one device, two chunks, unshards of 1 and 3 from 0 (stage 1's 1-4): stage 0's forward
    starts at 1 and runs at half speed (ends 3), stage 1's waits for its unshard (4-5)."""
    problem = Problem(num_devices=1, num_microbatches=1, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1, unshard_times=[1, 3], comm_slowdown=2)
    result = simulate(problem, _orders(ORDER))
    assert [result.times_of(Op.from_str(op)) for op in ("0F0", "1F0")] == [(1.0, 3.0), (4.0, 5.0)]


def test_given_start_times_are_kept_as_earliest_starts():
    """The plan's own times (each op right after the one before, no slowdown): 0B0 at 4 is stretched
    to 6 and 0W0 moves to 6; a start given later than that (0W0 at 6.5) is kept."""
    problem = Problem(**TWO_CHUNKS, comm_slowdown=2)
    planned = simulate(problem, Schedule(_orders(ORDER).orders, [[0, 1, 2, 3, 4, 5]]))
    assert [planned.times_of(Op.from_str(op)) for op in ("0B0", "0W0")] == [(4.0, 6.0), (6.0, 7.0)]
    later = simulate(problem, Schedule(_orders(ORDER).orders, [[0, 1, 2, 3, 4, 6.5]]))
    assert later.times_of(Op.from_str("0W0")) == (6.5, 7.5)


def test_with_one_chunk_per_device_no_compute_meets_a_transfer():
    """v = 1 without FSDP: a device's reduction follows its stage's last gradient op, its last compute
    op, so the slowdown changes nothing, and the optimum is proved as without it."""
    model = ZERO_BUBBLE_MODELS["1.5B"]
    plain = model.problem(model.num_devices, grad_reduce_times=53.2, optimizer_step_times=11.3)
    slowed = plain.replace(comm_slowdown=1.3)
    for name in ("1f1b", "zb-h1", "zb-h2"):
        assert simulate(slowed, generate(name, slowed)).iteration_time == \
            simulate(plain, generate(name, plain)).iteration_time
    result = solve(slowed, time_limit=30)
    assert result.status == "optimal" and result.objective == pytest.approx(solve(plain, time_limit=30).objective)


SLOWED = [
    Problem(**TWO_CHUNKS, comm_slowdown=2),
    Problem(num_devices=1, num_microbatches=2, chunks_per_device=2, forward_times=[1, 2], backward_times=1,
            weight_times=[1, 0.5], grad_reduce_times=[2, 3], optimizer_step_times=1, comm_slowdown=1.5),
    Problem(num_devices=2, num_microbatches=1, chunks_per_device=2, forward_times=1, backward_times=[1, 2, 1, 2],
            weight_times=1, unshard_times=1, unshard_memory=1, grad_reduce_times=2, comm_slowdown=1.25,
            memory_limit=4),
]


@pytest.mark.parametrize("problem", SLOWED, ids=lambda p: p.describe())
def test_the_answer_is_simulated_with_the_slowdown_and_its_bound_leaves_it_out(problem):
    """Every order timed as soon as possible (the least such time is at least the optimum): the
    bound stays at or below it; the optimizer's row, simulated with the slowdown, is behind no
    heuristic's, and "optimal" only where it meets the bound."""
    least = brute_force_optimum(problem)
    table = compare(problem, optimal=True, time_limit=20)
    optimizer = next(row for row in table.rows if row.status is not None)
    assert table.lower_bound <= least + 1e-9
    assert optimizer.iteration_time <= min(row.iteration_time for row in table.rows if row.within_memory_limit) + 1e-9
    assert (optimizer.status == "optimal") == (optimizer.iteration_time <= table.lower_bound + 1e-9)


def test_a_slowdown_without_a_transfer_or_out_of_range_is_refused_naming_it():
    with pytest.raises(ProblemError, match=r"comm_slowdown = 1.2: slows compute while a transfer runs, and none "
                                           r"takes time: give grad_reduce_times or unshard_times"):
        Problem(num_devices=2, num_microbatches=2, comm_slowdown=1.2)
    for value in (0.9, 11, float("inf")):
        with pytest.raises(ProblemError, match=r"comm_slowdown = .*: expected a number from 1 \(no slowdown\) to 10"):
            Problem(num_devices=2, num_microbatches=2, grad_reduce_times=1, comm_slowdown=value)


def test_given_start_times_must_hold_without_the_slowdown_first():
    """Every op at 0 overlaps on the device: refused as without a slowdown, not re-timed."""
    bad = Schedule(_orders(ORDER).orders, [[0.0] * 6])
    for problem in (Problem(**TWO_CHUNKS), Problem(**TWO_CHUNKS, comm_slowdown=1.01)):
        with pytest.raises(ScheduleError, match=r"device 0: 1F0 starts at 0, before 0F0 \(listed before it\) "
                                                r"ends at 1"):
            simulate(problem, bad)


def test_a_slowdown_with_a_shared_host_link_is_refused_naming_both():
    """Which copy of a device pair goes first is in the given times, which the slowdown moves."""
    with pytest.raises(ProblemError, match=r"comm_slowdown = 2.0: with shared_host_link"):
        Problem(num_devices=2, num_microbatches=2, weight_times=1, allow_offload=True, offload_times=1,
                shared_host_link=True, grad_reduce_times=2, comm_slowdown=2)


def test_the_gantt_chart_dots_the_ops_a_transfer_slowed():
    """The hand case: only 0B0 (4-6) ran under a transfer; its box is dotted, the others not."""
    from zbopt.presentation.plot import plot_gantt

    axes = plot_gantt(simulate(Problem(**TWO_CHUNKS, comm_slowdown=2), _orders(ORDER))).axes[0]
    slowed = next(collection for collection in axes.collections if collection.get_gid() == "slowed-ops")
    assert [(path.vertices[:, 0].min(), path.vertices[:, 0].max()) for path in slowed.get_paths()] == [(4.0, 6.0)]
    plain = plot_gantt(simulate(Problem(**TWO_CHUNKS), _orders(ORDER))).axes[0]
    assert all(collection.get_gid() != "slowed-ops" for collection in plain.collections)
