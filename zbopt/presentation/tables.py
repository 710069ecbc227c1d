"""Plain-text tables of a simulation, a solve, a comparison and a frontier: what `zbopt` prints,
for any terminal or log.

Each table imports what it needs inside it, so that printing a simulation loads neither the
solvers (OR-Tools) nor the block search.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import TYPE_CHECKING

__all__ = ["NOT_RUN", "aligned", "format_block", "format_comparison", "format_frontier", "format_simulation",
           "format_solve", "limit_text"]

NOT_RUN = "not tried in the heuristics' share of the time limit; some may not apply"  # a comparison's `not_run`

if TYPE_CHECKING:
    from zbopt.core.simulation import Simulation
    from zbopt.planning.comparison import Comparison
    from zbopt.planning.frontier import Frontier
    from zbopt.solvers import SolveResult
    from zbopt.solvers.blocks.search import BlockSearch


def aligned(rows: Sequence[Sequence[str]], left: Container[int] = (0,)) -> list[str]:
    """Rows of cells (the first the titles) as lines of columns two spaces apart, each as wide as its
    widest cell: the columns in `left` (names) to the left, the others (numbers) to the right."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if column in left else cell.rjust(width)
                      for column, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


def format_simulation(simulation: Simulation) -> str:
    """The schedule's metrics, then one line per device: busy, idle, span, peak memory, limit."""
    from zbopt.core.problem.order import entry_order

    problem = simulation.problem
    limit = problem.memory_limit
    lines = [
        f"schedule        {simulation.schedule.name}",
        f"problem         {problem.describe()}",
        f"makespan        {simulation.makespan:.6g}",
        *([f"iteration_time  {simulation.iteration_time:.6g} (with the reductions, unshards and optimizer steps)"]
          if simulation.ends is not None else []),
        f"bubble_rate     {simulation.bubble_rate:.4f}",
        f"zb_bubble_rate  {simulation.zb_bubble_rate:.4f}",
        f"valid           {'yes' if simulation.valid else 'no'}",
        *([f"recomputed      {len(simulation.table.recomputed)} of {problem.num_activations} activations"]
          if problem.recomputation is not None else []),
        *([f"offloaded       {len(simulation.table.offloaded)} of {problem.num_activations} activations"]
          if problem.offload is not None else []),
        *([f"order           {','.join(map(str, entry_order(problem, simulation.schedule)))} (microbatches enter "
           "in this order)"] if not problem.microbatches_equal else []),
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
    from zbopt.solvers.gap import gap_text

    gap = gap_text(result.gap)
    value = "none" if result.objective is None else f"{result.objective:.6g}"
    resolution = "no model built" if result.resolution is None else f"resolution {result.resolution:g}"
    text = (f"status          {result.status}\n{result.objective_kind:<16}{value}\n"
            f"lower_bound     {result.lower_bound:.6g}\ngap             {gap}\n"
            f"decided_by      {result.decided_by or 'n/a'}\n"
            f"binding_bound   {_binding(result)}\n"
            f"solve_time_s    {result.solve_time_s:.2f}\nsolver          {result.solver} "
            f"({resolution})\nwarm_start      {result.warm_start or 'none'}\n")
    if result.simulation is None:
        return text
    return text + "\n" + format_simulation(result.simulation)


def _binding(result: SolveResult) -> str:
    """The binding bound, its devices and whether every bound finished: "device_sequencing on device
    7, bounds complete"."""
    from zbopt.solvers.bounds import Bound

    if result.binding_bound is None:
        return "n/a"
    binding = Bound(result.binding_bound, result.lower_bound, devices=result.binding_devices).describe()
    return f"{binding}, {'bounds complete' if result.bounds_complete else 'bounds cut by the time limit'}"


def format_block(search: BlockSearch, simulation: Simulation, published: list[dict]) -> str:
    """The optimal block (T, how sure, per-device memory by the lifespan rule and exactly), the
    schedule it builds, and the published blocks at the same costs."""
    from zbopt.solvers.blocks import lifespan_bound, steady_peak

    block, problem = search.block, search.block.problem
    limit = problem.memory_limit
    sure = ("no block of one microbatch repeats faster, none at this T is shorter" if search.status == "optimal"
            else f"the best found; no block of one microbatch repeats faster than {search.least_interval:.6g}")
    lines = [f"problem         {problem.describe()}",
             f"status          {search.status} ({sure})",
             f"T               {block.interval:.6g} per microbatch",
             f"length          {block.length:.6g} (one microbatch's block)",
             f"repeated span   {block.repeated_span(problem.num_microbatches):.6g} ((m - 1)·T + length, m = "
             f"{problem.num_microbatches})",
             f"started from    {search.start}",
             f"schedule        makespan {simulation.makespan:.6g} after squeezing"
             + (f" (iteration {simulation.iteration_time:.6g})" if simulation.ends is not None else "")
             + f", peak memory {max(simulation.peak_memory):.6g}",
             "",
             f"{'device':>6}  {'lifespan rule':>13}  {'steady peak':>11}  {'limit':>8}"]
    rule, steady = lifespan_bound(block), steady_peak(block)
    for device in range(problem.num_devices):
        cap = "none" if limit is None else f"{limit[device]:g}"
        lines.append(f"{device:>6}  {rule[device]:>13.6g}  {steady[device]:>11.6g}  {cap:>8}")
    lines += ["", "published blocks at these costs:",
              f"{'name':<18}  {'T':>10}  {'length':>10}  {'steady peak':>11}  within limit"]
    for row in published:
        if "not_applicable" in row:
            lines.append(f"{row['name']:<18}  {row['not_applicable']}")
        else:
            lines.append(f"{row['name']:<18}  {row['interval']:>10.6g}  {row['length']:>10.6g}  "
                         f"{row['steady_peak']:>11.6g}  {'yes' if row['fits'] else 'no'}")
    return "\n".join(lines)


def format_comparison(comparison: Comparison, verbose: bool = False) -> str:
    """The problem, the lower bound, one aligned line per row (in the comparison's order), the
    schedules left out (one line of names; with `verbose` a line each with its reason: a problem
    leaves out the many that do not apply, which would bury the table), and the best row within the limit."""
    from zbopt.planning.comparison import columns

    problem, result = comparison.problem, comparison.solve_result
    shown = columns(problem)
    cells = [row.cells() for row in comparison.rows]
    width = {key: max(len(title), *(len(row[key]) for row in cells)) for key, title in shown.items()}
    left = ("name", "status", "binding_device", "within_memory_limit")

    def line(values: dict[str, str]) -> str:
        return "  ".join(f"{values[key]:<{width[key]}}" if key in left else f"{values[key]:>{width[key]}}"
                         for key in shown).rstrip()

    bound, source = comparison.lower_bound, comparison.lower_bound_source
    lines = [
        f"problem       {problem.describe()}",
        f"memory limit  {limit_text(problem.memory_limit)}",
        f"lower bound   {source if bound is None else f'{bound:.6g} ({source})'}",
        "",
        line(shown),
        *(line(row) for row in cells),
    ]
    if result is not None and result.simulation is None:
        lines.append(f"cpsat found no schedule in {result.solve_time_s:.1f} s (status {result.status})")
    lines += _not_applicable_lines(comparison.not_applicable, verbose)
    if comparison.not_run:
        lines += ["", f"not run ({len(comparison.not_run)}, {NOT_RUN}): {', '.join(comparison.not_run)}"]
    best = comparison.best_within_limit
    label = "best" if problem.memory_limit is None else "best within the limit"
    if best is None:
        return "\n".join([*lines, "", "no schedule within the limit"])
    gap = "no bound" if bound is None else f"gap {best.cells()['gap']}"
    return "\n".join([*lines, "", f"{label}: {best.name} ({gap})"])


def limit_text(limit: tuple[float, ...] | None) -> str:
    """A memory limit as people read it: "none", "4 on every device", or one value per device in
    device order ("33.1, 42.6, 42.6, 33.1 (devices 0-3)"), never the distinct values alone."""
    if limit is None:
        return "none"
    if len(set(limit)) == 1:
        return f"{limit[0]:g} on every device"
    return f"{', '.join(f'{cap:g}' for cap in limit)} (devices 0-{len(limit) - 1})"


def _not_applicable_lines(left_out: tuple[tuple[str, str], ...], verbose: bool) -> list[str]:
    """The schedules that do not apply: their names on one line, or with `verbose` one line each
    with its reason."""
    if not left_out:
        return []
    if verbose:
        return ["", "not applicable:", *(f"  {reason}" for _, reason in left_out)]
    names = ", ".join(name for name, _ in left_out)
    return ["", f"not applicable ({len(left_out)}, reasons with --verbose): {names}"]


def format_frontier(frontier: Frontier) -> str:
    """The problem, what the sweep's values set, one line per value (with scaled per-device limits,
    each device's), then the heuristics at their own peak memory."""
    from zbopt.planning.frontier import counted_mechanisms
    from zbopt.solvers.gap import gap_text

    points, problem, scaled = frontier.points, frontier.problem, frontier.scaled
    mechanisms = [name for _, name in counted_mechanisms(problem)]  # FrontierPoint counts, as columns
    word = "limit" if scaled is None else "factor"
    title = "memory limit" if scaled is None else "factor"
    timed = "iteration" if problem.iteration_ends is not None else "makespan"  # what the points and rows measure
    lines = [
        f"problem       {problem.describe()}",
        f"sweep         {_sweep_text(frontier)}",
        f"solves        {len(points)} memory limits, CP-SAT {frontier.time_limit:g} s each; "
        f"wall time {frontier.wall_time_s:.1f} s",
        "",
        f"{title:>12}  {'status':<8}  {timed:>10}  {'lower bound':>11}  {'gap':>7}  {'solve s':>7}"
        + "".join(f"  {name:<11}" for name in mechanisms) + ("" if scaled is None else "  limits per device"),
    ]
    for point in points:
        makespan = "none" if point.makespan is None else f"{point.makespan:.6g}"
        carried = "" if point.found_at in (None, point.memory_limit) else f"  (found at {word} {point.found_at:g})"
        count = "".join(f"  {'-' if getattr(point, name) is None else getattr(point, name):>4} of "
                        f"{problem.num_activations:<3}" for name in mechanisms)
        per_device = "" if scaled is None else "  " + ", ".join(f"{cap:g}" for cap in frontier.device_limits(point))
        lines.append(f"{point.memory_limit:>12g}  {point.status:<8}  {makespan:>10}  {point.lower_bound:>11.6g}  "
                     f"{gap_text(point.gap):>7}  {point.solve_time_s:>7.2f}{count}{per_device}{carried}")
    if frontier.heuristics:
        width = max(len("heuristic"), *(len(point.name) for point in frontier.heuristics))
        fits = "" if scaled is None else f"  {'fits from factor':>16}"
        lines += ["", "heuristics at their own peak memory (run without a limit):",
                  f"{'heuristic':<{width}}  {'peak memory':>11}  {timed:>10}{fits}"]
        lines += [f"{point.name:<{width}}  {point.peak_memory:>11.6g}  {point.makespan:>10.6g}"
                  + ("" if scaled is None else f"  {point.factor:>16.4g}") for point in frontier.heuristics]
    return "\n".join(lines)


def _sweep_text(frontier: Frontier) -> str:
    """What each value of the sweep sets, and what became of the problem's own limit."""
    if frontier.scaled is not None:
        return f"each value is a factor: device d's limit = factor × its own, {limit_text(frontier.scaled)}"
    own = frontier.problem.memory_limit
    return "each value is every device's memory limit" + ("" if own is None else f" (the problem's {own[0]:g} unused)")
