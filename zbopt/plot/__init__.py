"""The one plotter (matplotlib): Gantt charts and memory timelines of simulated schedules, comparison
bars and the memory–makespan frontier; each returns its Figure and writes PNG, SVG or PDF on request."""

import matplotlib

matplotlib.use("Agg")  # before any module here imports pyplot: figures go to files, never to a window

from zbopt.plot.comparison import plot_comparison
from zbopt.plot.frontier import LABEL_DIRECTIONS, LABEL_DISTANCES, LABEL_GAP, MARKER_CLEARANCE, plot_frontier
from zbopt.plot.gantt import BOX_HEIGHT, MAX_HEIGHT_IN, MAX_LABEL_POINTS, MIN_LABEL_POINTS, plot_gantt
from zbopt.plot.memory import MEMORY_PANEL_ROWS, plot_memory
from zbopt.plot.style import (
    BAR_COLOR,
    DPI,
    FIGURE_FORMATS,
    FRONTIER_COLOR,
    HEURISTIC_COLOR,
    KIND_COLORS,
    KIND_NAMES,
    LANE_COLOR,
    LATENCY_COLOR,
    LIMIT_COLOR,
    MAX_WIDTH_IN,
    MEMORY_COLOR,
    check_figure_path,
    chunk_color,
)

__all__ = [
    "BAR_COLOR",
    "BOX_HEIGHT",
    "DPI",
    "FIGURE_FORMATS",
    "FRONTIER_COLOR",
    "HEURISTIC_COLOR",
    "KIND_COLORS",
    "KIND_NAMES",
    "LABEL_DIRECTIONS",
    "LABEL_DISTANCES",
    "LABEL_GAP",
    "LANE_COLOR",
    "LATENCY_COLOR",
    "LIMIT_COLOR",
    "MARKER_CLEARANCE",
    "MAX_HEIGHT_IN",
    "MAX_LABEL_POINTS",
    "MAX_WIDTH_IN",
    "MEMORY_COLOR",
    "MEMORY_PANEL_ROWS",
    "MIN_LABEL_POINTS",
    "check_figure_path",
    "chunk_color",
    "plot_comparison",
    "plot_frontier",
    "plot_gantt",
    "plot_memory",
]
