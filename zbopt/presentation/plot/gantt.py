"""Gantt charts: one row per device, one box per op, microbatch numbers where the renderer finds room;
with offloads, two thin copy lanes under each device's compute (device-to-host, host-to-device)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import patheffects
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from zbopt.core.kinds import COPY_KINDS, RECOMPUTE, REGATHER, SIDE_KINDS
from zbopt.core.ops import COMPUTE_LANE
from zbopt.core.problem.mechanisms import compute_slowed
from zbopt.core.simulation import Simulation
from zbopt.core.simulation.ends import END_NAMES
from zbopt.presentation.plot.style import (
    DPI,
    KIND_NAMES,
    MAX_WIDTH_IN,
    RECOMPUTE_HATCH,
    _caption,
    _finish,
    _freeze_layout,
    _kind_handles,
    _output_path,
    _style_axes,
    _title,
    chunk_color,
    palette,
    styled,
)

__all__ = ["BOX_HEIGHT", "COMMUNICATION", "MAX_HEIGHT_IN", "MAX_LABEL_POINTS", "MIN_LABEL_POINTS", "plot_gantt"]

MAX_HEIGHT_IN = 12.0
BOX_HEIGHT = 0.8  # of a device row; the lane behind it is 0.9, leaving a white gap between rows
# (offset from the row's centre, height) of compute boxes and of each copy lane, when there are copies
COMMUNICATION = "communication"  # the lane of the iteration's ends: unshards and gradient reductions
LANE_PITCH, LANE_HEIGHT = 0.12, 0.11  # each thin lane under a device's compute boxes, and its gap
MIN_LABEL_POINTS, MAX_LABEL_POINTS = 5.0, 8.0


@styled
def plot_gantt(simulation: Simulation, path: str | Path | None = None, *, title: str | None = None,
               show_latency: bool = False):
    """Draw one row per device, one box per op, microbatch numbers where they fit; idle time is
    the grey lane showing through. With `show_latency` (and a problem with p2p_time > 0), a thin
    line per cross-device dependency runs from the producer's end to the moment its data arrives
    on the consumer's device. Offloads (O) and reloads (L) run on two thin copy lanes under the
    device's compute boxes, re-gathers (G) on a thin all-gather lane; the iteration's ends
    (`Simulation.ends`) on a communication lane under them, the optimizer step on the compute
    row. Writes PNG, SVG or PDF by the extension of `path` when given.

    Returns the matplotlib Figure.
    """
    path = _output_path(path)
    problem = simulation.problem
    figure, axes = plt.subplots(figsize=_gantt_size(simulation), dpi=DPI, layout="constrained")
    boxes = _draw_ops(axes, simulation)
    handles = _draw_extras(axes, simulation, show_latency)
    _device_axes(axes, simulation)
    # with v chunks, one column per kind and one row per chunk's shade: matplotlib fills columns in
    # turn, so blank keys pad the list to whole columns of v
    v = problem.chunks_per_device
    handles += [Patch(visible=False, label=" ")] * (-len(handles) % v)
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles) // v, frameon=False, fontsize=8)
    iteration = f", iteration {simulation.iteration_time:.4g}" if simulation.ends is not None else ""
    if heading := _title(title, f"{_caption(simulation)} | makespan {simulation.makespan:.4g}{iteration}, bubble "
                                f"{simulation.bubble_rate:.1%}, ZB bubble {simulation.zb_bubble_rate:.1%}"):
        axes.set_title(heading, fontsize=10, wrap=True)
    _freeze_layout(figure)
    step = _label_boxes(axes, {key: value for key, value in boxes.items() if key[0] not in SIDE_KINDS}, v)
    if step > 1:
        numbered = range(0, problem.total_microbatches, step)
        axes.set_xlabel(f"time (numbered: microbatches {', '.join(map(str, numbered[:3]))}"
                        f"{', …' if len(numbered) > 3 else ''})" if len(numbered) > 1 else
                        "time (numbered: microbatch 0)")
    return _finish(figure, path)


def _draw_ops(axes, simulation: Simulation) -> dict:
    """Each device's grey lane (idle time shows through), then one box per op, a collection per
    kind and chunk; returns the boxes (`_op_boxes`) for their labels."""
    v = simulation.problem.chunks_per_device
    lanes = [_box(0.0, simulation.iteration_time, device, 0.9) for device in range(simulation.problem.num_devices)]
    axes.add_collection(PolyCollection(lanes, facecolors=palette().lane, edgecolors="none", zorder=0, gid="idle-lanes"))
    boxes = _op_boxes(simulation)
    for (kind, chunk), (begin, width, row, _, height) in boxes.items():
        rectangles = [_box(b, w, r, h) for b, w, r, h in zip(begin, width, row, height, strict=True)]
        hatch = RECOMPUTE_HATCH if kind == RECOMPUTE else None
        axes.add_collection(PolyCollection(rectangles, facecolors=[chunk_color(kind, chunk, v)], edgecolors="white",
                                           linewidths=0.4, zorder=2, gid=f"ops-{kind}-chunk{chunk}", hatch=hatch))
    return boxes


def _draw_extras(axes, simulation: Simulation, show_latency: bool) -> list:
    """The overlapped pairs' borders and, with `show_latency`, the p2p latency lines; returns the
    legend's keys: the op kinds, then recomputes, copies, pairs, idle and latency where drawn."""
    problem = simulation.problem
    handles = _kind_handles(problem)
    if simulation.table.recomputed:
        handles.append(Patch(facecolor=palette().kinds[RECOMPUTE], edgecolor="white", hatch=RECOMPUTE_HATCH,
                             label=KIND_NAMES[RECOMPUTE]))
    if simulation.table.offloaded:
        handles += [Patch(facecolor=palette().kinds[kind], label=KIND_NAMES[kind]) for kind in COPY_KINDS]
    if simulation.pairs:  # a black border around each pair, as DualPipe's figures draw them
        offset, height = _row(simulation, problem.kinds[0])
        outlines = [_box(simulation.start[head] - simulation.origin, pair.cost,
                         simulation.table.device[head] + offset, height)
                    for pair in simulation.pairs for head in pair.members[:1]]
        axes.add_collection(PolyCollection(outlines, facecolors="none", edgecolors="black", linewidths=0.8, zorder=3,
                                           gid="overlapped-pairs"))
        handles.append(Patch(facecolor="white", edgecolor="black", label="overlapped pair (F over its partner)"))
    handles += _draw_ends(axes, simulation) + _draw_slowed(axes, simulation)
    handles.append(Patch(facecolor=palette().lane, label="idle"))
    if show_latency and problem.p2p_time > 0:
        # under the boxes: a send to a far device (interleaved wrap-around) must not cross other devices' ops
        axes.add_collection(LineCollection(_latency_segments(simulation), colors=palette().latency, linewidths=0.6,
                                           alpha=0.6, zorder=1, gid="p2p-latency"))
        handles.append(Line2D([], [], color=palette().latency, linewidth=0.8,
                              label=f"p2p latency {problem.p2p_time:g}"))
    return handles


