"""`compare` and `zbopt compare`: every row is the simulator's numbers, the default set is exactly the
registered schedules that apply, rows run by makespan, and the optimizer's row is never beaten."""

import json
import sys

import matplotlib.pyplot as plt
import pytest

from tests.conftest import require_extra
from zbopt import Problem, compare, generate, lower_bounds, registered, simulate
from zbopt.core.errors import NotApplicableError, UnknownScheduleError
from zbopt.interfaces.cli import main
from zbopt.presentation.plot import SCREEN_PALETTE, plot_comparison, plot_gantt

# split backward with a limit some schedules break (1F1B needs 3 on device 0, GPipe 6)
LIMITED = dict(num_devices=3, num_microbatches=6, forward_times=1.5, backward_times=1.2, weight_times=0.7,
               p2p_time=0.1, memory_limit=4)
LIMITED_FLAGS = ("-s", "3", "-b", "6", "-f", "1.5", "-bw", "1.2", "-w", "0.7", "--p2p-time", "0.1",
                 "--memory-limit", "4")


def applicable(problem: Problem) -> list[str]:
    """The registered schedules whose generator accepts `problem`, found by trying each."""
    names = []
    for entry in registered():
        try:
            generate(entry.name, problem)
        except NotApplicableError:
            continue
        names.append(entry.name)
    return names


def test_rows_are_the_simulators_numbers_and_run_by_makespan():
    problem = Problem(**LIMITED)
    comparison = compare(problem)
    bound = lower_bounds(problem).best
    assert comparison.lower_bound == bound
    for row in comparison.rows:
        simulation = simulate(problem, generate(row.name, problem))
        assert row.to_dict() == {
            "name": row.name, "status": None, "makespan": simulation.makespan,
            "iteration_time": simulation.makespan,  # no iteration ends here
            "bubble_rate": simulation.bubble_rate,
            "zb_bubble_rate": simulation.zb_bubble_rate, "peak_memory": max(simulation.peak_memory),
            # one limit on every device: the highest peak binds (the first such device)
            "binding_device": list(simulation.peak_memory).index(max(simulation.peak_memory)),
            "peak_memory_per_device": list(simulation.peak_memory),
            "within_memory_limit": simulation.valid, "lower_bound": bound,
            "gap": pytest.approx((simulation.makespan - bound) / simulation.makespan, abs=1e-9),
        }
    # within the limit by makespan first, then over it by makespan: a faster schedule that breaks
    # the limit does not top the table
    order = [(not row.within_memory_limit, row.makespan) for row in comparison.rows]
    assert order == sorted(order) and len({makespan for _, makespan in order}) > 2
    # the limit splits the rows, so "within limit" is not vacuous, and a row over it is faster than
    # one within it, so the order is not the makespan's alone
    assert {row.within_memory_limit for row in comparison.rows} == {True, False}
    makespans = [row.makespan for row in comparison.rows]
    assert makespans != sorted(makespans)
    assert comparison.best_within_limit is comparison.rows[0] and comparison.rows[0].within_memory_limit


@pytest.mark.parametrize("problem", [
    dict(num_devices=3, num_microbatches=6),
    dict(num_devices=3, num_microbatches=6, weight_times=1),
    dict(num_devices=2, num_microbatches=4, chunks_per_device=2, weight_times=1),
    dict(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="v", weight_times=1),
])
def test_default_set_is_every_registered_schedule_that_applies(problem):
    problem = Problem(**problem)
    comparison = compare(problem)
    expected = applicable(problem)
    assert sorted(row.name for row in comparison.rows) == sorted(expected)
    left_out = [entry.name for entry in registered() if entry.name not in expected]
    assert [name for name, _ in comparison.not_applicable] == left_out
    assert all(reason.startswith(f"{name} needs") for name, reason in comparison.not_applicable)


