"""The one plotter (matplotlib): Gantt charts and memory timelines of simulated schedules, comparison
bars and the memory–makespan frontier; each returns its Figure and writes PNG, SVG or PDF on request,
in the screen style or, with `style="paper"`, the paper style (`FIGURE_STYLES`)."""

import matplotlib

matplotlib.use("Agg")  # before any module here imports pyplot: figures go to files, never to a window

from zbopt.presentation.plot.comparison import plot_comparison
from zbopt.presentation.plot.frontier import (
    LABEL_DIRECTIONS,
    LABEL_DISTANCES,
    LABEL_GAP,
    MARKER_CLEARANCE,
    plot_frontier,
)
from zbopt.presentation.plot.gantt import BOX_HEIGHT, MAX_HEIGHT_IN, MAX_LABEL_POINTS, MIN_LABEL_POINTS, plot_gantt
from zbopt.presentation.plot.memory import MEMORY_PANEL_ROWS, plot_memory
from zbopt.presentation.plot.style import (
    DPI,
    FIGURE_FORMATS,
    FIGURE_STYLES,
    KIND_NAMES,
    MAX_WIDTH_IN,
    PAPER_PALETTE,
    SCREEN_PALETTE,
    FigureStyle,
    Palette,
    check_figure_path,
    check_style,
    chunk_color,
    figure_html,
    palette,
)

__all__ = ["BOX_HEIGHT", "DPI", "FIGURE_FORMATS", "FIGURE_STYLES", "KIND_NAMES", "LABEL_DIRECTIONS", "LABEL_DISTANCES",
           "LABEL_GAP", "MARKER_CLEARANCE", "MAX_HEIGHT_IN", "MAX_LABEL_POINTS", "MAX_WIDTH_IN", "MEMORY_PANEL_ROWS",
           "MIN_LABEL_POINTS", "PAPER_PALETTE", "SCREEN_PALETTE", "FigureStyle", "Palette", "check_figure_path",
           "check_style", "chunk_color", "figure_html", "palette", "plot_comparison", "plot_frontier", "plot_gantt",
           "plot_memory"]
