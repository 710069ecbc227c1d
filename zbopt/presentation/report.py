"""One self-contained HTML page comparing schedules: the problem, the comparison table and chart,
and every schedule's Gantt chart and memory timeline.

The comparison and frontier charts are inline SVG. Each schedule's Gantt chart and memory
timeline are drawn in the browser on canvases (`viewer.js`, inlined: hover details, zoom, pan; a
click on a table row shows that schedule) from its simulation's numbers, embedded gzip-compressed
and base64-encoded: p = 32, m = 256 is 24,576 ops per schedule (twice that at v = 2), too many for
SVG elements. The
style sheet is inline too, so the page opens from disk, offline, and can be mailed as one file; it
refers to no external resource.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from importlib.resources import files
from pathlib import Path

from matplotlib.colors import to_hex

from zbopt import __version__
from zbopt.core.errors import ZboptError
from zbopt.core.kinds import KINDS
from zbopt.core.ops import GATHER_LANE
from zbopt.core.problem.microbatches import tokens_of
from zbopt.core.simulation import Simulation
from zbopt.core.simulation.ends import END_NAMES
from zbopt.io.write import write_file
from zbopt.planning.comparison import Comparison, ComparisonRow, columns
from zbopt.presentation import plot
from zbopt.presentation.plot.style import chunk_color, palette
from zbopt.presentation.tables import NOT_RUN

__all__ = ["COMMUNICATION_LANE", "NUMBER_COLUMNS", "PAIR_LANE", "REPORT_FORMATS", "STYLE", "VIEWER",
           "check_report_path", "render_report", "schedule_data", "schedule_section", "write_report"]

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
canvas { display: block; cursor: crosshair; }
table.comparison tr[data-schedule] { cursor: pointer; }
table.comparison tr.shown td { background: #eef3fb; }
.tip { position: absolute; background: #fffbe6; border: 1px solid #c9b458; padding: 0.2em 0.5em; font-size: 0.8em;
       pointer-events: none; white-space: nowrap; }
"""
NUMBER_COLUMNS = ("makespan", "iteration_time", "bubble_rate", "zb_bubble_rate", "peak_memory", "gap")
VIEWER = files("zbopt.presentation").joinpath("viewer.js").read_text(encoding="utf-8")
PAIR_LANE = 3  # the viewer's lane of an overlapped pair's members, split across the compute row
COMMUNICATION_LANE = 4  # the viewer's strip of the iteration's ends (unshards, gradient reductions)


def check_report_path(path: str | Path) -> Path:
    """The path, if it names an HTML file; else a ZboptError naming it."""
    path = Path(path)
    if path.suffix.lower() not in REPORT_FORMATS:
        raise ZboptError(f"report file '{path}': unsupported extension, use {', '.join(REPORT_FORMATS)}")
    return path


def write_report(path: str | Path, comparison: Comparison, *, frontier=None) -> Path:
    """Write `render_report(comparison, frontier=frontier)` to `path` (.html or .htm); return the path."""
    path = check_report_path(path)
    write_file(path, render_report(comparison, frontier=frontier))
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
        _comparison_table(comparison.rows, columns(comparison.problem)),
        plot.figure_html("comparison", plot.plot_comparison(comparison)),
    ]
    if frontier is not None:
        parts += ['<h2 id="frontier">Frontier</h2>', plot.figure_html("frontier", plot.plot_frontier(frontier))]
    parts.append('<h2 id="schedules">Schedules</h2><p>Click a row of the table to show its schedule; hover for '
                 "details, Ctrl + wheel to zoom, drag to pan, double click to see it whole.</p>"
                 "<noscript><p>The charts are drawn by the page's script: allow it to see them.</p></noscript>")
    for number, row in enumerate(comparison.rows):
        parts.append(_schedule_section(row, shown=number == 0))
    parts.append(f"<script>{VIEWER}</script>")
    parts.append(f'<p><small>Written by zbopt {__version__}.</small></p></body></html>')
    return "\n".join(parts)


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _anchor(name: str) -> str:
    """The id of a schedule's section: its name with anything but letters, digits, - and _ replaced."""
    return "schedule-" + re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _cell(value) -> str:
    """A parameter as people write it: "none", "2" for 2.0, "1, 2" for a list, "FB: 1.5; FBW: 2" for a mapping."""
    if value is None or value == {}:
        return "none"
    if isinstance(value, list):
        return ", ".join(map(_cell, value))
    if isinstance(value, dict):
        return "; ".join(f"{key}: {_cell(item)}" for key, item in value.items())
    return f"{value:.12g}" if isinstance(value, float) else str(value)


def _problem_table(comparison: Comparison) -> str:
    """The problem's parameters, then the lower bound and the schedules left out, and why."""
    entries = [(key, _cell(value)) for key, value in comparison.problem.to_dict().items()]
    bound, source = comparison.lower_bound, comparison.lower_bound_source
    entries.append(("lower bound", source if bound is None else f"{bound:.6g} ({source})"))
    entries += [(f"not applicable: {name}", reason) for name, reason in comparison.not_applicable]
    entries += [(f"not run: {name}", NOT_RUN) for name in comparison.not_run]
    body = "".join(f"<tr><th>{_text(key)}</th><td>{_text(value)}</td></tr>" for key, value in entries)
    return f'<table class="problem">{body}</table>'


