"""The one plotter: Gantt charts and memory timelines of simulated schedules (matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from zbopt.errors import ZboptError
from zbopt.problem import BACKWARD, FORWARD, FUSED_BACKWARD, WEIGHT
from zbopt.simulate import Simulation

FIGURE_FORMATS = (".png", ".svg", ".pdf")
KIND_COLORS = {FORWARD: "#3b6fb6", BACKWARD: "#e8862a", WEIGHT: "#3a9a4a", FUSED_BACKWARD: "#8b5bb3"}
KIND_NAMES = {FORWARD: "F forward", BACKWARD: "B input grad", WEIGHT: "W weight grad", FUSED_BACKWARD: "BW backward"}
LANE_COLOR = "#ececec"
LATENCY_COLOR = "#333333"
MEMORY_COLOR = "#3b6fb6"
LIMIT_COLOR = "#c0392b"
BAR_COLOR = "#5b84b1"
DPI = 120
MAX_WIDTH_IN = 20.0  # wider figures do not get more legible; dense charts thin their labels instead
MAX_HEIGHT_IN = 12.0
BOX_HEIGHT = 0.8  # of a device row; the lane behind it is 0.9, leaving a white gap between rows
MIN_LABEL_POINTS, MAX_LABEL_POINTS = 5.0, 8.0
MEMORY_PANEL_ROWS = 8  # more devices than this go into further columns of panels


def chunk_color(kind: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """The kind's colour, lightened for earlier chunks so a device's chunks stay apart."""
    base = to_rgb(KIND_COLORS[kind])
    if chunks == 1:
        return base
    lighten = 0.55 * (chunks - 1 - chunk) / (chunks - 1)
    return tuple(c + (1.0 - c) * lighten for c in base)


def check_figure_path(path: str | Path) -> Path:
    """The path, if its extension is one matplotlib writes here; else a ZboptError naming it."""
    path = Path(path)
    if path.suffix.lower() not in FIGURE_FORMATS:
        raise ZboptError(f"output file '{path}': unsupported extension, use {', '.join(FIGURE_FORMATS)}")
    return path


def plot_gantt(simulation: Simulation, path: str | Path | None = None, *, title: str | None = None,
               show_latency: bool = False):
    """Draw one row per device, one box per op, microbatch numbers where they fit; idle time is
    the grey lane showing through. With `show_latency` (and a problem with p2p_time > 0), a thin
    line per cross-device dependency runs from the producer's end to the moment its data arrives
    on the consumer's device. Writes PNG, SVG or PDF by the extension of `path` when given.

    Returns the matplotlib Figure.
    """
    path = _output_path(path)
    problem = simulation.problem
    p, v = problem.num_devices, problem.chunks_per_device
    makespan = simulation.makespan
    figure, axes = plt.subplots(figsize=_gantt_size(simulation), dpi=DPI, layout="constrained")
    lanes = [_box(0.0, makespan, device, 0.9) for device in range(p)]
    axes.add_collection(PolyCollection(lanes, facecolors=LANE_COLOR, edgecolors="none", zorder=0, gid="idle-lanes"))
    boxes = _op_boxes(simulation)
    for (kind, chunk), (begin, width, device, _) in boxes.items():
        rectangles = [_box(b, w, d, BOX_HEIGHT) for b, w, d in zip(begin, width, device, strict=True)]
        axes.add_collection(PolyCollection(rectangles, facecolors=[chunk_color(kind, chunk, v)], edgecolors="white",
                                           linewidths=0.4, zorder=2, gid=f"ops-{kind}-chunk{chunk}"))
    handles = [Patch(facecolor=KIND_COLORS[kind], label=KIND_NAMES[kind]) for kind in problem.kinds]
    handles.append(Patch(facecolor=LANE_COLOR, label="idle"))
    if show_latency and problem.p2p_time > 0:
        # under the boxes: a send to a far device (interleaved wrap-around) must not cross other devices' ops
        axes.add_collection(LineCollection(_latency_segments(simulation), colors=LATENCY_COLOR, linewidths=0.6,
                                           alpha=0.6, zorder=1, gid="p2p-latency"))
        handles.append(Line2D([], [], color=LATENCY_COLOR, linewidth=0.8, label=f"p2p latency {problem.p2p_time:g}"))

    axes.set_ylim(p - 0.5, -0.5)
    axes.set_yticks(range(p), [f"device {d}" for d in range(p)] if p <= 16 else [str(d) for d in range(p)],
                    fontsize=8 if p <= 16 else 7)
    axes.tick_params(axis="y", length=0)
    axes.set_xlim(0, makespan)
    axes.set_xlabel("time")
    if p > 16:
        axes.set_ylabel("device")
    _style_axes(axes)
    legend_title = "lighter shade = earlier chunk on the device" if v > 1 else None
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=8,
                  title=legend_title, title_fontsize=7)
    axes.set_title(title or (
        f"{_caption(simulation)} | makespan {makespan:.4g}, bubble {simulation.bubble_rate:.1%}, "
        f"ZB bubble {simulation.zb_bubble_rate:.1%}"
    ), fontsize=10)
    _freeze_layout(figure)
    _label_boxes(axes, boxes, v)
    return _finish(figure, path)


def plot_memory(simulation: Simulation, path: str | Path | None = None, *, title: str | None = None):
    """Draw each device's held memory over time as a step plot, one small panel per device
    (devices 0..7 down the first column, 8..15 down the next, ...) on shared axes so devices
    compare at a glance; the memory limit is a dashed red line and each device's peak is marked.
    Writes PNG, SVG or PDF by the extension of `path` when given.

    Returns the matplotlib Figure.
    """
    path = _output_path(path)
    problem = simulation.problem
    p, makespan = problem.num_devices, simulation.makespan
    columns = math.ceil(p / MEMORY_PANEL_ROWS)
    rows = math.ceil(p / columns)
    figure, panels = plt.subplots(rows, columns, sharex=True, sharey=True, squeeze=False, dpi=DPI,
                                  figsize=(9.0 if columns == 1 else min(MAX_WIDTH_IN, 5.0 * columns), 1.3 + 1.0 * rows),
                                  layout="constrained")
    limits = problem.memory_limit or (None,) * p
    peaks = simulation.peak_memory
    over_limit = {violation.device for violation in simulation.violations}
    origin = _time_origin(simulation)
    for device, axes in enumerate(panels.flatten(order="F")):
        if device >= p:
            axes.set_visible(False)
            continue
        if device == p - 1 or device % rows == rows - 1:  # the lowest panel of its column
            axes.set_xlabel("time", fontsize=9)
            axes.tick_params(axis="x", labelbottom=True)
        times, levels = simulation.memory_steps[device]
        times = np.concatenate(([0.0], times - origin, [makespan]))
        levels = np.concatenate(([0.0], levels, levels[-1:]))
        axes.fill_between(times, levels, step="post", color=MEMORY_COLOR, alpha=0.2, linewidth=0)
        axes.step(times, levels, where="post", color=MEMORY_COLOR, linewidth=1.0, gid=f"memory-device-{device}")
        peak, limit = peaks[device], limits[device]
        over = device in over_limit
        peak_at = times[np.argmax(levels)]
        axes.plot([peak_at], [peak], marker="v", markersize=5, color=LIMIT_COLOR if over else "black",
                  linestyle="none", gid=f"memory-peak-{device}")
        if limit is not None:
            axes.axhline(limit, color=LIMIT_COLOR, linestyle="--", linewidth=1.0, gid=f"memory-limit-{device}")
        axes.text(0.01, 0.94, f"device {device}", transform=axes.transAxes, ha="left", va="top", fontsize=8)
        axes.text(0.99, 0.94, f"peak {peak:g}" + (f" > limit {limit:g}" if over else ""), transform=axes.transAxes,
                  ha="right", va="top", fontsize=8, color=LIMIT_COLOR if over else "black")
        axes.tick_params(labelsize=7)
        _style_axes(axes)
    top = max([*peaks, *(limit for limit in limits if limit is not None)])
    panels[0, 0].set_ylim(0, 1.35 * top)
    panels[0, 0].set_xlim(0, makespan)
    figure.supylabel("memory held", fontsize=9)
    handles = [Line2D([], [], color=MEMORY_COLOR, label="memory held"),
               Line2D([], [], color="black", marker="v", linestyle="none", label="peak")]
    if problem.memory_limit is not None:
        handles.append(Line2D([], [], color=LIMIT_COLOR, linestyle="--", label="memory limit"))
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=8)
    busiest = int(np.argmax(peaks))
    figure.suptitle(title or f"{_caption(simulation)} | peak memory {peaks[busiest]:g} (device {busiest})",
                    fontsize=10)
    return _finish(figure, path)


def plot_comparison(comparison, path: str | Path | None = None, *, title: str | None = None):
    """Two horizontal bar panels, one bar per schedule in the table's order (shortest makespan on
    top): the makespan with its gap to the lower bound (dotted line), and the peak memory (highest
    over the devices) against the memory limit (dashed red line). A schedule over its memory limit
    is red, hatched and named in red: a fast schedule that does not fit is no answer.
    `comparison` is a `zbopt.compare.Comparison` or its rows. Writes PNG, SVG or PDF by the
    extension of `path` when given.

    Returns the matplotlib Figure.
    """
    path = _output_path(path)
    rows = list(getattr(comparison, "rows", comparison))
    problem, lower_bound = rows[0].simulation.problem, rows[0].lower_bound
    limits = sorted(set(problem.memory_limit or ()))
    over = [not row.within_memory_limit for row in rows]
    positions = np.arange(len(rows))
    figure, (time_axes, memory_axes) = plt.subplots(1, 2, sharey=True, figsize=(11.0, 1.6 + 0.3 * len(rows)),
                                                    dpi=DPI, layout="constrained")
    panels = (
        (time_axes, "makespan", [row.makespan for row in rows], [lower_bound],
         [f"{row.makespan:.5g}  (gap {row.gap:.1%})" for row in rows]),
        (memory_axes, "peak memory (highest device)", [row.peak_memory for row in rows], limits,
         [f"{row.peak_memory:g}" + ("  over limit" if o else "") for row, o in zip(rows, over, strict=True)]),
    )
    for axes, label, values, references, texts in panels:
        bars = axes.barh(positions, values, height=0.7, color=[LIMIT_COLOR if o else BAR_COLOR for o in over],
                         gid=f"bars-{label.split()[0]}")
        for bar, o in zip(bars, over, strict=True):
            if o:
                bar.set_hatch("///")
                bar.set_edgecolor("white")
        # on white, so the lower-bound and limit lines pass behind the numbers instead of through them
        axes.bar_label(bars, texts, padding=3, fontsize=8, zorder=4,
                       bbox=dict(facecolor="white", edgecolor="none", pad=0.5))
        axes.set_xlim(0, 1.3 * max([*values, *references]))
        axes.set_xlabel(label, fontsize=9)
        axes.tick_params(labelsize=8)
        _style_axes(axes)
    time_axes.axvline(lower_bound, color="black", linestyle=":", linewidth=1.2, gid="lower-bound")
    for limit in limits:
        memory_axes.axvline(limit, color=LIMIT_COLOR, linestyle="--", linewidth=1.2, gid="memory-limit")
    time_axes.set_yticks(positions, [row.name + (f" ({row.status})" if row.status else "") for row in rows])
    time_axes.set_ylim(len(rows) - 0.5, -0.5)
    time_axes.tick_params(axis="y", length=0)
    for tick, o in zip(time_axes.get_yticklabels(), over, strict=True):
        if o:
            tick.set_color(LIMIT_COLOR)
    handles = [Line2D([], [], color="black", linestyle=":", label=f"lower bound {lower_bound:.5g}")]
    if limits:
        handles.append(Patch(facecolor=BAR_COLOR, label="within memory limit"))
        if any(over):  # the key only for what the chart shows
            handles.append(Patch(facecolor=LIMIT_COLOR, edgecolor="white", hatch="///", label="over memory limit"))
        handles.append(Line2D([], [], color=LIMIT_COLOR, linestyle="--", label="memory limit"))
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=8)
    figure.suptitle(title or f"Schedules compared on {problem.describe()}", fontsize=10)
    return _finish(figure, path)


def _output_path(path: str | Path | None) -> Path | None:
    """Check the extension before drawing, so a bad path fails fast."""
    return None if path is None else check_figure_path(path)


def _finish(figure, path: Path | None):
    """Write the figure when a path is given (and release it); return it either way."""
    if path is not None:
        figure.savefig(path)
        plt.close(figure)
    return figure


def _caption(simulation: Simulation) -> str:
    problem = simulation.problem
    iterations = f", {problem.iterations} iterations" if problem.iterations > 1 else ""
    return (f"{simulation.schedule.name or 'schedule'}: p={problem.num_devices}, m={problem.num_microbatches}, "
            f"v={problem.chunks_per_device}{iterations}")


def _style_axes(axes) -> None:
    for spine in ("top", "right"):
        axes.spines[spine].set_visible(False)


def _time_origin(simulation: Simulation) -> float:
    """Plots start at the first op's start, so the time axis runs from 0 to the makespan."""
    return float(simulation.start.min())


