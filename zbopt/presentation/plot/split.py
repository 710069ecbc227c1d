"""A plan's splits drawn: per split, each device's work per microbatch as a bar of its stages."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from zbopt.core.kinds import FORWARD
from zbopt.presentation.plot.style import DPI, _finish, _output_path, _style_axes, _title, chunk_color, styled

__all__ = ["plot_split"]


@styled
def plot_split(plan, path: str | Path | None = None, *, title: str | None = None):
    """One panel per split of the plan's chosen pipeline (each rule's, then the joint answer's):
    one bar per device, made of its virtual stages in the order a microbatch meets them, each as
    long as the stage's F + B + W per microbatch (ms) and labelled with its layers; the longest
    device is what time balance evens out. `plan` is a `zbopt.planning.planner.Plan`. Writes PNG, SVG or
    PDF by the extension of `path` when given.

    Returns the matplotlib Figure.
    """
    from zbopt.planning.planner.rules import stage_times
    from zbopt.planning.planner.split import stage_names

    path = _output_path(path)
    chosen, model = plan.best, plan.model
    pipeline = chosen.pipeline
    rules: dict[tuple[int, ...], list[str]] = {}  # split -> the rules that give it
    for row in chosen.rows:
        if row.split is not None and row.rule not in rules.setdefault(row.split, []):
            rules[row.split].append(row.rule)
    panels = [(", ".join(names), split) for split, names in rules.items()]
    panels.append(("joint optimum", chosen.best.split))
    figure, axes_list = plt.subplots(len(panels), 1, sharex=True, squeeze=False, dpi=DPI, layout="constrained",
                                     figsize=(11.0, 0.9 + len(panels) * (0.35 * pipeline.num_devices + 0.6)))
    for axes, (label, split) in zip(axes_list[:, 0], panels, strict=True):
        times = stage_times(model, split)
        names = stage_names(model, split)
        totals = []
        for device in range(pipeline.num_devices):
            left = 0.0
            for chunk, stage in enumerate(pipeline.stages_on(device)):
                axes.barh(device, times[stage], left=left, height=0.7, edgecolor="white",
                          color=chunk_color(FORWARD, chunk, pipeline.chunks_per_device))
                axes.text(left + times[stage] / 2, device, _short(names[stage]), ha="center", va="center",
                          fontsize=7, clip_on=True)
                left += times[stage]
            totals.append(left)
        for device, total in enumerate(totals):
            axes.text(total, device, f" {total:.4g}" + (" (longest)" if total == max(totals) else ""),
                      va="center", fontsize=7)
        axes.set_yticks(range(pipeline.num_devices), [f"device {d}" for d in range(pipeline.num_devices)], fontsize=8)
        axes.invert_yaxis()
        axes.set_title(f"{label}: {', '.join(map(str, split))} layers per virtual stage", fontsize=9, loc="left")
        _style_axes(axes)
    axes_list[-1, 0].set_xlabel("F + B + W per microbatch (ms)", fontsize=9)
    axes_list[-1, 0].set_xlim(0, 1.2 * max(axes.get_xlim()[1] for axes in axes_list[:, 0]))
    heading = _title(title, f"Layer splits, {pipeline.num_devices} devices x {pipeline.chunks_per_device} chunks "
                            f"({pipeline.placement})")
    if heading:
        figure.suptitle(heading, fontsize=10, wrap=True)
    return _finish(figure, path)


def _short(names: str) -> str:
    """A stage's layer names as they fit in a bar: "embedding, decoder 0-7" -> "emb., dec. 0-7"."""
    return ", ".join(part if len(part) <= 9 else part.split(" ")[0][:3] + "." + "".join(
        " " + piece for piece in part.split(" ")[1:]) for part in names.split(", "))
