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
