"""The memory–makespan frontier: its values against closed forms and lone solves, its order, the
heuristics on or above it, the same answers on a dask cluster, and one-line errors."""

import itertools
import json

import pytest

from zbopt import Problem, ZboptError, solve
from zbopt.cli import main
from zbopt.frontier import HeuristicPoint, memory_frontier, parse_memory_limits
from zbopt.plot import plot_frontier
from zbopt.plot.frontier import _text_box

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
P, M = 3, 4
PROBLEM = Problem(num_devices=P, num_microbatches=M, forward_times=1, backward_times=1, weight_times=1,
                  weight_memory=0.5)
LIMITS = parse_memory_limits(f"{max(PROBLEM.min_memory_limit)}:{2 * P}:0.5")  # 1, 1.5, ..., 6
TIME_LIMIT = 10


@pytest.fixture(scope="module")
def frontier():
    return memory_frontier(PROBLEM, LIMITS, time_limit=TIME_LIMIT)


def answers(frontier):
    return [(point.memory_limit, point.status, point.makespan, point.lower_bound) for point in frontier.points]


def test_parse_includes_stop_despite_float_rounding():
    assert parse_memory_limits("1:8:1") == tuple(float(limit) for limit in range(1, 9))
    assert parse_memory_limits("1:2:0.1") == tuple(round(1 + 0.1 * i, 12) for i in range(11))
    assert parse_memory_limits("2.5:2.5:1") == (2.5,)


@pytest.mark.parametrize(("text", "culprit"), [
    ("1:8", "START:STOP:STEP"), ("a:8:1", "START:STOP:STEP"), ("1:inf:1", "START:STOP:STEP"),
    ("1:8:0", "STEP must be positive"), ("1:8:-1", "STEP must be positive"), ("8:1:1", "STOP 1 is below START 8"),
])
def test_parse_errors_name_the_culprit(text, culprit):
    with pytest.raises(ZboptError, match=culprit):
        parse_memory_limits(text)


def test_a_limit_below_the_least_valid_one_is_an_error_not_dropped():
    with pytest.raises(ZboptError, match=r"memory limit 0\.5: device 0 must hold one microbatch"):
        memory_frontier(PROBLEM, [0.5, 1.0, 2.0], time_limit=TIME_LIMIT)
    with pytest.raises(ZboptError, match="none given"):
        memory_frontier(PROBLEM, [], time_limit=TIME_LIMIT)


def test_the_sweep_covers_every_limit_and_proves_this_small_problem(frontier):
    assert [point.memory_limit for point in frontier.points] == list(LIMITS)
    assert all(point.status == "optimal" and point.gap == 0 for point in frontier.points)


def test_at_one_activation_per_device_microbatches_run_one_at_a_time(frontier):
    # F on device 0 needs the previous microbatch's B and W there done: m·(p(F+B) + W)
    assert frontier.points[0].makespan == pytest.approx(M * (P * 2 + 1))


def test_the_frontier_never_rises_with_more_memory(frontier):
    proven = [point.makespan for point in frontier.points if point.status == "optimal"]
    assert all(later <= earlier + 1e-9 for earlier, later in itertools.pairwise(proven))
    assert proven[-1] < proven[0]  # memory buys time here


def test_every_heuristic_lies_on_or_above_the_frontier(frontier):
    assert frontier.heuristics
    for heuristic in frontier.heuristics:
        at_or_above = [point for point in frontier.points if point.memory_limit >= heuristic.peak_memory - 1e-9]
        if at_or_above:  # optimum(g) <= optimum(peak) <= the heuristic's makespan, for the next limit g
            assert at_or_above[0].lower_bound <= heuristic.makespan + 1e-9, heuristic


def test_heuristics_sit_at_their_own_peak_memory(frontier):
    # split 1F1B with W right after B: p activations on device 0, (m+p-1)(F+B) + mW
    assert HeuristicPoint("1f1b", P, (M + P - 1) * 2 + M) in frontier.heuristics
    names = [point.name for point in frontier.heuristics]
    assert "interleaved-1f1b" not in names  # needs v >= 2: not applicable, left out
    assert len(names) == len(set(names))


@pytest.mark.parametrize("limit", [LIMITS[0], 3.0, LIMITS[-1]])
def test_points_equal_a_lone_solve(frontier, limit):
    alone = solve(PROBLEM.replace(memory_limit=limit), "cpsat", time_limit=TIME_LIMIT, workers=1)
    point = next(point for point in frontier.points if point.memory_limit == limit)
    assert (point.status, point.makespan, point.lower_bound) == (alone.status, alone.objective, alone.lower_bound)


