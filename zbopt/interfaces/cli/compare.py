"""`zbopt compare`, `zbopt block` and `zbopt frontier`: many schedules side by side, the optimal
building block, and the optimal makespan along a sweep of memory limits."""

from __future__ import annotations

import argparse
import contextlib
import sys

from zbopt.core import interrupt
from zbopt.core.errors import ZboptError
from zbopt.core.simulation import simulate
from zbopt.interfaces.cli.flags import (
    add_deterministic_flag,
    add_input_flags,
    add_order_flag,
    add_quiet_flag,
    add_style_flag,
    config_file,
    dask_client,
    flag_values,
)
from zbopt.interfaces.cli.inputs import run_config
from zbopt.interfaces.cli.output import (
    check_outputs,
    command_clock,
    figure_paths,
    figure_style,
    json_text,
    live,
    output_flag,
    talks,
)
from zbopt.io.trace import TRACE_EXTENSION
from zbopt.presentation.tables import format_block, format_comparison, format_frontier

__all__ = ["add_commands"]


def add_commands(commands) -> None:
    """Add `compare`, `block` and `frontier` to the subcommands `commands`."""
    comparing = commands.add_parser("compare", help="simulate several schedules (and the optimum) side by side")
    comparing.add_argument("--schedule", action="extend", nargs="+", metavar="NAME",
                           help="registered schedule names (default: every one that applies)")
    comparing.add_argument("--optimal", action="store_true", help="add the CP-SAT solver's schedule (row 'cpsat')")
    comparing.add_argument("--frontier", metavar="START:STOP:STEP",
                           help="also solve at these memory limits; the report shows the frontier")
    comparing.add_argument("--time-limit", type=float, help="seconds per solve, --optimal or --frontier (default 60)")
    comparing.add_argument("--no-bounds", dest="bounds", action="store_false",
                           help="skip the lower bounds (up to 5 s a problem): no bound and no gap, for sweeps")
    comparing.add_argument("--verbose", action="store_true",
                           help="list each schedule that does not apply with its reason (default: their names)")
    comparing.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    add_order_flag(comparing)
    add_deterministic_flag(comparing)
    add_quiet_flag(comparing)
    add_input_flags(comparing, output_help="write an HTML report (.html) with every schedule's charts, every row's "
                                           "trace for Perfetto (.trace.json) or the comparison chart (.png, .svg, "
                                           ".pdf)")
    add_style_flag(comparing)
    comparing.set_defaults(run=_command_compare)
    blocking = commands.add_parser("block", help="the optimal building block (least interval T) under the memory "
                                   "limit, beside the published ones")
    blocking.add_argument("--time-limit", type=float, default=10.0, help="seconds for the whole search (default 10)")
    blocking.add_argument("--workers", type=int, default=2, help="solver threads (default 2)")
    blocking.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    blocking.add_argument("--json", action="store_true", help="print one JSON object")
    add_quiet_flag(blocking)
    add_input_flags(blocking, output_help="draw the block (.png, .svg or .pdf)")
    add_style_flag(blocking)
    blocking.set_defaults(run=_command_block)
    _add_frontier(commands)


def _add_frontier(commands) -> None:
    sweeping = commands.add_parser("frontier", help="the optimal makespan at each memory limit of a sweep")
    sweeping.add_argument("--memory-limits", required=True, metavar="START:STOP:STEP",
                          help="per-device memory limits to solve at, STOP included (e.g. 1:8:1)")
    sweeping.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve (default 60)")
    sweeping.add_argument("--workers", type=int, help="solves at once, one process each (default: one per core)")
    sweeping.add_argument("--dask", metavar="ADDRESS",
                          help="run the solves on a dask.distributed cluster, e.g. tcp://host:8786")
    sweeping.add_argument("--json", action="store_true", help="print the frontier as one JSON object")
    add_quiet_flag(sweeping)
    add_input_flags(sweeping, output_help="write the frontier figure (.png, .svg or .pdf)")
    add_style_flag(sweeping)
    sweeping.set_defaults(run=_command_frontier)