def _gantt_size(simulation: Simulation) -> tuple[float, float]:
    """Width so the shortest op has room for its microbatch number, up to MAX_WIDTH_IN (denser
    charts thin their labels); height grows with the devices, up to MAX_HEIGHT_IN."""
    problem = simulation.problem
    slots = simulation.makespan / min(simulation.table.duration)
    digits = len(str(problem.total_microbatches - 1))
    width = min(MAX_WIDTH_IN, max(9.0, 2.0 + 0.11 * (digits + 1) * slots))
    height = min(MAX_HEIGHT_IN, 1.5 + 0.42 * problem.num_devices)
    return width, height


def _box(begin: float, width: float, device: int, height: float) -> list[tuple[float, float]]:
    top, bottom = device - height / 2, device + height / 2
    return [(begin, top), (begin + width, top), (begin + width, bottom), (begin, bottom)]


def _op_boxes(simulation: Simulation) -> dict[tuple[str, int], tuple[np.ndarray, ...]]:
    """Per (kind, chunk), the arrays (begin, width, device, microbatch) of its ops' boxes."""
    problem, table = simulation.problem, simulation.table
    chunk_of = {stage: chunk for stages in problem.stages_of_device for chunk, stage in enumerate(stages)}
    ops = table.ops()
    group = [(op.kind, chunk_of[op.stage]) for op in ops]
    microbatch = np.array([op.microbatch for op in ops])
    begin = simulation.start - _time_origin(simulation)
    width = np.asarray(table.duration)
    device = np.asarray(table.device)
    members: dict[tuple[str, int], list[int]] = {}
    for index, key in enumerate(group):
        members.setdefault(key, []).append(index)
    return {key: (begin[mine], width[mine], device[mine], microbatch[mine]) for key, mine in members.items()}