def test_a_dask_cluster_gives_the_same_frontier(frontier):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is the optional extra zbopt[dask]")
    with (distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
          as cluster, distributed.Client(cluster) as client):
        on_dask = memory_frontier(PROBLEM, LIMITS, time_limit=TIME_LIMIT, executor=client.get_executor())
    assert answers(on_dask) == answers(frontier)
    assert on_dask.heuristics == frontier.heuristics


def test_plot_labels_every_heuristic_once_without_overlap(frontier):
    figure = plot_frontier(frontier)
    axes = figure.axes[0]
    labels = [text for text in axes.texts if text.get_text()]
    names = [name for label in labels for name in label.get_text().split(", ")]
    assert sorted(names) == sorted(point.name for point in frontier.heuristics)
    renderer = figure.canvas.get_renderer()
    boxes = [_text_box(label, renderer) for label in labels]
    for index, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[index + 1:])
    assert "memory per device" in axes.get_xlabel() and "makespan" in axes.get_ylabel()


def test_cli_prints_json_and_writes_the_figure(tmp_path, capsys):
    figure = tmp_path / "frontier.png"
    status = main(["frontier", "--memory-limits", "1:2:1", "-s", "2", "-b", "2", "-f", "1", "-bw", "1", "-w", "1",
                   "--time-limit", "10", "--workers", "1", "--json", "-o", str(figure)])
    out, _ = capsys.readouterr()
    assert status == 0
    data = json.loads(out)
    assert [point["memory_limit"] for point in data["points"]] == [1.0, 2.0]
    assert data["points"][0]["makespan"] == 2 * (2 * 2 + 1)  # one microbatch at a time, as above
    assert all(point["status"] == "optimal" for point in data["points"])
    assert {"1f1b", "zb-h1"} <= {point["name"] for point in data["heuristics"]}
    assert figure.read_bytes().startswith(PNG_SIGNATURE)


def test_cli_quiet_prints_nothing_and_writes_the_figure(tmp_path, capsys):
    figure = tmp_path / "frontier.svg"
    status = main(["frontier", "--memory-limits", "1:2:1", "-s", "2", "-b", "2", "--time-limit", "10",
                   "--workers", "1", "--quiet", "-o", str(figure)])
    assert (status, *capsys.readouterr()) == (0, "", "")
    assert "<svg" in figure.read_text()


@pytest.mark.parametrize(("argv", "culprit"), [
    (["--memory-limits", "1:8:0"], "STEP must be positive"),
    (["--memory-limits", "1-8"], "START:STOP:STEP"),
    (["--memory-limits", "0.5:2:0.5"], "memory limit 0.5"),
    (["--memory-limits", "1:2:1", "--memory-limit", "2"], "the sweep sets the limit"),
    (["--memory-limits", "1:2:1", "-o", "frontier.txt"], "unsupported extension"),
    (["--memory-limits", "1:2:1", "--workers", "0"], "--workers 0"),
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, argv, culprit):
    status = main(["frontier", *argv])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and culprit in err and "Traceback" not in err


def test_answers_carry_along_the_sweep():
    """A schedule within limit 1 fits limits 2 and 3; the bound proven at limit 3 holds below it."""
    from zbopt.frontier import FrontierPoint, _best_known_at_each_limit

    solved = [FrontierPoint(1, "feasible", 10.0, 8.0, 1.0, 1), FrontierPoint(2, "unknown", None, 7.0, 1.0, 2),
              FrontierPoint(3, "feasible", 12.0, 9.0, 1.0, 3)]
    assert [(p.status, p.makespan, p.lower_bound, p.found_at) for p in _best_known_at_each_limit(solved)] == [
        ("feasible", 10.0, 9.0, 1), ("feasible", 10.0, 9.0, 1), ("feasible", 10.0, 9.0, 1)]
    proven_above = [FrontierPoint(1, "feasible", 10.0, 8.0, 1.0, 1), FrontierPoint(2, "optimal", 10.0, 10.0, 1.0, 2)]
    carried = _best_known_at_each_limit(proven_above)
    assert [(p.status, p.lower_bound) for p in carried] == [("optimal", 10.0), ("optimal", 10.0)]
