"""How zbopt's results show themselves: `print()` gives the CLI's text table, Jupyter the same table
beside its chart.

The results (`Simulation`, `SolveResult`, `Comparison`, `Frontier`) inherit `zbopt.shown.Shown` and
never name this module: importing it registers `text` and `rich` as their views (`zbopt/__init__`
does), so the text is the CLI's (`zbopt.tables`) and the charts are the plots' (`zbopt.plot`).
"""

from __future__ import annotations

import html

from zbopt.shown import register_views

MAX_CHART_OPS = 5000  # above this a notebook shows the table alone: an SVG Gantt of more takes seconds and MBs


def text(result) -> str:
    """The CLI's table for `result` (a Simulation, SolveResult, Comparison or Frontier)."""
    from zbopt import tables
    from zbopt.comparison import Comparison
    from zbopt.frontier import Frontier
    from zbopt.simulation import Simulation

    if isinstance(result, Simulation):
        return tables.format_simulation(result)
    if isinstance(result, Comparison):
        return tables.format_comparison(result)
    if isinstance(result, Frontier):
        return tables.format_frontier(result)
    return tables.format_solve(result)


def rich(result) -> str:
    """The table as preformatted text, then the result's chart as inline SVG: a simulation's Gantt
    chart (a solver's answer's, when it found one), a comparison's bars, a frontier's curve."""
    from zbopt import plot
    from zbopt.comparison import Comparison
    from zbopt.frontier import Frontier
    from zbopt.report import figure_html
    from zbopt.simulation import Simulation

    simulation = result if isinstance(result, Simulation) else getattr(result, "simulation", None)
    if simulation is not None and simulation.table.size > MAX_CHART_OPS:
        return (f"<pre>{html.escape(text(result))}</pre><p>(Gantt chart left out: {simulation.table.size:,} ops; "
                "zbopt.plot.plot_gantt draws it, the HTML report draws it zoomable)</p>")
    if isinstance(result, Simulation):
        figure = plot.plot_gantt(result)
    elif isinstance(result, Comparison):
        figure = plot.plot_comparison(result)
    elif isinstance(result, Frontier):
        figure = plot.plot_frontier(result)
    else:
        figure = None if result.simulation is None else plot.plot_gantt(result.simulation)
    chart = "" if figure is None else figure_html("chart", figure)
    return f"<pre>{html.escape(text(result))}</pre>{chart}"


register_views(text=text, html=rich)