def test_named_schedules_only_once_each_and_each_must_apply():
    problem = Problem(num_devices=3, num_microbatches=6)
    assert sorted(row.name for row in compare(problem, ["gpipe", "1f1b", "gpipe"]).rows) == ["1f1b", "gpipe"]
    with pytest.raises(NotApplicableError, match=r"schedule 'zb-h1' does not apply to this problem: zb-h1 needs"):
        compare(problem, ["1f1b", "zb-h1"])
    with pytest.raises(UnknownScheduleError, match="unknown schedule '1f1x'; did you mean '1f1b'"):
        compare(problem, ["1f1x"])


def test_optimal_row_is_never_beaten_and_certifies_its_gap():
    # a tight limit with latency: the best published heuristic within the limit takes 33, the optimum 27
    # (which zbopt's own greedy list schedule reaches here)
    problem = Problem(num_devices=3, num_microbatches=4, forward_times=1, backward_times=2, weight_times=1,
                      p2p_time=0.5, memory_limit=2.5)
    comparison = compare(problem, optimal=True, time_limit=10)
    result = comparison.solve_result
    (optimal,) = [row for row in comparison.rows if row.name == "cpsat"]
    assert optimal.status == result.status == "optimal" and optimal.within_memory_limit
    assert optimal.makespan == result.objective == result.simulation.makespan == 27
    heuristics = [row for row in comparison.rows if row.name != "cpsat"]
    assert min(row.makespan for row in heuristics if row.within_memory_limit and row.name != "greedy") == 33
    assert [row.makespan for row in heuristics if row.name == "greedy"] == [27]
    assert all(optimal.makespan <= row.makespan for row in heuristics if row.within_memory_limit)
    # the bound holds within the limit only: schedules that break it may be faster, with a negative gap
    faster = [row for row in heuristics if row.makespan < optimal.makespan]
    assert faster and all(not row.within_memory_limit and row.gap < 0 for row in faster)
    assert optimal.gap == 0 and comparison.lower_bound == result.lower_bound == optimal.makespan
    assert {row.lower_bound for row in comparison.rows} == {result.lower_bound}
    # the heuristics are there too, each with its gap to the proven optimum
    assert len(comparison.rows) == len(applicable(problem)) + 1
    # the optimum is the warm start's schedule (greedy's), proven by a bound with no model searched:
    # its chart is labelled by the schedule it is, as the trace is
    assert result.warm_start == "greedy" and result.decided_by.startswith("lower bound")
    assert optimal.simulation.schedule.name == "greedy"
    figure = plot_gantt(optimal.simulation)
    assert figure.axes[0].get_title().startswith("greedy: ")
    plt.close(figure)


def test_comparison_chart_draws_the_table_top_down_and_marks_rows_over_the_limit():
    problem = Problem(**LIMITED)
    comparison = compare(problem)
    figure = plot_comparison(comparison)
    time_axes, memory_axes = figure.axes
    for axes, key in ((time_axes, "makespan"), (memory_axes, "peak_memory")):
        bars = sorted(axes.patches, key=lambda bar: bar.get_y())  # the y axis runs downwards: first row on top
        assert time_axes.get_ylim()[0] > time_axes.get_ylim()[1]
        assert [bar.get_width() for bar in bars] == [row.to_dict()[key] for row in comparison.rows]
        assert [bar.get_hatch() is not None for bar in bars] == [not row.within_memory_limit for row in comparison.rows]
    names = [tick.get_text() for tick in time_axes.get_yticklabels()]
    assert names == [row.name for row in comparison.rows]
    red = [tick.get_color() == SCREEN_PALETTE.limit for tick in time_axes.get_yticklabels()]
    assert red == [not row.within_memory_limit for row in comparison.rows]
    (limit,) = [line for line in memory_axes.lines if line.get_gid() == "memory-limit"]
    (bound,) = [line for line in time_axes.lines if line.get_gid() == "lower-bound"]
    assert limit.get_xdata()[0] == 4 and bound.get_xdata()[0] == comparison.lower_bound
    assert "over memory limit" in [text.get_text() for text in figure.legends[0].get_texts()]


