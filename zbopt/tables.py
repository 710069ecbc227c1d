"""Plain-text tables of a simulation, a solve, a comparison and a frontier: what `zbopt` prints,
for any terminal or log."""

from __future__ import annotations

from zbopt.compare import COLUMNS, Comparison
from zbopt.frontier import Frontier
from zbopt.simulate import Simulation
from zbopt.solvers import SolveResult
from zbopt.solvers.result import gap_text


def format_simulation(simulation: Simulation) -> str:
    """The schedule's metrics, then one line per device: busy, idle, span, peak memory, limit."""
    problem = simulation.problem
    limit = problem.memory_limit
    lines = [
        f"schedule        {simulation.schedule.name}",
        f"problem         {problem.describe()}",
        f"makespan        {simulation.makespan:.6g}",
        f"bubble_rate     {simulation.bubble_rate:.4f}",
        f"zb_bubble_rate  {simulation.zb_bubble_rate:.4f}",
        f"valid           {'yes' if simulation.valid else 'no'}",
        "",
        f"{'device':>6}  {'busy':>10}  {'idle':>10}  {'span':>10}  {'peak memory':>11}  {'limit':>8}",
    ]
    for device in range(problem.num_devices):
        cap = "none" if limit is None else f"{limit[device]:g}"
        lines.append(
            f"{device:>6}  {simulation.busy[device]:>10.6g}  {simulation.idle[device]:>10.6g}  "
            f"{simulation.span[device]:>10.6g}  {simulation.peak_memory[device]:>11.6g}  {cap:>8}"
        )
    return "\n".join(lines)


def format_solve(result: SolveResult) -> str:
    """The solver's status and certificate, then the schedule's metrics when it found one."""
    gap = gap_text(result.gap)
    value = "none" if result.objective is None else f"{result.objective:.6g}"
    resolution = "no model built" if result.resolution is None else f"resolution {result.resolution:g}"
    text = (f"status          {result.status}\n{result.objective_kind:<16}{value}\n"
            f"lower_bound     {result.lower_bound:.6g}\ngap             {gap}\n"
            f"decided_by      {result.decided_by or 'n/a'}\n"
            f"solve_time_s    {result.solve_time_s:.2f}\nsolver          {result.solver} "
            f"({resolution})\nwarm_start      {result.warm_start or 'none'}\n")
    if result.simulation is None:
        return text
    return text + "\n" + format_simulation(result.simulation)


def format_comparison(comparison: Comparison) -> str:
    """The problem, the lower bound, one aligned line per row (in the comparison's order), the
    schedules left out with their reasons, and the best row within the memory limit."""
    problem, result = comparison.problem, comparison.solve_result
    limit = problem.memory_limit
    cells = [row.cells() for row in comparison.rows]
    width = {key: max(len(title), *(len(row[key]) for row in cells)) for key, title in COLUMNS.items()}
    left = ("name", "status", "within_memory_limit")

    def line(values: dict[str, str]) -> str:
        return "  ".join(f"{values[key]:<{width[key]}}" if key in left else f"{values[key]:>{width[key]}}"
                         for key in COLUMNS).rstrip()

    lines = [
        f"problem       {problem.describe()}",
        f"memory limit  {'none' if limit is None else ', '.join(f'{cap:g}' for cap in dict.fromkeys(limit))}",
        f"lower bound   {comparison.lower_bound:.6g} ({comparison.lower_bound_source})",
        "",
        line(COLUMNS),
        *(line(row) for row in cells),
    ]
    if result is not None and result.simulation is None:
        lines.append(f"cpsat found no schedule in {result.solve_time_s:.1f} s (status {result.status})")
    if comparison.not_applicable:
        lines += ["", "not applicable:", *(f"  {reason}" for _, reason in comparison.not_applicable)]
    best = comparison.best_within_limit
    label = "best" if limit is None else "best within the limit"
    lines += ["", "no schedule within the limit" if best is None
              else f"{label}: {best.name} (gap {best.cells()['gap']})"]
    return "\n".join(lines)


def format_frontier(frontier: Frontier) -> str:
    """The problem, one line per memory limit, then the heuristics at their own peak memory."""
    points = frontier.points
    lines = [
        f"problem       {frontier.problem.describe()}",
        f"solves        {len(points)} memory limits, CP-SAT {frontier.time_limit:g} s each; "
        f"wall time {frontier.wall_time_s:.1f} s",
        "",
        f"{'memory limit':>12}  {'status':<8}  {'makespan':>10}  {'lower bound':>11}  {'gap':>7}  {'solve s':>7}",
    ]
    for point in points:
        makespan = "none" if point.makespan is None else f"{point.makespan:.6g}"
        gap = gap_text(point.gap)
        carried = "" if point.found_at in (None, point.memory_limit) else f"  (found at limit {point.found_at:g})"
        lines.append(f"{point.memory_limit:>12g}  {point.status:<8}  {makespan:>10}  {point.lower_bound:>11.6g}  "
                     f"{gap:>7}  {point.solve_time_s:>7.2f}{carried}")
    if frontier.heuristics:
        width = max(len("heuristic"), *(len(point.name) for point in frontier.heuristics))
        lines += ["", "heuristics at their own peak memory (run without a limit):",
                  f"{'heuristic':<{width}}  {'peak memory':>11}  {'makespan':>10}"]
        lines += [f"{point.name:<{width}}  {point.peak_memory:>11.6g}  {point.makespan:>10.6g}"
                  for point in frontier.heuristics]
    return "\n".join(lines)
