"""The memory–makespan frontier: the optimizer's staircase and the heuristics, labelled clear of each other."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from zbopt.presentation.plot.style import (
    DPI,
    _finish,
    _freeze_layout,
    _output_path,
    _style_axes,
    _title,
    palette,
    styled,
)

__all__ = ["BREAK_SHARE", "LABEL_DIRECTIONS", "LABEL_DISTANCES", "LABEL_GAP", "MARKER_CLEARANCE", "plot_frontier"]

LABEL_DISTANCES = (8, 16, 28, 42, 60, 80, 110)  # points from a heuristic's marker to its label, tried in order
LABEL_DIRECTIONS = ((1, 0), (1, 1), (1, -1), (0, 1), (0, -1), (-1, 0), (-1, 1), (-1, -1))
MARKER_CLEARANCE = 7.0  # pixels around a marker that no label may cover
LABEL_GAP = 5.0  # pixels between two labels, so that two names never read as one label
BREAK_SHARE = 0.3  # the y axis breaks where most values would fill less of it than this


@styled
def plot_frontier(frontier, path: str | Path | None = None, *, title: str | None = None):
    """Draw the makespan against the memory limit: the optimizer's makespan at each limit of the
    sweep as a staircase (a limit's schedule also runs under every larger limit, so each step holds
    until the next limit), filled markers where optimality is proven, hollow ones and a band down
    to the lower bound where it is not; each registered heuristic is a point at its own peak memory
    and makespan, labelled with a leader line (heuristics sharing a point share one label; labels
    are placed, measured by the renderer, clear of each other, the markers and the staircase).
    With recomputation or offload allowed, each point says how many activations its schedule
    recomputes or offloads.
    `frontier` is a `zbopt.planning.frontier.Frontier`. Writes PNG, SVG or PDF by the extension of `path`.

    Returns the matplotlib Figure.
    """
    from zbopt.planning.frontier import counted_mechanisms  # here: a Gantt chart must not load the planners and solvers

    path = _output_path(path)
    problem, points = frontier.problem, frontier.points
    limits, makespans, lower, proven = _series(points)
    groups = _heuristic_groups(frontier.heuristics)
    step = float(np.min(np.diff(limits))) if len(limits) > 1 else 1.0
    left = min([limits[0], *(x for x, _, _ in groups)]) - step / 2
    right = max([limits[-1], *(x for x, _, _ in groups)]) + step  # room for the labels of the rightmost points
    # each limit's value holds up to the next limit, the last one up to the right edge
    stairs_x, stairs_y = np.append(limits, right), np.append(makespans, makespans[-1])

    values = [*makespans[~np.isnan(makespans)], *lower, *(y for _, y, _ in groups)]
    ranges = _panel_ranges(values)
    figure, panels = plt.subplots(len(ranges), 1, sharex=True, figsize=(9.0, 5.5), dpi=DPI, layout="constrained",
                                  height_ratios=[1, 3][-len(ranges):], squeeze=False)
    panels = list(panels[:, 0])
    for axes, ((low, high), owned) in zip(panels, ranges, strict=True):
        _draw_frontier(axes, owned, limits, makespans, lower, proven, stairs_x, stairs_y, groups)
        axes.set_xlim(left, right)
        axes.set_ylim(low, high)
        axes.tick_params(labelsize=8)
        axes.grid(color=palette().lane, linewidth=0.8)
        axes.set_axisbelow(True)
        _style_axes(axes)
    if len(panels) > 1:
        _mark_break(*panels)
    marked = counted_mechanisms(problem)
    handles = _legend_handles(proven, bool(groups), marked, frontier.scaled is not None)
    _axis_titles(figure, panels[-1], frontier)  # the bottom panel holds the x axis
    figure.legend(handles=handles, loc="outside lower center", ncol=2 if len(handles) > 3 else len(handles),
                  frameon=False, fontsize=8)
    backward = "split" if problem.split_backward else "fused"
    if heading := _title(title, f"memory–makespan frontier | p={problem.num_devices}, m={problem.num_microbatches}, "
                                f"v={problem.chunks_per_device}, {backward} backward | CP-SAT, "
                                f"{frontier.time_limit:g} s per limit"):
        panels[0].set_title(heading, fontsize=10, wrap=True)
    _freeze_layout(figure)
    owners = [(axes, owned) for axes, (_, owned) in zip(panels, ranges, strict=True)]
    marks = _mechanism_marks(owners, frontier, marked) if marked else []
    for axes, (_, (low, high)) in zip(panels, ranges, strict=True):
        owned = [group for group in groups if low <= group[1] <= high]
        if owned:
            _label_heuristics(axes, owned, stairs_x, stairs_y, marks)
    return _finish(figure, path)


def _series(points) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per point of the sweep: its memory limit, makespan (NaN where none was found), lower bound,
    and whether it is proven optimal."""
    limits = np.array([point.memory_limit for point in points])
    makespans = np.array([math.nan if point.makespan is None else point.makespan for point in points])
    lower = np.array([point.lower_bound for point in points])
    proven = np.array([point.status == "optimal" for point in points])
    return limits, makespans, lower, proven


