import re
import xml.etree.ElementTree as ElementTree

import matplotlib.pyplot as plt
import numpy as np
import pytest

from zbopt import Problem, compare, generate, simulate
from zbopt.core.errors import ZboptError
from zbopt.presentation.plot import chunk_color, plot_gantt, plot_memory

SVG = "{http://www.w3.org/2000/svg}"


def simulated(schedule: str, **problem):
    problem = Problem(**problem)
    return simulate(problem, generate(schedule, problem))


def collection(axes, gid: str):
    return next(c for c in axes.collections if c.get_gid() == gid)


def test_gantt_svg_holds_one_box_per_op_grouped_by_kind_and_chunk(tmp_path):
    simulation = simulated("zb-v", num_devices=3, num_microbatches=5, chunks_per_device=2, placement="v",
                           forward_times=1, backward_times=1, weight_times=1)
    plot_gantt(simulation, tmp_path / "gantt.svg")
    groups = {g.get("id"): g for g in ElementTree.parse(tmp_path / "gantt.svg").iter(f"{SVG}g")}
    boxes = {gid: len(group.findall(f".//{SVG}path")) + len(group.findall(f".//{SVG}use"))
             for gid, group in groups.items() if gid and gid.startswith("ops-")}
    # 3 devices x 5 microbatches of each kind on each chunk
    assert boxes == {f"ops-{kind}-chunk{chunk}": 15 for kind in "FBW" for chunk in (0, 1)}
    assert len(groups["idle-lanes"].findall(f".//{SVG}path")) == 3


def test_gantt_boxes_span_the_simulated_times_on_their_device_rows():
    simulation = simulated("1f1b", num_devices=4, num_microbatches=6, forward_times=1, backward_times=2)
    axes = plot_gantt(simulation).axes[0]
    table = simulation.table
    for kind in ("F", "BW"):
        drawn = sorted((round(path.vertices[:, 1].mean()), path.vertices[:, 0].min(), path.vertices[:, 0].max())
                       for path in collection(axes, f"ops-{kind}-chunk0").get_paths())
        ops = [i for i, op in enumerate(table.ops()) if op.kind == kind]
        expected = sorted((table.device[i], simulation.start[i], simulation.end[i]) for i in ops)
        assert drawn == expected
    plt.close("all")


