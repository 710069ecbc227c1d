"""A plan shown: the text table of `zbopt plan` and its HTML report (the splits drawn above the best
schedule's Gantt chart and memory timeline). Times in ms and memory in GB, the model's units."""

from __future__ import annotations

import html
from pathlib import Path

from zbopt.planning.model.collectives import describe_ends
from zbopt.planning.planner import Plan, stage_names
from zbopt.planning.planner.result import OVER_THE_LIMIT, device_peaks, split_exports
from zbopt.presentation.tables import aligned
from zbopt.solvers.gap import gap_text, relative_gap

__all__ = ["COLUMNS", "check_plan_report", "format_plan", "render_plan_report", "write_plan_report"]

COLUMNS = ("rule", "schedule", "split", "makespan (ms)", "bubble", "peak (GB) per device, parameters included", "gap")


def _columns(ends: bool) -> tuple[str, ...]:
    """COLUMNS, with the iteration time beside the makespan where the plan times the iteration's ends."""
    return (*COLUMNS[:4], "iteration (ms)", *COLUMNS[4:]) if ends else COLUMNS


def _has_ends(plan: Plan) -> bool:
    return any(row.simulation is not None and row.simulation.ends is not None
               for each in plan.pipelines for row in each.rows)


def _row_cells(plan: Plan, each, row, ends: bool) -> list[str]:
    """One row's cells (`_columns(ends)`)."""
    simulation = row.simulation
    if simulation is None:
        return [row.rule, row.schedule, _split(row.split), *["-"] * (4 if ends else 3), row.note or "-"]
    peaks = device_peaks(plan.model, each.pipeline, row.split, simulation)
    return [row.rule, row.schedule, _split(row.split), f"{simulation.makespan:.5g}",
            *([f"{simulation.iteration_time:.5g}"] if ends else []), f"{simulation.bubble_rate:.1%}",
            ", ".join(f"{peak:.3g}" for peak in peaks),
            gap_text(relative_gap(simulation.iteration_time, each.lower_bound))]


def _split(split) -> str:
    return "-" if split is None else ", ".join(map(str, split))


def _pipeline_heading(each) -> str:
    pipeline = each.pipeline
    rest = "the splits left all pruned" if each.pruned else "splits left not all pruned: bound on them"
    return (f"{pipeline.num_devices} devices x {_chunks(pipeline)} ({pipeline.placement}), "
            f"m = {pipeline.num_microbatches}: lower bound over every split {each.lower_bound:.5g} ms "
            f"({each.explored} splits solved; {rest})")


def _chunks(pipeline) -> str:
    return f"{pipeline.chunks_per_device} chunk{'s' * (pipeline.chunks_per_device > 1)}"


def _model_line(plan: Plan) -> str:
    groups = ", ".join(name if count == 1 else f"{name} x {count}" for name, count in plan.model.groups)
    device = plan.device
    memory = "unlimited" if device.memory_gb is None else (f"{device.memory_gb:g} GB, of which a plan uses at most "
                                                           f"{device.usable_gb:.4g} (reserve {device.reserve:.4g} GB)")
    ends = describe_ends(device, plan.model.training)
    return f"model: {len(plan.model.layers)} layers ({groups}); device memory {memory}" + (f"\n{ends}" if ends else "")


def _best_lines(plan: Plan) -> list[str]:
    chosen, outcome = plan.best, plan.best.best
    pipeline = chosen.pipeline
    lines = [f"best: {_chunks(pipeline)} ({pipeline.placement}), schedule {outcome.schedule}: {_time(outcome)}; "
             f"lower bound over every split {plan.lower_bound:.5g} ms; gap {gap_text(plan.gap)}"]
    peaks = device_peaks(plan.model, pipeline, outcome.split, outcome.simulation)
    for stage, names in enumerate(stage_names(plan.model, outcome.split)):
        device = pipeline.device_of(stage)
        lines.append(f"  stage {stage} on device {device}: {names}  (device peak {peaks[device]:.3g} GB, "
                     "parameters included)")
    found = split_exports(plan.model, pipeline, outcome.split)
    lines.append(f"  Megatron-LM --pipeline-model-parallel-layout: {found['megatron_layout']}")
    if isinstance(found["megatron_first_last"], dict):
        lines.append("  Megatron-LM " + ", ".join(f"--{key.replace('_', '-')} {value}"
                                                   for key, value in found["megatron_first_last"].items()))
    lines.append("  torchtitan module_fqns_per_model_part: " + (
        str(found["torchtitan_modules"]) if isinstance(found["torchtitan_modules"], list)
        else found["torchtitan_modules"]))
    return lines + _framework_lines(plan)


def _time(outcome) -> str:
    """The best plan's objective: "2363.7 ms", or "2401.2 ms per iteration (pipeline 2363.7 ms)"."""
    simulation = outcome.simulation
    if simulation.ends is None:
        return f"{simulation.makespan:.5g} ms"
    return f"{simulation.iteration_time:.5g} ms per iteration (pipeline {simulation.makespan:.5g} ms)"