def _legend_handles(proven: np.ndarray, heuristics: bool, marked: list, scaled: bool) -> list:
    """The legend's keys: the proven staircase, then what is drawn besides it (unproven points and
    their band, heuristics, the mechanisms' counts)."""
    handles = [Line2D([], [], color=palette().frontier, marker="o", label="optimal makespan (proven)")]
    if not proven.all():
        handles += [Line2D([], [], color=palette().frontier, marker="o", markerfacecolor="white", linestyle="none",
                           label="best found, not proven optimal"),
                    Patch(facecolor=palette().frontier, alpha=0.18, label="lower bound to best found")]
    if heuristics:
        handles.append(Line2D([], [], color=palette().heuristic, marker="D", markersize=5, linestyle="none",
                              label="heuristic, at the least factor its peaks fit" if scaled
                              else "heuristic, at its own peak memory"))
    if marked:
        what = {"R": "recomputes", "O": "offloads"}
        handles.append(Line2D([], [], linestyle="none", label=", ".join(f"{letter} k/N" for letter, _ in marked)
                              + ": activations its schedule " + " / ".join(what[letter] for letter, _ in marked)))
    return handles


def _axis_titles(figure, axes, frontier) -> None:
    """Memory across (in the problem's units, or activations where those are 1; with scaled
    per-device limits, the factor of each device's own, which has no unit), makespan (or the
    iteration time, where the problem has the iteration's ends) up."""
    if frontier.scaled is None:
        unit = ("1 = one microbatch's activations on one stage" if set(frontier.problem.activation_memory) == {1.0}
                else "the problem's memory units")
        axes.set_xlabel(f"memory per device: the limit (frontier) or the peak (heuristics); {unit}", fontsize=9)
    else:
        limits = ", ".join(f"{cap:g}" for cap in frontier.scaled)
        axes.set_xlabel(f"memory limit: factor × each device's own ({limits}); a heuristic at the least factor "
                        "its peaks fit", fontsize=9)
    timed = "iteration time" if frontier.problem.iteration_ends is not None else "makespan"
    figure.supylabel(f"{timed} (the problem's time units)", fontsize=9)


def _draw_frontier(axes, owned, limits, makespans, lower, proven, stairs_x, stairs_y, groups) -> None:
    """The staircase, the band down to the lower bound where unproven, and the markers of the
    frontier and the heuristics whose makespans lie in the `owned` range."""
    low, high = owned
    shown = (low <= makespans) & (makespans <= high)
    if not proven.all():
        axes.fill_between(stairs_x, np.append(lower, lower[-1]), stairs_y, step="post", color=palette().frontier,
                          alpha=0.18, linewidth=0, gid="frontier-gap")
        axes.plot(limits[~proven & shown], makespans[~proven & shown], "o", color=palette().frontier,
                  markerfacecolor="white", zorder=3, gid="frontier-unproven")
    axes.step(stairs_x, stairs_y, where="post", color=palette().frontier, linewidth=1.6, zorder=2, gid="frontier")
    axes.plot(limits[proven & shown], makespans[proven & shown], "o", color=palette().frontier, zorder=3,
              gid="frontier-optimal")
    points = [(x, y) for x, y, _ in groups if low <= y <= high]
    if points:
        axes.plot(*zip(*points, strict=True), "D", color=palette().heuristic, markersize=5, linestyle="none", zorder=4,
                  gid="heuristics")