def test_comparison_legend_keys_only_what_is_drawn():
    within = [row for row in compare(Problem(**LIMITED)).rows if row.within_memory_limit]
    keys = [text.get_text() for text in plot_comparison(within).legends[0].get_texts()]
    assert "within memory limit" in keys and "over memory limit" not in keys


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_json_rows_match_zbopt_simulate(capsys):
    status, out, err = run(capsys, "compare", *LIMITED_FLAGS, "--json")
    assert (status, err) == (0, "")
    rows = json.loads(out)
    assert [row["name"] for row in rows] == [row.name for row in compare(Problem(**LIMITED)).rows]
    for row in rows:
        _, simulated, _ = run(capsys, "simulate", *LIMITED_FLAGS, "--schedule", row["name"], "--json")
        simulated = json.loads(simulated)
        assert (row["makespan"], row["bubble_rate"], row["zb_bubble_rate"], row["peak_memory"],
                row["within_memory_limit"]) == (simulated["makespan"], simulated["bubble_rate"],
                                                simulated["zb_bubble_rate"], max(simulated["peak_memory"]),
                                                simulated["valid"])


def test_cli_table_lists_the_rows_by_makespan(capsys):
    status, out, _ = run(capsys, "compare", *LIMITED_FLAGS, "--schedule", "gpipe", "zb-h1", "1f1b")
    lines = out.splitlines()
    header = next(index for index, line in enumerate(lines) if line.startswith("schedule"))
    table = [line.split() for line in lines[header + 1:header + 4]]
    expected = compare(Problem(**LIMITED), ["gpipe", "zb-h1", "1f1b"]).rows
    assert status == 0
    assert [cells[0] for cells in table] == [row.name for row in expected]
    assert [cells[-2] for cells in table] == ["yes" if row.within_memory_limit else "no" for row in expected]
    peaks = [list(simulate(Problem(**LIMITED), generate(row.name, Problem(**LIMITED))).peak_memory) for row in expected]
    # one limit (4) on every device: the highest peak binds, said against that device's limit
    assert [" ".join(cells[6:-2]) for cells in table] == \
        [f"device {peak.index(max(peak))}: {max(peak):g} of 4" for peak in peaks]
    bounds = lower_bounds(Problem(**LIMITED))
    assert f"lower bound   {bounds.best:.6g} ({bounds.binding_bound.describe()})" in lines


def test_cli_table_closes_with_the_best_schedule_within_the_limit(capsys):
    best = compare(Problem(**LIMITED)).best_within_limit
    lines = run(capsys, "compare", *LIMITED_FLAGS)[1].splitlines()
    assert lines[-1] == f"best within the limit: {best.name} (gap {best.cells()['gap']})"
    header = next(index for index, line in enumerate(lines) if line.startswith("schedule"))
    assert lines[header + 1].split()[0] == best.name  # a faster schedule over the limit comes below it
    assert run(capsys, "compare", *LIMITED_FLAGS, "--schedule", "gpipe")[1].splitlines()[-1] == \
        "no schedule within the limit"  # gpipe holds 6 activations on device 0
    # no limit to be within; 1f1b's (m + p - 1)(F + BW) = 9 is the critical path's bound
    assert run(capsys, "compare", "-s", "2", "-b", "2", "--schedule", "1f1b")[1].splitlines()[-1] == \
        "best: 1f1b (gap 0.00%)"


def test_cli_quiet_prints_nothing_not_even_the_progress_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    # the best heuristic within the limit (greedy, 43) does not meet the bound (40): CP-SAT searches, live on a terminal
    argv = ("compare", "-s", "3", "-b", "6", "-f", "1", "-bw", "2", "-w", "1", "--p2p-time", "0.5",
            "--memory-limit", "2", "--schedule", "1f1b", "--optimal", "--time-limit", "10")
    status, out, err = run(capsys, *argv)
    assert status == 0 and "incumbent" in err and "cpsat" in out
    report = tmp_path / "report.html"
    assert run(capsys, *argv, "--quiet", "-o", str(report)) == (0, "", "")
    assert 'data-schedule="cpsat"' in report.read_text(encoding="utf-8")