def _command_compare(args: argparse.Namespace) -> int:
    from zbopt.planning.comparison import compare
    from zbopt.planning.frontier import memory_frontier, parse_memory_limits

    if args.time_limit is not None and not (args.optimal or args.frontier):
        raise ZboptError("--time-limit applies to --optimal and --frontier only")
    if args.deterministic and args.frontier is not None:
        raise ZboptError("--deterministic applies to the table (and --optimal), not to --frontier")
    if args.verbose and (args.json or args.quiet):
        raise ZboptError(f"--verbose lengthens the printed table; {'--json' if args.json else '--quiet'} prints none")
    run = run_config(config_file(args), flag_values(args))
    frontier_limits = None if args.frontier is None else parse_memory_limits(args.frontier)
    outputs = output_flag(args)
    if not outputs:
        figure_style(args, None)  # --style without a chart to draw is an error, not ignored
    kinds = [(_comparison_output(args, output), output) for output in outputs]
    check_outputs(args, [("-o", output) for output in outputs])
    limit = {} if args.time_limit is None else {"time_limit": args.time_limit}  # the frontier's: per solve
    clock = {} if args.time_limit is None or args.frontier is not None else \
        {"time_limit": command_clock(args, "compare")}
    comparison, stop = interrupt.answer_of(lambda: compare(run.problem, args.schedule, optimal=args.optimal,
                                                 progress=live(args), bounds=args.bounds, order=args.order,
                                                 deterministic=args.deterministic, **(clock or limit)))
    frontier = None
    if frontier_limits is not None and stop is None:
        frontier, stop = interrupt.answer_of(lambda: memory_frontier(run.problem, frontier_limits, progress=live(args),
                                                           **limit))
    _show_comparison(args, kinds, comparison, frontier)
    if stop is not None:
        raise stop
    return 0


def _show_comparison(args: argparse.Namespace, kinds: list[tuple[str, str]], comparison, frontier) -> None:
    """Print the comparison (and the frontier) and write what each `-o` asked for."""
    if args.json:
        print(json_text(comparison.to_dicts()))
        if comparison.not_run:  # the rows are the JSON: say on stderr which schedules have none
            from zbopt.presentation.tables import NOT_RUN

            print(f"zbopt: not run ({NOT_RUN}): {', '.join(comparison.not_run)}", file=sys.stderr)
    elif talks(args):
        print(format_comparison(comparison, verbose=args.verbose))
        if frontier is not None:
            print("\n" + format_frontier(frontier))
    for kind, output in kinds:
        _write_comparison(args, kind, output, comparison, frontier)
        if talks(args):
            print(f"\n{kind} written to {output}")


def _comparison_output(args: argparse.Namespace, output: str) -> str:
    """What `compare -o` writes, told by the file's name and checked before any work: "report"
    (.html), "trace" (every row's, in one file: .trace.json) or "comparison chart" (.png, .svg, .pdf)."""
    from zbopt.presentation.plot import FIGURE_FORMATS
    from zbopt.presentation.report import REPORT_FORMATS

    name = output.lower()
    if name.endswith(REPORT_FORMATS):
        if args.style is not None:
            raise ZboptError(f"--style {args.style}: the HTML report has one style; --style draws a chart "
                             f"({', '.join(FIGURE_FORMATS)})")
        return "report"
    if not name.endswith((TRACE_EXTENSION, *FIGURE_FORMATS)):
        raise ZboptError(f"output file '{output}': unsupported extension, use {', '.join(REPORT_FORMATS)} (a report), "
                         f"{TRACE_EXTENSION} (a trace) or {', '.join(FIGURE_FORMATS)} (the comparison chart)")
    if args.frontier is not None:
        raise ZboptError(f"--frontier: '{output}' would leave the frontier out; write a report (.html), or its "
                         "figure with zbopt frontier -o")
    if name.endswith(TRACE_EXTENSION):
        figure_style(args, None)  # a trace has no style: --style is an error here
        return "trace"
    figure_style(args, output)
    return "comparison chart"


