"""What every chart shares: the palette, the figure formats, the caption and the writing of the file,
or of the figure as inline SVG for HTML (the report's charts, a notebook's view of a result)."""

from __future__ import annotations

import functools
import inspect
import io
import logging
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.style
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from zbopt.core.errors import ZboptError
from zbopt.core.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, KINDS, OFFLOAD, RECOMPUTE, REGATHER, RELOAD, WEIGHT
from zbopt.core.simulation import Simulation
from zbopt.io.write import write_file

__all__ = ["DPI", "FIGURE_FORMATS", "FIGURE_STYLES", "KIND_NAMES", "MAX_WIDTH_IN", "PAPER_PALETTE", "RECOMPUTE_HATCH",
           "SCREEN_PALETTE", "STYLE_DOC", "SVG_TEXT", "FigureStyle", "Palette", "check_figure_path", "check_style",
           "chunk_color", "figure_html", "palette", "styled"]

FIGURE_FORMATS = (".png", ".svg", ".pdf")
KIND_NAMES = {letter: kind.legend for letter, kind in KINDS.items()}
RECOMPUTE_HATCH = "////"
DPI = 120
MAX_WIDTH_IN = 20.0  # wider figures do not get more legible; dense charts thin their labels instead


@dataclass(frozen=True)
class Palette:
    """Every colour the charts use. A recompute re-runs a forward: F's colour, told apart by RECOMPUTE_HATCH."""

    kinds: dict[str, str]
    lane: str  # idle time, and grid lines
    latency: str
    memory: str
    limit: str  # the memory limit, and whatever breaks it
    bar: str
    frontier: str
    heuristic: str
    ends: dict[str, str]  # the iteration's ends: "unshard", "reduce" (gradient reduction), "step"


SCREEN_PALETTE = Palette(
    kinds={FORWARD: "#3b6fb6", BACKWARD: "#e8862a", WEIGHT: "#3a9a4a", FUSED_BACKWARD: "#8b5bb3",
           RECOMPUTE: "#3b6fb6", OFFLOAD: "#2a9d8f", RELOAD: "#c9a227", REGATHER: "#95a5a6"},
    lane="#ececec", latency="#333333", memory="#3b6fb6", limit="#c0392b", bar="#5b84b1", frontier="#3b6fb6",
    heuristic="#b03a2e", ends={"unshard": "#95a5a6", "reduce": "#117864", "step": "#34495e"})
# Okabe and Ito's palette ("Color Universal Design", 2008): its colours stay apart under every common
# colour-vision deficiency; the screen palette's B and L merge under deuteranopia, its F and BW nearly
PAPER_PALETTE = Palette(
    kinds={FORWARD: "#0072b2", BACKWARD: "#e69f00", WEIGHT: "#009e73", FUSED_BACKWARD: "#cc79a7",
           RECOMPUTE: "#0072b2", OFFLOAD: "#56b4e9", RELOAD: "#d55e00", REGATHER: "#f0e442"},
    lane="#ebebeb", latency="#000000", memory="#0072b2", limit="#d55e00", bar="#0072b2", frontier="#0072b2",
    heuristic="#d55e00", ends={"unshard": "#f0e442", "reduce": "#000000", "step": "#999999"})


@dataclass(frozen=True)
class FigureStyle:
    """How a chart is drawn and written: its palette, a matplotlib style file, whether it has a title."""

    palette: Palette
    sheet: Path | None
    titles: bool


# paper: for a venue's PDF (TrueType fonts, STIX text and Computer Modern math, colour-blind safe, no
# title unless asked)
FIGURE_STYLES = {"screen": FigureStyle(SCREEN_PALETTE, None, titles=True),
                 "paper": FigureStyle(PAPER_PALETTE, Path(__file__).with_name("paper.mplstyle"), titles=False)}
_STYLE: ContextVar[FigureStyle] = ContextVar("zbopt_figure_style", default=FIGURE_STYLES["screen"])


def palette() -> Palette:
    """The colours of the style being drawn in (the screen's outside any `styled` plot)."""
    return _STYLE.get().palette


