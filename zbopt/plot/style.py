"""What every chart shares: the palette, the figure formats, the caption and the writing of the file."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from zbopt.errors import ZboptError
from zbopt.problem import BACKWARD, FORWARD, FUSED_BACKWARD, OFFLOAD, RECOMPUTE, RELOAD, WEIGHT
from zbopt.simulate import Simulation

FIGURE_FORMATS = (".png", ".svg", ".pdf")
# a recompute re-runs a forward: F's colour, told apart by RECOMPUTE_HATCH
KIND_COLORS = {FORWARD: "#3b6fb6", BACKWARD: "#e8862a", WEIGHT: "#3a9a4a", FUSED_BACKWARD: "#8b5bb3",
               RECOMPUTE: "#3b6fb6", OFFLOAD: "#2a9d8f", RELOAD: "#c9a227"}
KIND_NAMES = {FORWARD: "F forward", BACKWARD: "B input grad", WEIGHT: "W weight grad", FUSED_BACKWARD: "BW backward",
              RECOMPUTE: "R recompute", OFFLOAD: "O offload", RELOAD: "L reload"}
RECOMPUTE_HATCH = "////"
LANE_COLOR = "#ececec"
LATENCY_COLOR = "#333333"
MEMORY_COLOR = "#3b6fb6"
LIMIT_COLOR = "#c0392b"
BAR_COLOR = "#5b84b1"
FRONTIER_COLOR = "#3b6fb6"
HEURISTIC_COLOR = "#b03a2e"
DPI = 120
MAX_WIDTH_IN = 20.0  # wider figures do not get more legible; dense charts thin their labels instead


def chunk_color(kind: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """The kind's colour, lightened for earlier chunks so a device's chunks stay apart."""
    base = to_rgb(KIND_COLORS[kind])
    if chunks == 1:
        return base
    lighten = 0.55 * (chunks - 1 - chunk) / (chunks - 1)
    return tuple(c + (1.0 - c) * lighten for c in base)


def _kind_handles(problem) -> list[Patch]:
    """A legend key per kind, or with several chunks per device per kind and chunk in its shade
    ("down" and "up" for the two ways of a bidirectional placement)."""
    v = problem.chunks_per_device
    if v == 1:
        return [Patch(facecolor=KIND_COLORS[kind], label=KIND_NAMES[kind]) for kind in problem.kinds]
    names = ("down", "up") if problem.bidirectional else [f"chunk {chunk}" for chunk in range(v)]
    return [Patch(facecolor=chunk_color(kind, chunk, v), label=f"{KIND_NAMES[kind]}, {names[chunk]}")
            for kind in problem.kinds for chunk in range(v)]


def check_figure_path(path: str | Path) -> Path:
    """The path, if its extension is one matplotlib writes here; else a ZboptError naming it."""
    path = Path(path)
    if path.suffix.lower() not in FIGURE_FORMATS:
        raise ZboptError(f"output file '{path}': unsupported extension, use {', '.join(FIGURE_FORMATS)}")
    return path


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
            f"v={problem.chunks_per_device}{', bidirectional' if problem.bidirectional else ''}{iterations}")


def _style_axes(axes) -> None:
    for spine in ("top", "right"):
        axes.spines[spine].set_visible(False)


def _freeze_layout(figure) -> None:
    """Run the constrained layout once and keep it, so label sizes measured now hold when saved."""
    figure.draw_without_rendering()
    figure.set_layout_engine("none")