def _latency_segments(simulation: Simulation) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Per dependency across devices, a segment from the producer's end at the edge of its box
    to (end + latency) at the near edge of the consumer's box."""
    table = simulation.table
    origin = _time_origin(simulation)
    segments = []
    for consumer, (producer, latency) in enumerate(zip(table.predecessor, table.latency, strict=True)):
        if producer < 0 or table.device[producer] == table.device[consumer]:
            continue
        source_device, target_device = table.device[producer], table.device[consumer]
        sent = float(simulation.end[producer]) - origin
        toward = 1 if target_device > source_device else -1
        segments.append(((sent, source_device + toward * BOX_HEIGHT / 2),
                         (sent + latency, target_device - toward * BOX_HEIGHT / 2)))
    return segments


def _freeze_layout(figure) -> None:
    """Run the constrained layout once and keep it, so label sizes measured now hold when saved."""
    figure.draw_without_rendering()
    figure.set_layout_engine("none")


def _label_boxes(axes, boxes: dict[tuple[str, int], tuple[np.ndarray, ...]], chunks: int) -> None:
    """Write each op's microbatch number in its box where the text, measured by the renderer,
    fits with a margin on every side; skipping the rest is what keeps dense charts legible."""
    figure = axes.figure
    renderer = figure.canvas.get_renderer()
    frame = axes.get_window_extent(renderer)
    x_low, x_high = axes.get_xlim()
    y_low, y_high = axes.get_ylim()
    pixels_per_time = frame.width / (x_high - x_low)
    box_pixels = BOX_HEIGHT * frame.height / abs(y_high - y_low)
    points_per_pixel = 72 / figure.dpi
    fontsize = min(MAX_LABEL_POINTS, 0.5 * box_pixels * points_per_pixel)
    if fontsize < MIN_LABEL_POINTS:
        return
    font = FontProperties(size=fontsize)
    margin = 0.25 * fontsize / points_per_pixel
    text_width: dict[str, float] = {}
    for (kind, chunk), (begin, width, device, microbatch) in boxes.items():
        color = _text_color(chunk_color(kind, chunk, chunks))
        for b, w, d, j in zip(begin, width, device, microbatch, strict=True):
            text = str(j)
            if text not in text_width:
                text_width[text] = renderer.get_text_width_height_descent(text, font, ismath=False)[0]
            if text_width[text] + 2 * margin <= w * pixels_per_time:
                axes.text(b + w / 2, d, text, ha="center", va="center", fontproperties=font, color=color, zorder=3)


