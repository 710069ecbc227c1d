"""Memory timelines: each device's held memory over time against its limit, one panel per device."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from zbopt.core.simulation import Simulation
from zbopt.presentation.plot.style import (
    DPI,
    MAX_WIDTH_IN,
    _caption,
    _finish,
    _output_path,
    _style_axes,
    _title,
    palette,
    styled,
)

__all__ = ["MEMORY_PANEL_ROWS", "plot_memory"]

MEMORY_PANEL_ROWS = 8  # more devices than this go into further columns of panels


@styled
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
    origin = simulation.origin
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
        axes.fill_between(times, levels, step="post", color=palette().memory, alpha=0.2, linewidth=0)
        axes.step(times, levels, where="post", color=palette().memory, linewidth=1.0, gid=f"memory-device-{device}")
        peak, limit = peaks[device], limits[device]
        over = device in over_limit
        peak_at = times[np.argmax(levels)]
        axes.plot([peak_at], [peak], marker="v", markersize=5, color=palette().limit if over else "black",
                  linestyle="none", gid=f"memory-peak-{device}")
        if limit is not None:
            axes.axhline(limit, color=palette().limit, linestyle="--", linewidth=1.0, gid=f"memory-limit-{device}")
        axes.text(0.01, 0.94, f"device {device}", transform=axes.transAxes, ha="left", va="top", fontsize=8)
        axes.text(0.99, 0.94, f"peak {peak:g}" + (f" > limit {limit:g}" if over else ""), transform=axes.transAxes,
                  ha="right", va="top", fontsize=8, color=palette().limit if over else "black")
        axes.tick_params(labelsize=7)
        _style_axes(axes)
    top = max([*peaks, *(limit for limit in limits if limit is not None)])
    panels[0, 0].set_ylim(0, 1.35 * top)
    panels[0, 0].set_xlim(0, makespan)
    figure.supylabel("memory held", fontsize=9)
    handles = [Line2D([], [], color=palette().memory, label="memory held"),
               Line2D([], [], color="black", marker="v", linestyle="none", label="peak")]
    if problem.memory_limit is not None:
        handles.append(Line2D([], [], color=palette().limit, linestyle="--", label="memory limit"))
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=8)
    busiest = int(np.argmax(peaks))
    if heading := _title(title, f"{_caption(simulation)} | peak memory {peaks[busiest]:g} (device {busiest})"):
        figure.suptitle(heading, fontsize=10, wrap=True)
    return _finish(figure, path)