def check_style(style: str) -> FigureStyle:
    """The named figure style; else a ZboptError naming it."""
    if style not in FIGURE_STYLES:
        raise ZboptError(f"figure style '{style}': unknown, use {', '.join(FIGURE_STYLES)}")
    return FIGURE_STYLES[style]


STYLE_DOC = """
    style: "screen" (default) or "paper" (`FIGURE_STYLES`). matplotlib reads the font settings when
    saving, so a paper figure keeps its TrueType fonts when written through `path`, not when the
    returned Figure is saved later outside the style. Not thread-safe: matplotlib's settings are
    global to the process."""


def styled(plot):
    """Give a plot function the keyword `style` (a key of FIGURE_STYLES, default "screen"), in its
    signature and docstring too: the chart is drawn and, when given a path, written in that style."""

    @functools.wraps(plot)
    def in_style(*args, style: str = "screen", **kwargs):
        chosen = check_style(style)
        token = _STYLE.set(chosen)
        # fontTools, subsetting matplotlib's Computer Modern into a PDF, warns of the fonts' 1970s
        # timestamps on every write
        font_tools = logging.getLogger("fontTools")
        level = font_tools.level
        font_tools.setLevel(max(level, logging.ERROR))
        try:
            with matplotlib.style.context(chosen.sheet or {}):
                return plot(*args, **kwargs)
        finally:
            font_tools.setLevel(level)
            _STYLE.reset(token)

    signature = inspect.signature(plot)
    in_style.__signature__ = signature.replace(parameters=[
        *signature.parameters.values(),
        inspect.Parameter("style", inspect.Parameter.KEYWORD_ONLY, default="screen", annotation="str")])
    in_style.__doc__ = (plot.__doc__ or "").rstrip() + "\n" + STYLE_DOC
    return in_style


def _title(title: str | None, default: str) -> str | None:
    """The title asked for; else the default where the style has titles (screen), none where not (paper)."""
    if title is not None:
        return title
    return default if _STYLE.get().titles else None


def chunk_color(kind: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """The kind's colour, lightened for earlier chunks so a device's chunks stay apart."""
    base = to_rgb(palette().kinds[kind])
    if chunks == 1:
        return base
    lighten = 0.55 * (chunks - 1 - chunk) / (chunks - 1)
    return tuple(c + (1.0 - c) * lighten for c in base)


def _kind_handles(problem) -> list[Patch]:
    """A legend key per kind, or with several chunks per device per kind and chunk in its shade
    ("down" and "up" for the two ways of a bidirectional placement)."""
    v = problem.chunks_per_device
    if v == 1:
        return [Patch(facecolor=palette().kinds[kind], label=KIND_NAMES[kind]) for kind in problem.kinds]
    names = _chunk_names(problem)
    return [Patch(facecolor=chunk_color(kind, chunk, v), label=f"{KIND_NAMES[kind]}, {names[chunk]}")
            for kind in problem.kinds for chunk in range(v)]


def _chunk_names(problem) -> list[str]:
    """What the legend calls each chunk: "chunk c", or for the bidirectional placement the way it
    serves ("down", "up"; with two V's, each way's first and second half)."""
    v = problem.chunks_per_device
    if not problem.bidirectional:
        return [f"chunk {chunk}" for chunk in range(v)]
    if v == 2:
        return ["down", "up"]
    return [f"{way} {half + 1}/{v // 2}" for way in ("down", "up") for half in range(v // 2)]


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
    """Write the figure when a path is given (whole or not at all, and release it); return it either way."""
    if path is not None:
        try:
            write_file(path, lambda file: figure.savefig(file, format=path.suffix[1:].lower()))
        finally:
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


# text as text (a fraction of the size of glyph paths); where DejaVu Sans (what the labels were
# measured with) is missing, the browser falls back to narrower fonts, so fitted labels still fit
SVG_TEXT = {"svg.fonttype": "none", "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"]}


def figure_html(kind: str, figure) -> str:
    """The figure as an inline SVG in a <figure class=kind>, and closed (a report draws many)."""
    buffer = io.StringIO()
    with matplotlib.rc_context(SVG_TEXT):
        figure.savefig(buffer, format="svg")
    plt.close(figure)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and the DTD, which names a URL
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)  # and the RDF metadata, which do too
    return f'<figure class="{kind}">\n{svg}</figure>'
