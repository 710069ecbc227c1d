"""How zbopt's results show themselves: `print()` gives the CLI's text table, Jupyter the same table
beside its chart (`_repr_html_`), and `to_dataframe()` the rows for pandas where it is installed.

Why one module: `Simulation`, `SolveResult`, `Comparison` and `Frontier` each delegate here, so the
text is the CLI's (`zbopt.tables`) and the charts are the plots' (`zbopt.plot`), never a copy.
"""

from __future__ import annotations

import html

from zbopt.errors import ZboptError

MAX_CHART_OPS = 5000  # above this a notebook shows the table alone: an SVG Gantt of more takes seconds and MBs


def text(result) -> str:
    """The CLI's table for `result` (a Simulation, SolveResult, Comparison or Frontier)."""
    from zbopt import tables
    from zbopt.compare import Comparison
    from zbopt.frontier import Frontier
    from zbopt.simulate import Simulation

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
    from zbopt.compare import Comparison
    from zbopt.frontier import Frontier
    from zbopt.report import figure_html
    from zbopt.simulate import Simulation

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


def dataframe(rows: list[dict]):
    """`rows` as a pandas DataFrame; pandas is optional (a ZboptError says how to get it)."""
    try:
        import pandas
    except ImportError:
        raise ZboptError("to_dataframe() needs pandas: pip install pandas") from None
    return pandas.DataFrame(rows)