def _draw_ends(axes, simulation: Simulation) -> list:
    """The iteration's ends where the problem has them: unshards and gradient reductions on each
    device's communication lane, the optimizer step on its compute row; their legend keys."""
    if simulation.ends is None:
        return []
    placed, origin = simulation.ends.windows(simulation.problem), simulation.origin
    lane, lane_height = _row(simulation, COMMUNICATION)
    row, row_height = _row(simulation, simulation.problem.kinds[0])
    handles = []
    for name in END_NAMES:
        offset, height = (row, row_height) if name == "step" else (lane, lane_height)
        boxes = [_box(window.begin - origin, window.end - window.begin, window.device + offset, height)
                 for window in placed if window.what == name]
        if boxes:
            axes.add_collection(PolyCollection(boxes, facecolors=palette().ends[name], edgecolors="white",
                                               linewidths=0.4, zorder=2, gid=f"ends-{name}"))
            regathers = name == "unshard" and simulation.table.regathered  # one key: both are FSDP's all-gathers
            handles.append(Patch(facecolor=palette().ends[name], label="unshard, G (FSDP all-gather)" if regathers
                                 else END_NAMES[name]))
    return handles


def _draw_slowed(axes, simulation: Simulation) -> list:
    """Dots over each compute op a transfer of its device slowed (`comm_slowdown`: it took longer
    than its cost), and their legend key; nothing where none was."""
    table, problem = simulation.table, simulation.problem
    if not compute_slowed(problem):
        return []
    paired = {member for pair in simulation.pairs for member in pair.members}  # a pair takes its own cost
    taken = simulation.end - simulation.start
    slowed = [index for index in range(table.size) if table.lane[index] == COMPUTE_LANE and index not in paired
              and taken[index] > table.duration[index] * (1 + 1e-9)]
    if not slowed:
        return []
    rows = [_row(simulation, table.kind[index]) for index in slowed]
    dots = [_box(simulation.start[index] - simulation.origin, taken[index], table.device[index] + offset, height)
            for index, (offset, height) in zip(slowed, rows, strict=True)]
    axes.add_collection(PolyCollection(dots, facecolors="none", edgecolors=palette().ends["reduce"], linewidths=0,
                                       zorder=3, hatch="..", gid="slowed-ops"))
    factor = problem.iteration_ends.comm_slowdown
    return [Patch(facecolor="white", edgecolor=palette().ends["reduce"], hatch="..",
                  label=f"slowed by a transfer (x{factor:g} under it)")]


