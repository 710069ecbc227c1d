"""One self-contained HTML page comparing schedules: the problem, the comparison table and chart,
and every schedule's Gantt chart and memory timeline.

Charts are inline SVG and the style sheet is inline, so the page opens from disk, offline, and
can be mailed as one file; it refers to no external resource.
"""

from __future__ import annotations

import html
import io
import re
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from zbopt import __version__, plot
from zbopt.compare import COLUMNS, Comparison, ComparisonRow
from zbopt.errors import ZboptError

REPORT_FORMATS = (".html", ".htm")
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.5em 2em;
       color: #1a1a1a; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { padding: 0.25em 0.8em; border-bottom: 1px solid #ddd; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
tr.over-limit td { color: #c0392b; }
figure { margin: 0.5em 0 1.5em; }
svg { max-width: 100%; height: auto; }
section.schedule { border-top: 1px solid #ccc; margin-top: 1.5em; }
"""
# text as text (a fraction of the size of glyph paths); where DejaVu Sans (what the labels were
# measured with) is missing, the browser falls back to narrower fonts, so fitted labels still fit
SVG_TEXT = {"svg.fonttype": "none", "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"]}
NUMBER_COLUMNS = ("makespan", "bubble_rate", "zb_bubble_rate", "peak_memory", "gap")


def check_report_path(path: str | Path) -> Path:
    """The path, if it names an HTML file; else a ZboptError naming it."""
    path = Path(path)
    if path.suffix.lower() not in REPORT_FORMATS:
        raise ZboptError(f"report file '{path}': unsupported extension, use {', '.join(REPORT_FORMATS)}")
    return path


def write_report(path: str | Path, comparison: Comparison, *, frontier=None) -> Path:
    """Write `render_report(comparison, frontier=frontier)` to `path` (.html or .htm); return the path."""
    path = check_report_path(path)
    path.write_text(render_report(comparison, frontier=frontier), encoding="utf-8")
    return path


def render_report(comparison: Comparison, *, frontier=None) -> str:
    """The report as one HTML document: the problem's parameters, the comparison table (each name
    links to its schedule's section), the comparison chart, the memory/makespan frontier when
    given, then per schedule its Gantt chart and memory timeline."""
    problem = comparison.problem
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>zbopt: {_text(problem.describe())}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Pipeline schedules compared</h1><p>{_text(problem.describe())}</p>",
        '<h2 id="problem">Problem</h2>',
        _problem_table(comparison),
        '<h2 id="comparison">Comparison</h2>',
        _comparison_table(comparison.rows),
        _figure("comparison", plot.plot_comparison(comparison)),
    ]
    if frontier is not None:
        parts += ['<h2 id="frontier">Frontier</h2>', _figure("frontier", plot.plot_frontier(frontier))]
    parts.append('<h2 id="schedules">Schedules</h2>')
    for row in comparison.rows:
        parts.append(_schedule_section(row))
    parts.append(f'<p><small>Written by zbopt {__version__}.</small></p></body></html>')
    return "\n".join(parts)


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _anchor(name: str) -> str:
    """The id of a schedule's section: its name with anything but letters, digits, - and _ replaced."""
    return "schedule-" + re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _problem_table(comparison: Comparison) -> str:
    """The problem's parameters, then the lower bound and the schedules left out, and why."""
    entries = [(key, "none" if value is None else ", ".join(map(str, value)) if isinstance(value, list) else value)
               for key, value in comparison.problem.to_dict().items()]
    entries.append(("lower bound", f"{comparison.lower_bound:.6g} ({comparison.lower_bound_source})"))
    entries += [(f"not applicable: {name}", reason) for name, reason in comparison.not_applicable]
    body = "".join(f"<tr><th>{_text(key)}</th><td>{_text(value)}</td></tr>" for key, value in entries)
    return f'<table class="problem">{body}</table>'


def _comparison_table(rows: tuple[ComparisonRow, ...]) -> str:
    """One line per row; each number cell carries its exact value in data-value for tools."""
    header = "".join(f"<th>{_text(title)}</th>" for title in COLUMNS.values())
    lines = [f'<table class="comparison"><thead><tr>{header}</tr></thead><tbody>']
    for row in rows:
        values, cells = row.to_dict(), row.cells()
        tds = [f'<td data-key="name"><a href="#{_anchor(row.name)}">{_text(row.name)}</a></td>']
        for key in list(COLUMNS)[1:]:
            exact = f' class="number" data-value="{values[key]!r}"' if key in NUMBER_COLUMNS else ""
            tds.append(f'<td data-key="{key}"{exact}>{_text(cells[key])}</td>')
        marked = "" if row.within_memory_limit else ' class="over-limit"'
        lines.append(f'<tr data-schedule="{_text(row.name)}"{marked}>{"".join(tds)}</tr>')
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _schedule_section(row: ComparisonRow) -> str:
    cells = row.cells()
    summary = ", ".join(f"{COLUMNS[key]} {cells[key]}" for key in list(COLUMNS)[1:] if cells[key] != "-")
    return "\n".join([
        f'<section class="schedule" id="{_anchor(row.name)}">',
        f"<h3>{_text(row.name)}</h3><p>{_text(summary)}</p>",
        _figure("gantt", plot.plot_gantt(row.simulation), row.name),
        _figure("memory", plot.plot_memory(row.simulation), row.name),
        "</section>",
    ])


def _figure(kind: str, figure, schedule: str | None = None) -> str:
    """The figure as an inline SVG in a <figure class=kind>, and closed (a report draws many)."""
    buffer = io.StringIO()
    with matplotlib.rc_context(SVG_TEXT):
        figure.savefig(buffer, format="svg")
    plt.close(figure)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and the DTD, which names a URL
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)  # and the RDF metadata, which do too
    owner = "" if schedule is None else f' data-schedule="{_text(schedule)}"'
    return f'<figure class="{kind}"{owner}>\n{svg}</figure>'