def _text_color(background: tuple[float, float, float]) -> str:
    """White on dark boxes, near-black on the light shades of earlier chunks."""
    red, green, blue = background
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.6 else "#1a1a1a"


FRONTIER_COLOR = "#3b6fb6"
HEURISTIC_COLOR = "#b03a2e"
LABEL_DISTANCES = (8, 16, 28, 42, 60, 80, 110)  # points from a heuristic's marker to its label, tried in order
LABEL_DIRECTIONS = ((1, 0), (1, 1), (1, -1), (0, 1), (0, -1), (-1, 0), (-1, 1), (-1, -1))
MARKER_CLEARANCE = 7.0  # pixels around a marker that no label may cover
LABEL_GAP = 5.0  # pixels between two labels, so that two names never read as one label


def plot_frontier(frontier, path: str | Path | None = None, *, title: str | None = None):
    """Draw the makespan against the memory limit: the optimizer's makespan at each limit of the
    sweep as a staircase (a limit's schedule also runs under every larger limit, so each step holds
    until the next limit), filled markers where optimality is proven, hollow ones and a band down
    to the lower bound where it is not; each registered heuristic is a point at its own peak memory
    and makespan, labelled with a leader line (heuristics sharing a point share one label; labels
    are placed, measured by the renderer, clear of each other, the markers and the staircase).
    `frontier` is a `zbopt.frontier.Frontier`. Writes PNG, SVG or PDF by the extension of `path`.

    Returns the matplotlib Figure.
    """
    path = _output_path(path)
    problem, points = frontier.problem, frontier.points
    limits = np.array([point.memory_limit for point in points])
    makespans = np.array([math.nan if point.makespan is None else point.makespan for point in points])
    lower = np.array([point.lower_bound for point in points])
    proven = np.array([point.status == "optimal" for point in points])
    groups = _heuristic_groups(frontier.heuristics)
    step = float(np.min(np.diff(limits))) if len(limits) > 1 else 1.0
    left = min([limits[0], *(x for x, _, _ in groups)]) - step / 2
    right = max([limits[-1], *(x for x, _, _ in groups)]) + step  # room for the labels of the rightmost points
    # each limit's value holds up to the next limit, the last one up to the right edge
    stairs_x, stairs_y = np.append(limits, right), np.append(makespans, makespans[-1])

    figure, axes = plt.subplots(figsize=(9.0, 5.5), dpi=DPI, layout="constrained")
    handles = [Line2D([], [], color=FRONTIER_COLOR, marker="o", label="optimal makespan (proven)")]
    if not proven.all():
        axes.fill_between(stairs_x, np.append(lower, lower[-1]), stairs_y, step="post", color=FRONTIER_COLOR,
                          alpha=0.18, linewidth=0, gid="frontier-gap")
        axes.plot(limits[~proven], makespans[~proven], "o", color=FRONTIER_COLOR, markerfacecolor="white",
                  zorder=3, gid="frontier-unproven")
        handles += [Line2D([], [], color=FRONTIER_COLOR, marker="o", markerfacecolor="white", linestyle="none",
                           label="best found, not proven optimal"),
                    Patch(facecolor=FRONTIER_COLOR, alpha=0.18, label="lower bound to best found")]
    axes.step(stairs_x, stairs_y, where="post", color=FRONTIER_COLOR, linewidth=1.6, zorder=2, gid="frontier")
    axes.plot(limits[proven], makespans[proven], "o", color=FRONTIER_COLOR, zorder=3, gid="frontier-optimal")
    if groups:
        axes.plot([x for x, _, _ in groups], [y for _, y, _ in groups], "D", color=HEURISTIC_COLOR, markersize=5,
                  linestyle="none", zorder=4, gid="heuristics")
        handles.append(Line2D([], [], color=HEURISTIC_COLOR, marker="D", markersize=5, linestyle="none",
                              label="heuristic, at its own peak memory"))

    values = [*makespans[~np.isnan(makespans)], *lower, *(y for _, y, _ in groups)]
    low, high = min(values), max(values)
    axes.set_xlim(left, right)
    axes.set_ylim(low - 0.08 * (high - low), high + 0.08 * (high - low))
    unit = ("1 = one microbatch's activations on one stage" if set(problem.activation_memory) == {1.0}
            else "the problem's memory units")
    axes.set_xlabel(f"memory per device: the limit (frontier) or the peak (heuristics); {unit}", fontsize=9)
    axes.set_ylabel("makespan (the problem's time units)", fontsize=9)
    axes.tick_params(labelsize=8)
    axes.grid(color=LANE_COLOR, linewidth=0.8)
    axes.set_axisbelow(True)
    _style_axes(axes)
    figure.legend(handles=handles, loc="outside lower center", ncol=2 if len(handles) > 3 else len(handles),
                  frameon=False, fontsize=8)
    backward = "split" if problem.split_backward else "fused"
    axes.set_title(title or (f"memory–makespan frontier | p={problem.num_devices}, m={problem.num_microbatches}, "
                             f"v={problem.chunks_per_device}, {backward} backward | CP-SAT, "
                             f"{frontier.time_limit:g} s per limit"), fontsize=10)
    _freeze_layout(figure)
    _label_heuristics(axes, groups, stairs_x, stairs_y)
    return _finish(figure, path)