def _device_axes(axes, simulation: Simulation) -> None:
    """One row per device (named, and with its peak memory at the row's end up to 16 devices), time across."""
    p = simulation.problem.num_devices
    axes.set_ylim(p - 0.5, -0.5)
    axes.set_yticks(range(p), [f"device {d}" for d in range(p)] if p <= 16 else [str(d) for d in range(p)],
                    fontsize=8 if p <= 16 else 7)
    axes.tick_params(axis="y", length=0)
    if p <= 16:  # each device's peak memory at its row's end: two schedules of one makespan can differ there
        peaks = axes.twinx()
        peaks.set_ylim(axes.get_ylim())
        peaks.set_yticks(range(p), [f"peak {peak:.4g}" for peak in simulation.peak_memory], fontsize=8)
        peaks.tick_params(axis="y", length=0)
        for spine in peaks.spines.values():
            spine.set_visible(False)
    axes.set_xlim(0, simulation.iteration_time)
    axes.set_xlabel("time")
    if p > 16:
        axes.set_ylabel("device")
    _style_axes(axes)


def _gantt_size(simulation: Simulation) -> tuple[float, float]:
    """Width so the shortest op has room for its microbatch number, up to MAX_WIDTH_IN (denser
    charts thin their labels); height grows with the devices, up to MAX_HEIGHT_IN."""
    problem = simulation.problem
    slots = simulation.iteration_time / min(simulation.table.duration)
    digits = len(str(problem.total_microbatches - 1))
    width = min(MAX_WIDTH_IN, max(9.0, 2.0 + 0.11 * (digits + 1) * slots))
    height = min(MAX_HEIGHT_IN, 1.5 + 0.42 * problem.num_devices)
    return width, height


def _box(begin: float, width: float, center: float, height: float) -> list[tuple[float, float]]:
    top, bottom = center - height / 2, center + height / 2
    return [(begin, top), (begin + width, top), (begin + width, bottom), (begin, bottom)]


def _row(simulation: Simulation, kind: str) -> tuple[float, float]:
    """(offset from its device's row centre, height) of a box of `kind` (an op kind, or
    COMMUNICATION): compute boxes fill the row unless thin lanes go below them, one per copy
    direction where the schedule offloads, one for its re-gathers (the all-gather lane) and one
    for the iteration's ends where the problem has them, LANE_PITCH apart."""
    lanes = [*(COPY_KINDS if simulation.table.offloaded else ()), *((REGATHER,) if simulation.table.regathered else ()),
             *((COMMUNICATION,) if simulation.ends else ())]
    if not lanes:
        return 0.0, BOX_HEIGHT
    top, compute = -BOX_HEIGHT / 2, BOX_HEIGHT - LANE_PITCH * len(lanes)
    if kind not in lanes:
        return top + compute / 2, compute
    return top + compute + 0.085 + LANE_PITCH * lanes.index(kind), LANE_HEIGHT


def _op_boxes(simulation: Simulation) -> dict[tuple[str, int], tuple[np.ndarray, ...]]:
    """Per (kind, chunk), the arrays (begin, width, row centre, microbatch, height) of its ops'
    boxes. An overlapped pair is one box split across: its forward in the upper strip, its
    backward's ops below, each the pair's length."""
    problem, table = simulation.problem, simulation.table
    chunk_of = problem.chunk_of
    ops = table.ops()
    group = [(op.kind, chunk_of[op.stage]) for op in ops]
    microbatch = np.array([op.microbatch for op in ops])
    begin = simulation.start - simulation.origin
    width = np.asarray(table.duration, dtype=float)
    offset = np.array([_row(simulation, kind)[0] for kind in table.kind])
    height = np.array([_row(simulation, kind)[1] for kind in table.kind])
    for pair in simulation.pairs:
        strips = len(pair.members)
        top = offset[pair.members[0]] - height[pair.members[0]] / 2
        strip = height[pair.members[0]] / strips
        for place, member in enumerate(pair.members):
            width[member] = pair.cost
            offset[member] = top + strip * (place + 0.5)
            height[member] = strip
    center = np.asarray(table.device) + offset
    members: dict[tuple[str, int], list[int]] = {}
    for index, key in enumerate(group):
        members.setdefault(key, []).append(index)
    return {key: (begin[mine], width[mine], center[mine], microbatch[mine], height[mine])
            for key, mine in members.items()}


