"""The one plotter: Gantt charts of simulated schedules (matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from zbopt.errors import ZboptError
from zbopt.problem import BACKWARD, FORWARD, FUSED_BACKWARD, WEIGHT
from zbopt.simulate import Simulation

FIGURE_FORMATS = (".png", ".svg", ".pdf")
KIND_COLORS = {FORWARD: "#3b6fb6", BACKWARD: "#e8862a", WEIGHT: "#3a9a4a", FUSED_BACKWARD: "#8b5bb3"}
KIND_NAMES = {FORWARD: "F forward", BACKWARD: "B input grad", WEIGHT: "W weight grad", FUSED_BACKWARD: "BW backward"}
LANE_COLOR = "#ececec"
DPI = 120


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


def plot_gantt(simulation: Simulation, path: str | Path | None = None, *, title: str | None = None):
    """Draw one row per device, one box per op, microbatch numbers where they fit; idle time is
    the grey lane showing through. Writes PNG, SVG or PDF by the extension of `path` when given.

    Returns the matplotlib Figure.
    """
    if path is not None:
        path = check_figure_path(path)
    problem, table = simulation.problem, simulation.table
    p, v = problem.num_devices, problem.chunks_per_device
    origin = float(simulation.start.min())
    makespan = simulation.makespan
    width_in = min(24.0, max(9.0, 0.6 * problem.total_microbatches * v ** 0.5 + 3))
    height_in = min(16.0, 1.4 + 0.42 * p)
    figure, axes = plt.subplots(figsize=(width_in, height_in), dpi=DPI)
    axes.set_facecolor("white")
    for device in range(p):
        axes.broken_barh([(0, makespan)], (device - 0.45, 0.9), facecolors=LANE_COLOR, zorder=0)

    chunk_of = {stage: stages.index(stage) for stages in problem.stages_of_device for stage in stages}
    groups: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    labels: list[tuple[float, float, int, int]] = []  # x center, width, device, microbatch
    for device, order in enumerate(simulation.schedule.orders):
        for op in order:
            index = table.index(op)
            begin = float(simulation.start[index]) - origin
            width = table.duration[index]
            groups.setdefault((device, op.kind, chunk_of[op.stage]), []).append((begin, width))
            labels.append((begin + width / 2, width, device, op.microbatch))
    for (device, kind, chunk), boxes in groups.items():
        axes.broken_barh(boxes, (device - 0.4, 0.8), facecolors=[chunk_color(kind, chunk, v)],
                         edgecolors="white", linewidth=0.4, zorder=2)

    axis_px = width_in * DPI * 0.86
    row_px = height_in * DPI * 0.75 / p
    fontsize = max(4.0, min(8.0, row_px * 0.45 * 72 / DPI))
    char_px = fontsize * 0.62 * DPI / 72
    for center, width, device, microbatch in labels:
        text = str(microbatch)
        if width / makespan * axis_px >= (len(text) + 0.6) * char_px:
            axes.text(center, device, text, ha="center", va="center", fontsize=fontsize, color="white", zorder=3)

    axes.set_ylim(p - 0.5, -0.5)
    axes.set_yticks(range(p), [f"device {d}" for d in range(p)] if p <= 16 else [str(d) for d in range(p)])
    axes.set_xlim(0, makespan)
    axes.set_xlabel("time")
    for spine in ("top", "right"):
        axes.spines[spine].set_visible(False)
    handles = [Patch(facecolor=KIND_COLORS[kind], label=KIND_NAMES[kind]) for kind in problem.kinds]
    handles.append(Patch(facecolor=LANE_COLOR, label="idle"))
    legend_title = "lighter shade = earlier chunk on the device" if v > 1 else None
    figure.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=8,
                  title=legend_title, title_fontsize=7)
    name = simulation.schedule.name or "schedule"
    axes.set_title(title or (
        f"{name}: p={p}, m={problem.num_microbatches}, v={v}"
        + (f", {problem.iterations} iterations" if problem.iterations > 1 else "")
        + f" | makespan {makespan:.4g}, bubble {simulation.bubble_rate:.1%}, "
        f"ZB bubble {simulation.zb_bubble_rate:.1%}"
    ), fontsize=10)
    figure.tight_layout(rect=(0, (0.5 if v > 1 else 0.35) / height_in, 1, 1))
    if path is not None:
        figure.savefig(path)
        plt.close(figure)
    return figure