def _heuristic_groups(heuristics) -> list[tuple[float, float, str]]:
    """(peak memory, makespan, "name, name, ...") per distinct point: heuristics that coincide
    (1f1b and its 2BW variant, say) are one marker with one label."""
    names: dict[tuple[float, float], list[str]] = {}
    for point in heuristics:
        names.setdefault((round(point.peak_memory, 9), round(point.makespan, 9)), []).append(point.name)
    return [(x, y, ", ".join(group)) for (x, y), group in names.items()]


def _label_heuristics(axes, groups: list[tuple[float, float, str]], stairs_x: np.ndarray, stairs_y: np.ndarray):
    """Label each heuristic point at the nearest offset (LABEL_DISTANCES × LABEL_DIRECTIONS) where
    the text, measured by the renderer, stays inside the axes, clear of every marker, the staircase
    and the labels placed before it, and nearer its own point than any other heuristic's (so no
    label reads as another point's); a leader line joins it to its point. A label that fits
    nowhere still goes to the nearest offset: overlapping beats missing."""
    renderer = axes.figure.canvas.get_renderer()
    frame = axes.get_window_extent(renderer)
    to_pixels = axes.transData.transform
    clear = MARKER_CLEARANCE
    markers = to_pixels([(x, y) for x, y, _ in groups])
    taken = [Bbox.from_bounds(px - clear, py - clear, 2 * clear, 2 * clear)
             for px, py in [*to_pixels(np.column_stack([stairs_x, stairs_y])[:-1]), *markers]]
    corners = to_pixels(np.column_stack([np.repeat(stairs_x, 2)[1:], np.repeat(stairs_y, 2)[:-1]]))
    lows, highs = np.minimum(corners[:-1], corners[1:]) - 1.5, np.maximum(corners[:-1], corners[1:]) + 1.5
    taken += [Bbox([low, high]) for low, high in zip(lows, highs, strict=True) if np.isfinite([*low, *high]).all()]
    offsets = [(dx * distance, dy * distance * 0.6) for distance in LABEL_DISTANCES for dx, dy in LABEL_DIRECTIONS]
    for index, (x, y, text) in enumerate(groups):
        for offset in offsets:
            label = _heuristic_label(axes, text, (x, y), offset)
            box = _text_box(label, renderer)
            gaps = _box_distances(box, markers)
            if (frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
                    and not any(box.overlaps(other) for other in taken) and gaps[index] <= gaps.min()):
                break
            label.remove()
        else:  # nowhere clear: the nearest offset, since an overlapping label beats a missing one
            box = _text_box(_heuristic_label(axes, text, (x, y), offsets[0]), renderer)
        taken.append(box.padded(LABEL_GAP))


