"""A building block drawn as the paper draws one: its ops, the same ops folded into one period T
(the steady state of every device), and the block repeated for a few microbatches."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection

from zbopt.presentation.plot.gantt import BOX_HEIGHT, _box, _text_color
from zbopt.presentation.plot.style import (
    DPI,
    MAX_WIDTH_IN,
    _finish,
    _kind_handles,
    _output_path,
    _style_axes,
    _title,
    chunk_color,
    palette,
    styled,
)
from zbopt.solvers.blocks import Block, repeat, steady_peak

__all__ = ["REPEATS_SHOWN", "plot_block"]

REPEATS_SHOWN = 6  # microbatches in the third panel, at most


@styled
def plot_block(block: Block, path: str | Path | None = None, *, title: str | None = None):
    """Three panels, one row per device: (1) one microbatch's ops at their offsets, a dotted line
    every T; (2) the same ops folded into [0, T), labelled with the period they fall in (an op
    labelled q serves the microbatch q periods older; a full row means no bubble); (3) the block
    repeated, unsqueezed, for a few microbatches, labelled by microbatch. Returns the Figure and
    writes PNG, SVG or PDF by the extension of `path` when given."""
    path = _output_path(path)
    problem = block.problem
    p = problem.num_devices
    shown = min(problem.num_microbatches, REPEATS_SHOWN, math.ceil(block.length / block.period) + 2)
    height = min(12.0, 2.4 + 3 * 0.32 * p)
    figure, panels = plt.subplots(3, 1, figsize=(min(MAX_WIDTH_IN, 12.0), height), dpi=DPI, layout="constrained",
                                  height_ratios=[1, 1, 1])
    first, folded, repeated = panels
    _draw_block(first, block)
    _draw_folded(folded, block)
    _draw_repeated(repeated, block, shown * block.group)
    for axes in panels:
        _device_rows(axes, p)
    figure.legend(handles=_kind_handles(problem), loc="outside lower center", ncol=len(problem.kinds), frameon=False,
                  fontsize=8)
    if heading := _title(title, f"block '{block.name}': p={p}, v={problem.chunks_per_device}, "
                                f"T = {block.interval:.4g} per microbatch"):
        figure.suptitle(heading, fontsize=10, wrap=True)
    return _finish(figure, path)


def _boxes(axes, problem, placed, label_of, gid: str) -> None:
    """One collection of boxes, (op, begin) each, with its label (`label_of(op, begin)`) where it has one."""
    rectangles, colors = [], []
    for op, begin in placed:
        device, width = problem.device_of(op.stage), problem.cost(op.kind, op.stage)
        rectangles.append(_box(begin, width, device, BOX_HEIGHT))
        colors.append(chunk_color(op.kind, problem.chunk_of[op.stage], problem.chunks_per_device))
        label = label_of(op, begin)
        if label is not None:
            visible = (max(begin, 0.0) + min(begin + width, axes.get_xlim()[1])) / 2
            axes.text(visible, device, label, ha="center", va="center", fontsize=7, color=_text_color(colors[-1]),
                      zorder=3, clip_on=True)
    axes.add_collection(PolyCollection(rectangles, facecolors=colors, edgecolors="white", linewidths=0.4,
                                       zorder=2, gid=gid))


def _draw_block(axes, block: Block) -> None:
    """Panel 1: one microbatch's ops at their offsets, a dotted line every T."""
    period = block.period
    axes.set_xlim(0, block.length)
    _boxes(axes, block.problem, block.offsets.items(), lambda op, begin: None, "block-ops")
    for moment in range(1, int(block.length / period) + 1):
        axes.axvline(moment * period, color="#999999", linewidth=0.6, linestyle=":", zorder=1)
    axes.set_title(f"one microbatch's block: length {block.length:.4g}, a dotted line every T = {period:.4g}",
                   fontsize=9)


def _draw_folded(axes, block: Block) -> None:
    """Panel 2: the ops folded into [0, T), an op that wraps drawn from 0 too, each labelled with its period."""
    problem, period = block.problem, block.period
    axes.set_xlim(0, period)
    pieces, whole = [], {}
    for op, offset in block.offsets.items():
        phase = offset % period
        whole[op] = int(offset // period)
        pieces.append((op, phase))
        if phase + problem.cost(op.kind, op.stage) > period:  # wraps into the next period: also drawn from 0
            pieces.append((op, phase - period))
    _boxes(axes, problem, pieces, lambda op, begin: str(whole[op]) if begin >= 0 else None, "folded-ops")
    axes.set_title(f"folded into one period T = {period:.4g} (label: the period an op falls in); steady-state peak "
                   f"{max(steady_peak(block)):.4g}", fontsize=9)


def _draw_repeated(axes, block: Block, microbatches: int) -> None:
    """Panel 3: the block repeated every T for `microbatches`, unsqueezed, labelled by microbatch."""
    problem = block.problem
    starts = repeat(block, microbatches)
    axes.set_xlim(0, max(t + problem.cost(op.kind, op.stage) for op, t in starts.items()))
    _boxes(axes, problem, starts.items(), lambda op, begin: str(op.microbatch), "repeated-ops")
    axes.set_title(f"the block repeated every T for {microbatches} microbatches, before squeezing", fontsize=9)


def _device_rows(axes, p: int) -> None:
    """A grey lane per device behind the panel's boxes (idle time shows through), named on the left."""
    low, high = axes.get_xlim()
    axes.add_collection(PolyCollection([_box(low, high - low, d, 0.9) for d in range(p)], facecolors=palette().lane,
                                       edgecolors="none", zorder=0))
    axes.set_ylim(p - 0.5, -0.5)
    axes.set_yticks(range(p), [f"device {d}" if p <= 8 else str(d) for d in range(p)], fontsize=7)
    axes.tick_params(axis="y", length=0)
    _style_axes(axes)