def test_gantt_rows_end_with_each_devices_peak_memory():
    """1F1B and GPipe share a makespan (F = 1, B = 2, p = 4, m = 8); their rows' ends tell them
    apart: p - d activations at once on device d against all m."""
    for name, expected in (("1f1b", ["peak 4", "peak 3", "peak 2", "peak 1"]), ("gpipe", ["peak 8"] * 4)):
        simulation = simulated(name, num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
        figure = plot_gantt(simulation)
        peaks = next(axes for axes in figure.axes[1:] if axes.get_yticklabels())
        assert [label.get_text() for label in peaks.get_yticklabels()] == expected
        assert [f"peak {peak:g}" for peak in simulation.peak_memory] == expected
    plt.close("all")


def label_boxes_in_pixels(figure, simulation):
    """Per label of the Gantt, (its text's pixel bbox, its op's box's pixel bbox, its text, its op)."""
    axes = figure.axes[0]
    renderer = figure.canvas.get_renderer()
    table = simulation.table
    result = []
    for label in axes.texts:
        center, row = label.get_position()
        device = round(row)  # a label sits at its row's centre (above the copy lanes, if any)
        ops = simulation.device_ops[device]
        op = ops[np.searchsorted(simulation.start[ops], center) - 1]
        assert simulation.start[op] < center < simulation.end[op]
        corners = axes.transData.transform([(simulation.start[op], device - 0.4), (simulation.end[op], device + 0.4)])
        result.append((label.get_window_extent(renderer).extents, np.sort(corners, axis=0).ravel(),
                       label.get_text(), table.op(op)))
    return result


@pytest.mark.parametrize(("schedule", "problem"), [
    ("1f1b", {"num_devices": 2, "num_microbatches": 4, "forward_times": 1, "backward_times": 2}),
    ("zb-v", {"num_devices": 4, "num_microbatches": 8, "chunks_per_device": 2, "placement": "v",
              "forward_times": 1, "backward_times": 1, "weight_times": 1}),
])
def test_gantt_labels_every_op_inside_its_box_where_all_fit(schedule, problem):
    simulation = simulated(schedule, **problem)
    figure = plot_gantt(simulation)
    labels = label_boxes_in_pixels(figure, simulation)
    assert figure.axes[0].get_xlabel() == "time"
    plt.close(figure)
    assert len(labels) == simulation.problem.num_ops
    for text_box, op_box, text, op in labels:
        assert text == str(op.microbatch)
        assert op_box[0] <= text_box[0] and text_box[2] <= op_box[2], (op, text_box, op_box)
        assert op_box[1] <= text_box[1] and text_box[3] <= op_box[3], (op, text_box, op_box)
    assert not overlapping(labels)


@pytest.mark.parametrize(("schedule", "problem"), [
    ("1f1b", {"num_devices": 32, "num_microbatches": 64, "forward_times": 1, "backward_times": 2}),
    # 20 inches for a makespan of 861: no box is wide enough for a number
    ("1f1b", {"num_devices": 32, "num_microbatches": 256, "forward_times": 1, "backward_times": 2}),
    ("interleaved-1f1b", {"num_devices": 8, "num_microbatches": 32, "chunks_per_device": 2, "forward_times": 1,
                          "backward_times": 1, "weight_times": 1}),
])
def test_dense_gantt_numbers_every_kth_microbatch_without_overlap(schedule, problem):
    """Where most boxes are too narrow for their number, the ops of microbatches 0, k, 2k, ... are
    numbered (k said under the axis), each label centred on its op, none touching another, and
    every device's first op (microbatch 0's forward) numbered."""
    simulation = simulated(schedule, **problem)
    figure = plot_gantt(simulation)
    width, height = figure.get_size_inches()
    match = re.fullmatch(r"time \(numbered: microbatches 0, (\d+), (\d+), …\)", figure.axes[0].get_xlabel())
    labels = label_boxes_in_pixels(figure, simulation)
    plt.close(figure)
    assert width <= 20 and height <= 12
    step = int(match[1])
    assert step > 1 and int(match[2]) == 2 * step
    for text_box, op_box, text, op in labels:
        assert text == str(op.microbatch) and op.microbatch % step == 0
        assert (text_box[0] + text_box[2]) / 2 == pytest.approx((op_box[0] + op_box[2]) / 2, abs=1)
    assert not overlapping(labels)
    assert sum(text == "0" and op.kind == "F" and op.stage < simulation.problem.num_devices
               for *_, text, op in labels) >= simulation.problem.num_devices


def overlapping(labels) -> bool:
    if not labels:
        return False
    x0, y0, x1, y1 = np.array([text_box for text_box, *_ in labels]).T
    overlap = (x0[:, None] < x1[None, :]) & (x0[None, :] < x1[:, None]) \
        & (y0[:, None] < y1[None, :]) & (y0[None, :] < y1[:, None])
    np.fill_diagonal(overlap, False)
    return bool(overlap.any())


def test_the_legend_gives_each_kind_a_column_of_its_chunks_shades():
    """Three chunks: F's, B's and W's keys each fill one column, idle starts the fourth."""
    simulation = simulated("greedy", num_devices=4, num_microbatches=8, chunks_per_device=3, forward_times=1,
                           backward_times=1, weight_times=1)
    figure = plot_gantt(simulation)
    renderer = figure.canvas.get_renderer()
    columns: dict[float, list[str]] = {}
    for text in figure.legends[0].get_texts():
        if text.get_text().strip():
            columns.setdefault(round(text.get_window_extent(renderer).x0), []).append(text.get_text())
    plt.close(figure)
    assert list(columns.values()) == [[f"{name}, chunk {chunk}" for chunk in range(3)]
                                      for name in ("F forward", "B input grad", "W weight grad")] + [["idle"]]


def test_gantt_of_two_chunks_keys_each_kind_in_each_chunks_shade():
    simulation = simulated("zb-v", num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v",
                           forward_times=1, backward_times=1, weight_times=1)
    figure = plot_gantt(simulation)
    legend = figure.legends[0]
    assert [text.get_text() for text in legend.get_texts() if text.get_text().strip()] == [
        "F forward, chunk 0", "F forward, chunk 1", "B input grad, chunk 0", "B input grad, chunk 1",
        "W weight grad, chunk 0", "W weight grad, chunk 1", "idle"]
    shades = [handle.get_facecolor()[:3] for handle in legend.legend_handles[:6]]
    assert shades == [pytest.approx(chunk_color(kind, chunk, 2)) for kind in "FBW" for chunk in (0, 1)]
    plt.close(figure)


def test_gantt_title_names_the_schedule_and_its_metrics():
    simulation = simulated("1f1b", num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    figure = plot_gantt(simulation)
    assert figure.axes[0].get_title() == "1f1b: p=4, m=8, v=1 | makespan 33, bubble 27.3%, ZB bubble 27.3%"
    assert plot_gantt(simulation, title="mine").axes[0].get_title() == "mine"
    plt.close("all")


def test_latency_marks_run_from_each_cross_device_send_to_its_arrival():
    simulation = simulated("zb-h1", num_devices=4, num_microbatches=3, forward_times=2, backward_times=2,
                           weight_times=1, p2p_time=1.5)
    axes = plot_gantt(simulation, show_latency=True).axes[0]
    table = simulation.table
    sends = sorted((simulation.end[producer], table.device[producer], table.device[consumer])
                   for consumer, producer in enumerate(table.predecessor)
                   if producer >= 0 and table.device[producer] != table.device[consumer])
    segments = collection(axes, "p2p-latency").get_segments()
    drawn = sorted((start[0], round(start[1]), round(finish[1])) for start, finish in segments)
    assert drawn == sends and len(sends) == 2 * 3 * 3  # F and B of 3 microbatches across 3 device borders
    assert all(finish[0] - start[0] == 1.5 for start, finish in segments)
    assert "p2p latency 1.5" in [text.get_text() for text in axes.figure.legends[0].get_texts()]
    assert not any(c.get_gid() == "p2p-latency" for c in plot_gantt(simulation).axes[0].collections)
    plt.close("all")


def test_memory_plot_draws_the_simulated_steps_the_limits_and_the_peak():
    simulation = simulated("zb-h2", num_devices=4, num_microbatches=8, forward_times=1, backward_times=1,
                           weight_times=1, memory_limit=(7, 6.5, 6, 5.5))
    figure = plot_memory(simulation)
    panels = figure.axes
    assert len(panels) == 4
    for device, axes in enumerate(panels):
        lines = {line.get_gid(): line for line in axes.get_lines()}
        times, levels = simulation.memory_steps[device]
        step = lines[f"memory-device-{device}"]
        assert step.get_drawstyle() == "steps-post"
        # from time 0 nothing is held until the first step; the last level lasts to the makespan
        assert np.array_equal(step.get_xdata(), [0, *times, simulation.makespan])
        assert np.array_equal(step.get_ydata(), [0, *levels, levels[-1]])
        assert list(lines[f"memory-limit-{device}"].get_ydata()) == [simulation.problem.memory_limit[device]] * 2
        peak_time, peak = lines[f"memory-peak-{device}"].get_xydata()[0]
        assert peak == simulation.peak_memory[device] == levels[times == peak_time][0]
        assert f"device {device}" in [text.get_text() for text in axes.texts]
    title = figure.get_suptitle()
    assert title.startswith("zb-h2: p=4, m=8, v=1 | peak memory ")
    assert float(re.search(r"peak memory ([\d.]+) \(device (\d+)\)", title).group(1)) == max(simulation.peak_memory)
    plt.close(figure)


def test_memory_plot_flags_the_devices_the_simulator_finds_over_their_limit():
    simulation = simulated("zb-h2", num_devices=4, num_microbatches=8, forward_times=1, backward_times=1,
                           weight_times=1, memory_limit=5.5)
    figure = plot_memory(simulation)
    flagged = {device for device, axes in enumerate(figure.axes)
               if any(" > limit 5.5" in text.get_text() for text in axes.texts)}
    plt.close(figure)
    assert flagged == {violation.device for violation in simulation.violations} == {0, 1}


def test_memory_plot_of_many_devices_fills_columns_of_panels():
    simulation = simulated("1f1b", num_devices=12, num_microbatches=16, forward_times=1, backward_times=1)
    figure = plot_memory(simulation)
    assert len(figure.axes) == 12 and all(axes.get_visible() for axes in figure.axes)
    panels = {}  # device -> (column x, row y) of its panel
    for axes in figure.axes:
        (step,) = [line for line in axes.get_lines() if (line.get_gid() or "").startswith("memory-device-")]
        device = int(step.get_gid().removeprefix("memory-device-"))
        assert max(step.get_ydata()) == simulation.peak_memory[device]
        assert not any((line.get_gid() or "").startswith("memory-limit") for line in axes.get_lines())
        panels[device] = (round(axes.get_position().x0, 3), -round(axes.get_position().y0, 3))
    plt.close(figure)
    # devices 0..5 down the first column, 6..11 down the second
    assert sorted(panels, key=panels.get) == list(range(12))
    assert len({x for x, _ in panels.values()}) == 2


@pytest.mark.parametrize("plot", [plot_gantt, plot_memory])
def test_figures_are_written_in_the_format_of_their_extension(plot, tmp_path):
    simulation = simulated("1f1b", num_devices=2, num_microbatches=2)
    magic = {"png": b"\x89PNG", "pdf": b"%PDF", "svg": b"<?xml"}
    for extension, start in magic.items():
        plot(simulation, tmp_path / f"chart.{extension}")
        assert (tmp_path / f"chart.{extension}").read_bytes().startswith(start)
    with pytest.raises(ZboptError, match=r"chart\.jpg.*\.png, \.svg, \.pdf"):
        plot(simulation, tmp_path / "chart.jpg")
    assert not (tmp_path / "chart.jpg").exists()


def test_block_drawing_folds_each_device_into_one_full_period():
    """The middle panel is one period wide; its boxes, clipped to [0, T), add up to each device's
    work per microbatch (an op that wraps is drawn in two pieces); the top panel's boxes start at
    the block's offsets."""
    from zbopt.presentation.plot.block import plot_block
    from zbopt.solvers.blocks import published_block

    problem = Problem(num_devices=3, num_microbatches=6, chunks_per_device=2, placement="v",
                      forward_times=[2, 3, 2, 1, 2, 3], backward_times=2, weight_times=1, p2p_time=0.5)
    block = published_block("v-half", problem)
    figure = plot_block(block)
    first, folded, _ = figure.axes
    assert folded.get_xlim() == (0, block.period)
    covered = [0.0] * 3
    for path in collection(folded, "folded-ops").get_paths():
        (x0, y0), (x1, _) = path.vertices[0], path.vertices[1]
        covered[round(y0 + 0.4)] += min(x1, block.period) - max(x0, 0.0)
    work = [sum(problem.cost(kind, s) for kind in problem.kinds for s in stages) for stages in problem.stages_of_device]
    assert covered == pytest.approx(work)
    starts = sorted(path.vertices[0][0] for path in collection(first, "block-ops").get_paths())
    assert starts == pytest.approx(sorted(block.offsets.values()))
    plt.close(figure)


def test_a_long_title_wraps_inside_the_figure():
    """The comparison's default title names the whole problem; with microbatches of many lengths it
    is longer than the figure is wide, and must wrap rather than run off both edges."""
    from zbopt.presentation.plot import plot_comparison

    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=1, weight_times=1,
                      microbatch_tokens=[4096, 512, 8192, 1024, 2048, 6144, 768, 3072], attention_share=0.3)
    figure = plot_comparison(compare(problem, ["1f1b", "zb-h1"], bounds=False))
    figure.canvas.draw()
    box = figure._suptitle.get_window_extent(figure.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= figure.bbox.width
    plt.close(figure)