def _box_distances(box: Bbox, points: np.ndarray) -> np.ndarray:
    """Pixel distance from the box to each point (0 inside)."""
    dx = np.maximum(0.0, np.maximum(box.x0 - points[:, 0], points[:, 0] - box.x1))
    dy = np.maximum(0.0, np.maximum(box.y0 - points[:, 1], points[:, 1] - box.y1))
    return np.hypot(dx, dy)


def _heuristic_label(axes, text: str, point: tuple[float, float], offset: tuple[float, float]):
    """The text `offset` points from `point`, anchored on the side facing the point, with a thin
    leader line to it."""
    dx, dy = offset
    return axes.annotate(
        text, point, xytext=offset, textcoords="offset points", fontsize=7.5, color=HEURISTIC_COLOR, zorder=5,
        ha="left" if dx > 0 else "right" if dx < 0 else "center",
        va="bottom" if dy > 0 else "top" if dy < 0 else "center",
        arrowprops=dict(arrowstyle="-", color=HEURISTIC_COLOR, linewidth=0.5, shrinkA=1, shrinkB=4),
    )


def _text_box(label, renderer) -> Bbox:
    """Where an annotation's text lies in pixels, without its leader line (which reaches the point)."""
    label.update_positions(renderer)
    return Text.get_window_extent(label, renderer)