def _latency_segments(simulation: Simulation) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Per dependency across devices, a segment from the producer's end at the edge of its box
    to (end + latency) at the near edge of the consumer's box."""
    table = simulation.table
    origin = simulation.origin
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


def _label_boxes(axes, boxes: dict[tuple[str, int], tuple[np.ndarray, ...]], chunks: int) -> int:
    """Write microbatch numbers on the ops (one font size, set by the tallest boxes) and return the
    step k between labelled microbatches (0: the rows are too thin for any). Where most boxes hold
    their number with a margin on every side, as measured by the renderer, each box that does gets
    it (k = 1). Where most do not (a dense chart), the ops of every k-th microbatch get theirs,
    centred on the box and outlined to read across its neighbours, k the least of `_label_steps`
    that leaves a label's width per k boxes, and a label that would touch the one before it on its
    device's row is left out."""
    figure = axes.figure
    renderer = figure.canvas.get_renderer()
    frame = axes.get_window_extent(renderer)
    x_low, x_high = axes.get_xlim()
    y_low, y_high = axes.get_ylim()
    pixels_per_time = frame.width / (x_high - x_low)
    pixels_per_row = frame.height / abs(y_high - y_low)
    box_pixels = max(float(heights.max()) for *_, heights in boxes.values()) * pixels_per_row
    points_per_pixel = 72 / figure.dpi
    fontsize = min(MAX_LABEL_POINTS, 0.5 * box_pixels * points_per_pixel)
    if fontsize < MIN_LABEL_POINTS:
        return 0
    font = FontProperties(size=fontsize)
    margin = 0.25 * fontsize / points_per_pixel
    text_height = fontsize / points_per_pixel
    text_width: dict[int, float] = {}
    labels = []  # (begin, width, row, microbatch, chunk colour) of every compute box
    for (kind, chunk), (begin, width, row, microbatch, heights) in boxes.items():
        color = chunk_color(kind, chunk, chunks)
        for b, w, r, j, h in zip(begin, width, row, microbatch, heights, strict=True):
            if j not in text_width:
                text_width[j] = renderer.get_text_width_height_descent(str(j), font, ismath=False)[0]
            labels.append((b, w, r, j, h, color))
    fits = [text_width[j] + 2 * margin <= w * pixels_per_time and text_height <= h * pixels_per_row
            for b, w, r, j, h, _ in labels]
    if 2 * sum(fits) >= len(labels):
        for (b, w, r, j, _, color), fit in zip(labels, fits, strict=True):
            if fit:
                axes.text(b + w / 2, r, str(j), ha="center", va="center", fontproperties=font,
                          color=_text_color(color), zorder=3)
        return 1
    box_width = float(np.median([w for _, w, *_ in labels])) * pixels_per_time
    need = max(text_width.values()) + 2 * margin
    step = next(k for k in _label_steps() if k * box_width >= need)
    outline = [patheffects.withStroke(linewidth=2.0, foreground="white")]
    right_edge: dict[int, float] = {}  # per device: an overlapped pair's strips share their row
    for b, w, r, j, _, _ in sorted(labels, key=lambda label: label[0]):
        if j % step:
            continue
        center = (b + w / 2) * pixels_per_time
        if center - text_width[j] / 2 - margin < right_edge.get(round(r), -np.inf):
            continue
        right_edge[round(r)] = center + text_width[j] / 2 + margin
        axes.text(b + w / 2, r, str(j), ha="center", va="center", fontproperties=font, color="#1a1a1a", zorder=3,
                  path_effects=outline)
    return step


def _label_steps():
    """1, 2, 4, 5, 10, 20, 25, 50, 100, ...: steps a reader counts in."""
    yield from (1, 2, 4, 5)
    scale = 10
    while True:
        yield from (scale, 2 * scale, 5 * scale // 2, 5 * scale)
        scale *= 10


def _text_color(background: tuple[float, float, float]) -> str:
    """White on dark boxes, near-black on the light shades of earlier chunks."""
    red, green, blue = background
    return "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.6 else "#1a1a1a"