def _framework_lines(plan: Plan) -> list[str]:
    """Where the best plan runs: torch, torchtitan (its config lines), Megatron-LM (as printed, or
    its own best beside, with what it costs)."""
    support, best = plan.frameworks(), plan.best.best.iteration_time
    lines = ["", "runs in:", f"  torch.distributed.pipelining: {support['torch']}"]
    titan = support["torchtitan"]
    if isinstance(titan, list):
        lines.append("  torchtitan: as printed, from the same CSV; in its TOML config:")
        lines += [f"    {line}" for line in titan]
    else:
        lines.append(f"  torchtitan: not as printed: {titan}")
    megatron = support["megatron"]
    verdict = "as printed" if megatron["as_printed"] else f"not as printed: {megatron['why_not']}"
    lines.append(f"  Megatron-LM: {verdict}")
    own = megatron["best"]
    if isinstance(own, dict):
        cost = (own["iteration_ms"] - best) / best
        lines.append(f"    its best: {own['schedule']} on split {', '.join(map(str, own['split']))}: "
                     f"{own['iteration_ms']:.5g} ms ({cost:+.1%} against the plan's best); " + " ".join(own["flags"]))
    else:
        lines.append(f"    {own}")
    return lines


def format_plan(plan: Plan) -> str:
    """The answer first: the best plan (its split as the model names the layers of each virtual
    stage, its schedule, makespan, bound and gap, its exports); then per pipeline a heading and its
    rows of rule × schedule, the schedules over the memory limit folded into one line."""
    parts, ends = [_model_line(plan), "", *_best_lines(plan)], _has_ends(plan)
    columns = _columns(ends)
    for each in plan.pipelines:
        over = [row for row in each.rows if row.note == OVER_THE_LIMIT]
        parts += ["", _pipeline_heading(each)]
        parts += aligned([list(columns), *(_row_cells(plan, each, row, ends) for row in each.rows if row not in over)],
                         left=range(len(columns)))
        if over:
            names = ", ".join(dict.fromkeys(f"{row.schedule} ({row.rule})" for row in over))
            parts.append(f"over the memory limit: {names}")
    return "\n".join(parts)


def _html_tables(plan: Plan) -> list[str]:
    """Per pipeline its heading and its rows as an HTML table."""
    parts, ends = [], _has_ends(plan)
    head = "".join(f"<th>{html.escape(title)}</th>" for title in _columns(ends))
    for each in plan.pipelines:
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in _row_cells(plan, each, row, ends))
                       + "</tr>" for row in each.rows)
        parts += [f"<h2>{html.escape(_pipeline_heading(each))}</h2>",
                  f'<table class="plan"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>']
    return parts


def check_plan_report(path: str | Path) -> Path:
    """The path, if it names an HTML file (`zbopt.presentation.report`'s rule)."""
    from zbopt.presentation.report import check_report_path

    return check_report_path(path)


def render_plan_report(plan: Plan) -> str:
    """The report: the rows per pipeline, the splits drawn, then the best schedule's Gantt chart and
    memory timeline (the comparison report's viewer)."""
    from zbopt import __version__
    from zbopt.presentation.plot import figure_html
    from zbopt.presentation.plot.split import plot_split
    from zbopt.presentation.report import STYLE, VIEWER, schedule_section

    text = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', "<title>zbopt: plan</title>",
             f"<style>{STYLE}</style></head><body>", "<h1>Layer split and schedule</h1>",
             *(f"<p>{text(line)}</p>" for line in _model_line(plan).splitlines()), *_html_tables(plan),
             '<h2 id="best">Best plan</h2>',
             f'<pre style="white-space: pre-wrap">{text(chr(10).join(_best_lines(plan)))}</pre>',
             '<h2 id="splits">Splits</h2>',
             figure_html("split", plot_split(plan))]
    outcome = plan.best.best
    summary = (f"{'makespan ' if outcome.simulation.ends is None else ''}{_time(outcome)}, lower bound over every "
               f"split {plan.lower_bound:.5g} ms, "
               f"gap {gap_text(plan.gap)}; peak GB per device (parameters included) "
               + ", ".join(f"{peak:.3g}" for peak in device_peaks(plan.model, plan.best.pipeline, outcome.split,
                                                                   outcome.simulation)))
    parts += ['<h2 id="schedule">Best schedule</h2>',
              schedule_section(f"joint optimum ({outcome.schedule})", summary, outcome.simulation,
                               units={"time": "ms", "memory": "GB"}),
              f"<script>{VIEWER}</script>", f"<p><small>Written by zbopt {__version__}.</small></p></body></html>"]
    return "\n".join(parts)


def write_plan_report(path: str | Path, plan: Plan) -> Path:
    """Write `render_plan_report(plan)` to `path` (.html or .htm)."""
    from zbopt.io.write import write_file

    path = check_plan_report(path)
    write_file(path, render_plan_report(plan))
    return path
