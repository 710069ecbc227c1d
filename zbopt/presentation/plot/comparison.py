"""Comparison bars: each schedule's makespan (or iteration time) against the lower bound, its peak
memory against the limit."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from zbopt.presentation.plot.style import DPI, _finish, _output_path, _style_axes, _title, palette, styled

__all__ = ["plot_comparison"]


@styled
def plot_comparison(comparison, path: str | Path | None = None, *, title: str | None = None):
    """Two horizontal bar panels, one bar per schedule in the table's order (shortest makespan on
    top): the makespan (the iteration time, where the problem has the iteration's ends) with its
    gap to the lower bound (dotted line; neither without bounds), and
    the peak memory (highest over the devices) against the memory limit (dashed red line). A
    schedule over its memory limit is red, hatched and named in red: a fast schedule that does not
    fit is no answer.
    `comparison` is a `zbopt.planning.comparison.Comparison` or its rows. Writes PNG, SVG or PDF by the
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
    bounds = [] if lower_bound is None else [lower_bound]  # a comparison without bounds draws no gap
    # the time the rows are ranked and the bound measured by: the iteration's, where the problem has its ends
    timed, times = ("iteration time", [row.iteration_time for row in rows]) if problem.iteration_ends else \
        ("makespan", [row.makespan for row in rows])
    panels = (
        (time_axes, timed, times, bounds,
         [f"{time:.5g}" + ("" if row.gap is None else f"  (gap {row.gap:.1%})") for time, row in zip(times, rows,
                                                                                                  strict=True)]),
        (memory_axes, "peak memory (highest device)", [row.peak_memory for row in rows], limits,
         [f"{row.peak_memory:g}" + ("  over limit" if o else "") for row, o in zip(rows, over, strict=True)]),
    )
    for axes, label, values, references, texts in panels:
        bars = axes.barh(positions, values, height=0.7, color=[palette().limit if o else palette().bar for o in over],
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
    for bound in bounds:
        time_axes.axvline(bound, color="black", linestyle=":", linewidth=1.2, gid="lower-bound")
    for limit in limits:
        memory_axes.axvline(limit, color=palette().limit, linestyle="--", linewidth=1.2, gid="memory-limit")
    time_axes.set_yticks(positions, [row.name + (f" ({row.status})" if row.status else "") for row in rows])
    time_axes.set_ylim(len(rows) - 0.5, -0.5)
    time_axes.tick_params(axis="y", length=0)
    for tick, o in zip(time_axes.get_yticklabels(), over, strict=True):
        if o:
            tick.set_color(palette().limit)
    if handles := _legend_handles(bounds, limits, any(over)):  # no bound and no limit: nothing to key
        figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=8)
    if heading := _title(title, f"Schedules compared on {problem.describe()}"):
        figure.suptitle(heading, fontsize=10, wrap=True)
    return _finish(figure, path)


def _legend_handles(bounds: list[float], limits: list[float], over: bool) -> list:
    """The key, only for what the chart shows: the lower bound, the limit and the rows within or over it."""
    handles = [Line2D([], [], color="black", linestyle=":", label=f"lower bound {bound:.5g}") for bound in bounds]
    if limits:
        handles.append(Patch(facecolor=palette().bar, label="within memory limit"))
        if over:
            handles.append(Patch(facecolor=palette().limit, edgecolor="white", hatch="///", label="over memory limit"))
        handles.append(Line2D([], [], color=palette().limit, linestyle="--", label="memory limit"))
    return handles
