"""How zbopt's results show themselves: `print()` gives the CLI's text table, Jupyter the same table
beside its chart.

The results (`Simulation`, `SolveResult`, `Comparison`, `Frontier`) inherit `zbopt.core.wiring.Shown` and
never name this module: importing it registers `text` and `rich` as their views (`zbopt/__init__`
does), so the text is the CLI's (`zbopt.presentation.tables`) and the charts are the plots' (`zbopt.presentation.plot`).
"""

from __future__ import annotations

import html

from zbopt.core.wiring import register_views

__all__ = ["MAX_CHART_OPS", "rich", "text"]

MAX_CHART_OPS = 5000  # above this a notebook shows the table alone: an SVG Gantt of more takes seconds and MBs


def _kind(result) -> str:
    """Which result `result` is: "simulation", "comparison", "frontier" or "solve". A simulation
    is told first, so that showing one loads neither the solvers nor the planners."""
    from zbopt.core.simulation import Simulation

    if isinstance(result, Simulation):
        return "simulation"
    from zbopt.planning.comparison import Comparison
    from zbopt.planning.frontier import Frontier

    if isinstance(result, Comparison):
        return "comparison"
    return "frontier" if isinstance(result, Frontier) else "solve"


def text(result) -> str:
    """The CLI's table for `result` (a Simulation, SolveResult, Comparison or Frontier)."""
    from zbopt.presentation import tables

    format_table = {"simulation": tables.format_simulation, "comparison": tables.format_comparison,
                    "frontier": tables.format_frontier, "solve": tables.format_solve}[_kind(result)]
    return format_table(result)


def rich(result) -> str:
    """The table as preformatted text, then the result's chart as inline SVG: a simulation's Gantt
    chart (a solver's answer's, when it found one), a comparison's bars, a frontier's curve."""
    from zbopt.presentation import plot

    kind = _kind(result)
    simulation = result if kind == "simulation" else getattr(result, "simulation", None)
    if simulation is not None and simulation.table.size > MAX_CHART_OPS:
        return (f"<pre>{html.escape(text(result))}</pre><p>(Gantt chart left out: {simulation.table.size:,} ops; "
                "zbopt.presentation.plot.plot_gantt draws it, the HTML report draws it zoomable)</p>")
    if kind == "comparison":
        figure = plot.plot_comparison(result)
    elif kind == "frontier":
        figure = plot.plot_frontier(result)
    else:
        figure = None if simulation is None else plot.plot_gantt(simulation)
    chart = "" if figure is None else plot.figure_html("chart", figure)
    return f"<pre>{html.escape(text(result))}</pre>{chart}"


register_views(text=text, html=rich)