def _panel_ranges(values: list[float]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Per panel, top first, the y range it shows and the range of values whose markers it draws.
    Two panels, the axis broken between them, when a gap between the values can go: the widest gap
    below which at least half of the values, of two or more makespans, span less than BREAK_SHARE
    of the whole range (the demo's 1275 at the floor squashed the heuristics' 425..482 to a
    sliver; so does one slow heuristic far above the rest). Neither panel shows past the middle of
    the gap, and each marker is drawn in one panel only: one peeking in at the edge of the other
    would read as a second point."""
    ordered = sorted(values)
    low, high = ordered[0], ordered[-1]
    best = None
    for below in range((len(ordered) + 1) // 2, len(ordered)):
        top, above = ordered[below - 1], ordered[below]
        if top > low and top - low < BREAK_SHARE * (high - low) and (best is None or above - top > best[1] - best[0]):
            best = (top, above)
    if best is None:
        return [(_padded(low, high), (-math.inf, math.inf))]
    top, above = best
    upper, lower, middle = _padded(above, high), _padded(low, top), (top + above) / 2
    return [((max(upper[0], middle), upper[1]), (above, math.inf)),
            ((lower[0], min(lower[1], middle)), (-math.inf, top))]


def _padded(low: float, high: float) -> tuple[float, float]:
    """The range with 8 % margins (a single value's relative to its size)."""
    pad = 0.08 * (high - low) if high > low else 0.05 * max(abs(high), 1.0)
    return low - pad, high + pad


def _mark_break(top, bottom) -> None:
    """The axis-break convention: no spine between the panels, two slashes on the y axis."""
    top.spines["bottom"].set_visible(False)
    top.tick_params(axis="x", bottom=False)
    slash = dict(marker=[(-1, -0.5), (1, 0.5)], markersize=10, linestyle="none", color="black", mew=1,
                 clip_on=False)
    top.plot([0], [0], transform=top.transAxes, gid="axis-break", **slash)
    bottom.plot([0], [1], transform=bottom.transAxes, gid="axis-break", **slash)


def _mechanism_marks(owners: list, frontier, marked: list[tuple[str, str]]) -> list[Bbox]:
    """Above each point of the staircase, to its right (clear of the step coming down into it), how
    many activations its schedule recomputes and offloads ("R 23/32", "O 5/32", one per line), in
    the panel that draws the point (`owners`: (axes, the range of values it draws)), but not over a
    point that carries the schedule of the one before it, nor where it would cover another mark;
    their pixel boxes, for the heuristics' labels to keep clear of."""
    activations = frontier.problem.num_activations
    renderer = owners[0][0].figure.canvas.get_renderer()
    boxes: list[Bbox] = []
    for point in frontier.points:
        counts = [getattr(point, attribute) for _, attribute in marked]
        if point.makespan is None or None in counts or point.found_at != point.memory_limit:
            continue
        axes = next(axes for axes, (low, high) in owners if low <= point.makespan <= high)
        text = "\n".join(f"{letter} {count}/{activations}" for (letter, _), count in zip(marked, counts, strict=True))
        mark = axes.annotate(text, (point.memory_limit, point.makespan),
                             xytext=(4, 4), textcoords="offset points", ha="left", va="bottom", fontsize=7,
                             color=palette().frontier, zorder=5)
        box = _text_box(mark, renderer).padded(LABEL_GAP)
        if any(box.overlaps(other) for other in boxes):
            mark.remove()
            continue
        boxes.append(box)
    return boxes


def _heuristic_groups(heuristics) -> list[tuple[float, float, str]]:
    """(place on the sweep's axis, makespan, "name, name, ...") per distinct point: heuristics that coincide
    (1f1b and its 2BW variant, say) are one marker with one label."""
    names: dict[tuple[float, float], list[str]] = {}
    for point in heuristics:
        names.setdefault((round(point.position, 9), round(point.makespan, 9)), []).append(point.name)
    return [(x, y, ", ".join(group)) for (x, y), group in names.items()]


def _label_heuristics(axes, groups: list[tuple[float, float, str]], stairs_x: np.ndarray, stairs_y: np.ndarray,
                      other_text: list[Bbox]):
    """Label each heuristic point at the nearest offset (LABEL_DISTANCES × LABEL_DIRECTIONS) where
    the text, measured by the renderer, stays inside the axes, clear of every marker, the staircase,
    `other_text` and the labels placed before it, and nearer its own point than any other heuristic's (so no
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
    taken += other_text
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
        text, point, xytext=offset, textcoords="offset points", fontsize=7.5, color=palette().heuristic, zorder=5,
        ha="left" if dx > 0 else "right" if dx < 0 else "center",
        va="bottom" if dy > 0 else "top" if dy < 0 else "center",
        arrowprops=dict(arrowstyle="-", color=palette().heuristic, linewidth=0.5, shrinkA=1, shrinkB=4),
    )


def _text_box(label, renderer) -> Bbox:
    """Where an annotation's text lies in pixels, without its leader line (which reaches the point)."""
    label.update_positions(renderer)
    return Text.get_window_extent(label, renderer)
