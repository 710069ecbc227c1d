"""The memory–makespan frontier: its values against closed forms and lone solves, its order, the
heuristics on or above it, the same answers on a dask cluster, and one-line errors."""

import itertools
import json

import matplotlib.pyplot as plt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import require_extra
from zbopt import Problem, ZboptError, solve
from zbopt.interfaces.cli import main
from zbopt.planning.frontier import Frontier, FrontierPoint, HeuristicPoint, memory_frontier, parse_memory_limits
from zbopt.presentation.plot import plot_frontier
from zbopt.presentation.plot.frontier import _panel_ranges, _text_box

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
    """A heuristic is a valid schedule at any limit g >= its peak, so the optimum there (the
    frontier's makespan at the first sweep limit g at or above the peak) is at most its makespan.
    Every heuristic has such a limit: none holds more than all m = 4 activations (M_B = 1), and
    the sweep reaches 2p = 6."""
    names = {heuristic.name for heuristic in frontier.heuristics}
    assert {"gpipe", "1f1b", "zb-h1", "zb-h2"} <= names  # the split, v = 1 schedules of the papers at least
    for heuristic in frontier.heuristics:
        assert heuristic.peak_memory <= M <= LIMITS[-1], heuristic
        point = next(point for point in frontier.points if point.memory_limit >= heuristic.peak_memory - 1e-9)
        assert point.makespan <= heuristic.makespan + 1e-9, (heuristic, point)


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
    distributed = require_extra("dask", "dask.distributed is the optional extra zbopt[dask]")
    with (distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
          as cluster, distributed.Client(cluster) as client):
        on_dask = memory_frontier(PROBLEM, LIMITS, time_limit=TIME_LIMIT, executor=client.get_executor())
    assert answers(on_dask) == answers(frontier)
    assert on_dask.heuristics == frontier.heuristics


def test_plot_labels_every_heuristic_once_without_overlap(frontier):
    figure = plot_frontier(frontier)
    labels = [text for axes in figure.axes for text in axes.texts if text.get_text()]
    names = [name for label in labels for name in label.get_text().split(", ")]
    assert sorted(names) == sorted(point.name for point in frontier.heuristics)
    renderer = figure.canvas.get_renderer()
    boxes = [_text_box(label, renderer) for label in labels]
    for index, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[index + 1:])
    assert "memory per device" in figure.axes[-1].get_xlabel() and "makespan" in figure.get_supylabel()
    plt.close(figure)


def drawn_points(figure, gid: str) -> list[list[tuple[float, float]]]:
    """Per panel, the data points of its line with this gid (none when the panel has no such line)."""
    return [[tuple(point) for line in axes.lines if line.get_gid() == gid for point in line.get_xydata()]
            for axes in figure.axes]


def hand_made_frontier(makespans: list[float], heuristics: list[tuple[float, float]]) -> Frontier:
    """A frontier at limits 1, 2, ... with these proven makespans and heuristics (peak memory, makespan)."""
    points = tuple(FrontierPoint(memory_limit=float(limit), status="optimal", makespan=makespan,
                                 lower_bound=makespan, solve_time_s=0.0, found_at=float(limit))
                   for limit, makespan in enumerate(makespans, start=1))
    return Frontier(problem=Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=1,
                                    weight_times=1), time_limit=1.0, points=points,
                    heuristics=tuple(HeuristicPoint(f"h{index}", memory, makespan)
                                     for index, (memory, makespan) in enumerate(heuristics)), wall_time_s=0.0)


def test_the_axis_breaks_when_a_steep_first_step_would_squash_the_heuristics():
    """The demo's shape (1275 at the floor, heuristics within 425..482): the axis breaks at the
    widest gap under which most values fill less than 30 % of the range (532 | 700; 700 | 1275 is
    wider but 425..700 fills a third), and every marker is drawn in exactly one panel."""
    makespans = [1275.0, 700.0, 532.0, 457.0, 425.0, 425.0, 425.0, 425.0]
    heuristics = [(4.0, 481.5), (4.0, 457.0), (7.0, 425.0), (8.0, 481.5)]
    figure = plot_frontier(hand_made_frontier(makespans, heuristics))
    top, bottom = figure.axes[:2]
    low, high = bottom.get_ylim()
    assert low == pytest.approx(425 - 0.08 * 107) and high == pytest.approx(532 + 0.08 * 107)
    assert top.get_ylim() == pytest.approx((700 - 0.08 * 575, 1275 + 0.08 * 575))
    assert [len(points) for points in drawn_points(figure, "axis-break")] == [1, 1]
    assert drawn_points(figure, "frontier-optimal") == [[(1.0, 1275.0), (2.0, 700.0)],
                                                        [(float(limit), m) for limit, m in
                                                         enumerate(makespans[2:], start=3)]]
    assert drawn_points(figure, "heuristics") == [[], heuristics]
    plt.close(figure)