def _write_comparison(args: argparse.Namespace, kind: str, output: str, comparison, frontier) -> None:
    """Write what `_comparison_output` chose."""
    from zbopt.io.trace import write_comparison_trace
    from zbopt.presentation.plot import plot_comparison
    from zbopt.presentation.report import write_report

    if kind == "report":
        write_report(output, comparison, frontier=frontier)
    elif kind == "trace":
        write_comparison_trace(output, comparison)
    else:
        plot_comparison(comparison, output, style=figure_style(args, output))


def _command_block(args: argparse.Namespace) -> int:
    from zbopt.solvers.blocks import block_schedule
    from zbopt.solvers.blocks.search import optimal_block, published_rows

    run = run_config(config_file(args), flag_values(args))
    figures = figure_paths(args, getattr(args, "output_file", []))
    check_outputs(args, [("-o", figure) for figure in figures])
    with interrupt.stoppable():  # Ctrl-C stops the block search's solves: it returns its best so far
        search = optimal_block(run.problem, time_limit=args.time_limit, workers=args.workers, seed=args.seed)
        stop = interrupt.Interrupted(search) if interrupt.requested.is_set() else None
    simulation = simulate(run.problem, block_schedule(search.block))
    published = published_rows(run.problem)
    if args.json:
        print(json_text({**search.to_dict(), "schedule": {"makespan": simulation.makespan,
                                                          "peak_memory": list(simulation.peak_memory)},
                          "published": published}))
    elif talks(args):
        print(format_block(search, simulation, published))
    for figure in figures:
        from zbopt.presentation.plot.block import plot_block

        plot_block(search.block, figure, style=figure_style(args, figure))
        if talks(args):
            print(f"\nblock drawing written to {figure}")
    if stop is not None:
        raise stop
    return 0


def _check_frontier_flags(args: argparse.Namespace) -> None:
    """--workers and --dask exclude each other; the sweep, not --memory-limit, sets one limit for
    every device (per-device limits that differ, the sweep scales)."""
    if args.dask is not None and args.workers is not None:
        raise ZboptError("--workers and --dask: give one (a dask cluster has its own workers)")
    if args.workers is not None and args.workers < 1:
        raise ZboptError(f"--workers {args.workers}: must be at least 1")
    given = getattr(args, "memory_limit", None)
    if given is not None and len(set(given if isinstance(given, list) else [given])) == 1:
        raise ZboptError(f"--memory-limit {given}: the sweep sets the limit; give --memory-limits START:STOP:STEP "
                         "(per-device limits that differ are scaled by the sweep's factors instead)")


def _command_frontier(args: argparse.Namespace) -> int:
    from zbopt.planning.frontier import memory_frontier, parse_memory_limits

    _check_frontier_flags(args)
    limits = parse_memory_limits(args.memory_limits)
    run = run_config(config_file(args), flag_values(args))
    figures = figure_paths(args, output_flag(args))
    check_outputs(args, [("-o", figure) for figure in figures])
    with contextlib.ExitStack() as stack:
        executor = None  # memory_frontier's own pool: args.workers processes, or one per core
        if args.dask is not None:
            executor = stack.enter_context(dask_client(args.dask)).get_executor()
        frontier, stop = interrupt.answer_of(lambda: memory_frontier(run.problem, limits, time_limit=args.time_limit,
                                                           executor=executor, workers=args.workers,
                                                           progress=live(args)))
    _show_frontier(args, frontier, figures)
    if stop is not None:
        raise stop
    return 0


def _show_frontier(args: argparse.Namespace, frontier, figures: list[str]) -> None:
    """Print the frontier and draw it, as asked."""
    if args.json:
        print(json_text(frontier.to_dict()))
    elif talks(args):
        print(format_frontier(frontier))
    for figure in figures:
        from zbopt.presentation.plot import plot_frontier

        plot_frontier(frontier, figure, style=figure_style(args, figure))
        if talks(args):
            print(f"\nfrontier figure written to {figure}")