@pytest.mark.parametrize(("argv", "message"), [
    (("--schedule", "1f1b", "nope"), "zbopt: unknown schedule 'nope'"),
    (("--schedule", "zb-h1"), "zbopt: schedule 'zb-h1' does not apply to this problem: zb-h1 needs a split backward"),
    (("-o", "report.txt"), "zbopt: output file 'report.txt': unsupported extension, use .html, .htm (a report)"),
    (("--time-limit", "5"), "zbopt: --time-limit applies to --optimal and --frontier only"),
])
def test_cli_mistakes_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, "compare", "-s", "2", "-b", "2", *argv)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_comparison_chart_of_one_row_without_a_limit():
    (row,) = compare(Problem(num_devices=2, num_microbatches=2), ["1f1b"]).rows
    time_axes, memory_axes = plot_comparison([row]).axes  # rows alone will do
    assert [bar.get_width() for bar in time_axes.patches] == [row.makespan] == [9.0]
    assert [bar.get_width() for bar in memory_axes.patches] == [row.peak_memory] == [2.0]
    assert not [line for line in memory_axes.lines if line.get_gid() == "memory-limit"]


def test_compare_takes_torchs_built_ins_by_name():
    """torch's ZBVZeroBubble builds zbopt's torch-zbv order op for op, so both rows have one makespan."""
    require_extra("torch", "torch's built-in schedules need the optional extra zbopt[torch]")
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", weight_times=1)
    rows = {row.name: row for row in compare(problem, ["torch-zbv", "torch:ZBVZeroBubble"]).rows}
    zb_v = simulate(problem, generate("torch-zbv", problem)).makespan
    assert rows["torch:ZBVZeroBubble"].makespan == rows["torch-zbv"].makespan == zb_v


def test_the_optimizer_is_never_behind_a_row_where_microbatches_differ():
    """Issue 41's case, smaller: 8 microbatches of 512 to 4096 tokens under a memory limit. The
    table holds each heuristic in every order rule (DynaPipe's included); the optimizer starts from
    the best of them, so its row is never longer than any row within the limit, even at 2 s."""
    problem = Problem(num_devices=4, num_microbatches=8, weight_times=1.0, attention_share=0.3,
                      microbatch_tokens=[512, 4096, 1024, 3000, 700, 2048, 600, 3500], memory_limit=6)
    for schedules in (None, ["1f1b", "greedy"]):  # every heuristic's rows, or a few (with their best orders)
        comparison = compare(problem, schedules, optimal=True, time_limit=2)
        (optimal,) = [row for row in comparison.rows if row.name == "cpsat"]
        within = [row.makespan for row in comparison.rows if row.within_memory_limit and row.name != "cpsat"]
        assert within and optimal.makespan <= min(within) + 1e-9


def test_schedules_past_the_heuristics_share_are_named_not_run_and_none_starts_after_a_valid_row():
    """The one loop of compare's and plan's rows under a clock: while no row is valid the cutoff
    rules (a first row however late), after one the deadline does; what did not start is named,
    what does not apply has its reason, and the rows built are the simulator's."""
    from zbopt.planning.comparison import simulated_in_time
    from zbopt.presentation.tables import NOT_RUN, format_comparison

    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    reasons, late = {}, []
    built = simulated_in_time(problem, ["zb-v", "1f1b", "gpipe", "zb-h1"], deadline=0.0, reasons=reasons, late=late)
    assert list(built) == ["1f1b"] and built["1f1b"].makespan == simulate(problem, generate("1f1b", problem)).makespan
    assert list(reasons) == ["zb-v"] and late == ["gpipe", "zb-h1"]
    with pytest.raises(NotApplicableError, match="schedule 'zb-v' does not apply"):
        simulated_in_time(problem, ["zb-v"])
    comparison = compare(problem, ["1f1b"])
    shown = format_comparison(type(comparison)(**{**comparison.__dict__, "not_run": ("gpipe", "zb-h1")}))
    assert f"not run (2, {NOT_RUN}): gpipe, zb-h1" in shown