def _comparison_table(rows: tuple[ComparisonRow, ...], shown: dict[str, str]) -> str:
    """One line per row, one cell per column `shown`; each number cell carries its exact value in
    data-value for tools."""
    header = "".join(f"<th>{_text(title)}</th>" for title in shown.values())
    lines = [f'<table class="comparison"><thead><tr>{header}</tr></thead><tbody>']
    for row in rows:
        values, cells = row.to_dict(), row.cells()
        tds = [f'<td data-key="name"><a href="#{_anchor(row.name)}">{_text(row.name)}</a></td>']
        for key in list(shown)[1:]:
            exact = f' class="number" data-value="{values[key]!r}"' if key in NUMBER_COLUMNS else ""
            tds.append(f'<td data-key="{key}"{exact}>{_text(cells[key])}</td>')
        marked = "" if row.within_memory_limit else ' class="over-limit"'
        lines.append(f'<tr data-schedule="{_text(row.name)}"{marked}>{"".join(tds)}</tr>')
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _schedule_section(row: ComparisonRow, shown: bool) -> str:
    """A comparison row's section: `schedule_section` with the row's metrics as its summary."""
    cells, shown = row.cells(), columns(row.simulation.problem)
    summary = ", ".join(f"{shown[key]} {cells[key]}" for key in list(shown)[1:] if cells[key] != "-")
    return schedule_section(row.name, summary, row.simulation, shown)


def schedule_section(name: str, summary: str, simulation: Simulation, shown: bool = True,
                     units: dict[str, str] | None = None) -> str:
    """A schedule's section: its summary, a canvas each for its Gantt chart and memory timeline,
    and its numbers for them (`schedule_data`, with `units` such as {"time": "ms", "memory": "GB"}
    for the viewer's read-outs), gzip-compressed and base64-encoded; the page needs VIEWER's script once."""
    data = {**schedule_data(simulation), **({"units": units} if units else {})}
    packed = base64.b64encode(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0)).decode()
    owner = f'data-schedule="{_text(name)}"'
    return "\n".join([
        f'<section class="schedule" id="{_anchor(name)}" {owner}{"" if shown else " hidden"}>',
        f"<h3>{_text(name)}</h3><p>{_text(summary)}</p>",
        f'<figure class="gantt" {owner}><canvas class="gantt"></canvas></figure>',
        f'<figure class="memory" {owner}><canvas class="memory"></canvas></figure>',
        '<div class="tip" hidden></div>',
        f'<script type="application/octet-stream" class="schedule-data" data-encoding="gzip+base64">{packed}</script>',
        "</section>",
    ])


def schedule_data(simulation: Simulation) -> dict:
    """What the viewer draws, per op (in op-table order): its name, device, kind (an index into `kinds`),
    stage, chunk, microbatch, start and end (from the first op's start), the memory its device
    holds after the op's allocation or release (`m`), its colour (an index into `palette`, the
    Gantt's colours), its lane (0 compute, 1 device-to-host, 2 host-to-device, 3 an overlapped
    pair's member, 4 a re-gather on the strip of the iteration's ends) and, for a pair's member,
    its place in the pair and the pair's size; per device its memory steps; the limits, the
    makespan and each microbatch's tokens where given; the iteration's ends where the problem has
    them (`_ends_data`)."""
    problem, table = simulation.problem, simulation.table
    origin = simulation.origin
    chunk_of = problem.chunk_of
    ops = table.ops()
    kinds = list(dict.fromkeys(op.kind for op in ops))
    colours = list(dict.fromkeys((op.kind, chunk_of[op.stage]) for op in ops))
    part, parts = [0] * table.size, [1] * table.size
    lane = [COMMUNICATION_LANE if on == GATHER_LANE else on for on in table.lane]
    for pair in simulation.pairs:
        for place, member in enumerate(pair.members):
            part[member], parts[member], lane[member] = place, len(pair.members), PAIR_LANE

    def times(values) -> list[float]:
        return [float(value) - origin for value in values]

    return {
        "devices": problem.num_devices, "chunks": problem.chunks_per_device, "makespan": simulation.makespan,
        "kinds": [KINDS[kind].word for kind in kinds],
        "palette": [to_hex(chunk_color(kind, chunk, problem.chunks_per_device)) for kind, chunk in colours],
        "limit": None if problem.memory_limit is None else list(problem.memory_limit),
        "tokens": None if problem.microbatch_sizes is None else  # per j % m (`tokens_of`)
        [tokens_of(problem, j) for j in range(problem.num_microbatches)],
        "ops": {"name": [str(op) for op in ops], "d": list(table.device), "k": [kinds.index(op.kind) for op in ops],
                "s": [op.stage for op in ops], "chunk": [chunk_of[op.stage] for op in ops],
                "j": [op.microbatch for op in ops], "t0": times(simulation.start), "t1": times(simulation.end),
                "m": simulation.memory_after.tolist(), "lane": lane, "part": part, "parts": parts,
                "c": [colours.index((op.kind, chunk_of[op.stage])) for op in ops]},
        "memory": [[times(step_times), [float(level) for level in levels]]
                   for step_times, levels in simulation.memory_steps],
        **_ends_data(simulation, times),
    }


def _ends_data(simulation: Simulation, times) -> dict:
    """The iteration's ends where the problem has them: the iteration time (the view's end), and
    per unshard, reduction (lane 4, the communication strip) and step (lane 0, on compute) its
    name (torch's action), device, what it is, start, end and colour (`EndTimes.windows`)."""
    if simulation.ends is None:
        return {}
    placed = simulation.ends.windows(simulation.problem)
    return {"iteration": simulation.iteration_time,
            "ends": {"name": [window.name for window in placed], "d": [window.device for window in placed],
                     "what": [END_NAMES[window.what] for window in placed],
                     "t0": times([window.begin for window in placed]), "t1": times([window.end for window in placed]),
                     "lane": [0 if window.what == "step" else COMMUNICATION_LANE for window in placed],
                     "colour": [palette().ends[window.what] for window in placed]}}