def test_one_slow_heuristic_gets_the_upper_panel_with_its_label():
    """serial-offload's shape: one heuristic far above the rest has a panel of its own, labelled there."""
    figure = plot_frontier(hand_made_frontier([118.0, 89.0, 85.0, 81.0], [(1.0, 240.0), (3.0, 93.0), (4.0, 87.0)]))
    top, bottom = figure.axes[:2]
    assert drawn_points(figure, "heuristics") == [[(1.0, 240.0)], [(3.0, 93.0), (4.0, 87.0)]]
    assert [text.get_text() for text in top.texts] == ["h0"]
    assert sorted(text.get_text() for text in bottom.texts) == ["h1", "h2"]
    plt.close(figure)


@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=12))
def test_every_value_shows_in_one_panel_and_is_drawn_by_it(values):
    """Each value lies inside exactly one panel's view and that panel draws its marker; a break
    keeps at least half of the values below it, and the two views do not overlap."""
    ranges = _panel_ranges(values)
    for value in values:
        showing = [owned for (low, high), owned in ranges if low <= value <= high]
        assert len(showing) == 1 and showing[0][0] <= value <= showing[0][1]
    if len(ranges) == 2:
        ((top_low, _), (above, _)), ((_, bottom_high), (_, below)) = ranges
        assert 2 * sum(value <= below for value in values) >= len(values)
        assert bottom_high <= top_low and above > below


def test_the_axis_stays_whole_when_the_heuristics_span_the_range():
    """Heuristics from the top step to the bottom one fill the axis: breaking it would hide nothing."""
    figure = plot_frontier(hand_made_frontier([600.0, 500.0, 450.0], [(2.0, 600.0), (3.0, 450.0)]))
    assert len(figure.axes) == 1 and drawn_points(figure, "axis-break") == [[]]
    plt.close(figure)


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
    (["--memory-limits", "1:2:1", "--memory-limit", "2", "2", "2", "2"], "the sweep sets the limit"),
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
    from zbopt.planning.frontier import FrontierPoint, _best_known_at_each_limit

    solved = [FrontierPoint(1, "feasible", 10.0, 8.0, 1.0, 1), FrontierPoint(2, "unknown", None, 7.0, 1.0, 2),
              FrontierPoint(3, "feasible", 12.0, 9.0, 1.0, 3)]
    assert [(p.status, p.makespan, p.lower_bound, p.found_at) for p in _best_known_at_each_limit(solved)] == [
        ("feasible", 10.0, 9.0, 1), ("feasible", 10.0, 9.0, 1), ("feasible", 10.0, 9.0, 1)]
    proven_above = [FrontierPoint(1, "feasible", 10.0, 8.0, 1.0, 1), FrontierPoint(2, "optimal", 10.0, 10.0, 1.0, 2)]
    carried = _best_known_at_each_limit(proven_above)
    assert [(p.status, p.lower_bound) for p in carried] == [("optimal", 10.0), ("optimal", 10.0)]


# per-device limits that differ: the sweep scales them (factor × each device's own), never one for all
SCALED = Problem(num_devices=3, num_microbatches=4, weight_times=1, memory_limit=[3, 2, 1.5])


def test_a_sweep_scales_per_device_limits_that_differ(capsys):
    factors = (1.0, 1.5)
    frontier = memory_frontier(SCALED, factors, time_limit=TIME_LIMIT, workers=1)
    assert frontier.scaled == (3, 2, 1.5)
    assert [frontier.device_limits(point) for point in frontier.points] == [(3, 2, 1.5), (4.5, 3, 2.25)]
    for point, factor in zip(frontier.points, factors, strict=True):
        alone = solve(SCALED.replace(memory_limit=[factor * 3, factor * 2, factor * 1.5]), "cpsat",
                      time_limit=TIME_LIMIT, workers=1)
        assert (point.memory_limit, point.makespan) == (factor, alone.objective)
    # 1F1B with a split backward holds p - d activations on device d: 3, 2, 1 against 3, 2, 1.5
    (one_f_one_b,) = [point for point in frontier.heuristics if point.name == "1f1b"]
    assert one_f_one_b.factor == max(3 / 3, 2 / 2, 1 / 1.5) == 1
    data = frontier.to_dict()
    assert data["scaled_limits"] == [3, 2, 1.5] and data["points"][1]["device_limits"] == [4.5, 3, 2.25]
    text = str(frontier)
    assert "sweep         each value is a factor: device d's limit = factor × its own, 3, 2, 1.5 (devices 0-2)" \
        in text.splitlines()
    assert "4.5, 3, 2.25" in text
    with pytest.raises(ZboptError, match=r"memory limit factor 0\.3 \(limits 0\.9, 0\.6, 0\.45\): device 0"):
        memory_frontier(SCALED, [0.3], time_limit=TIME_LIMIT, workers=1)


def test_a_limit_the_same_on_every_device_is_replaced_and_said_so(frontier):
    assert frontier.scaled is None and "sweep         each value is every device's memory limit" in str(frontier)
    same = memory_frontier(PROBLEM.replace(memory_limit=4), [2.0], time_limit=TIME_LIMIT, workers=1)
    assert same.scaled is None and same.device_limits(same.points[0]) == (2.0,) * P
    assert "(the problem's 4 unused)" in str(same)
