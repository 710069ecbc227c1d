"""The `zbopt` command line. Any mistake in the input is one line on stderr and exit status 2.

Exit status: 0 done; 1 the schedule ran but breaks the problem's memory limit (or, for run-torch
and profile-torch, its gradients differ from the reference); 2 bad input; 130 interrupted;
141 the reader of stdout left (`zbopt ... | head`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys

from zbopt.errors import MissingSettingsError, ZboptError
from zbopt.flags import (
    add_input_flags,
    add_quiet_flag,
    add_schedule_flags,
    add_style_flag,
    config_file,
    flag_values,
)
from zbopt.io.export import EXPORT_FORMATS, check_export, check_output_directory, write_export
from zbopt.io.inputs import is_schedule_file, run_and_schedule, run_config
from zbopt.io.trace import TRACE_EXTENSION, write_measured_trace
from zbopt.schedules import get, registered
from zbopt.simulation import Simulation, simulate
from zbopt.solvers.api import SOLVERS
from zbopt.tables import format_block, format_comparison, format_frontier, format_simulation, format_solve

EXIT_INVALID_SCHEDULE = 1
EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a process ended by SIGPIPE
DASK_CONNECT_TIMEOUT_S = 10


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (plus exit 2) instead of a usage dump."""

    def error(self, message: str):
        raise ZboptError(f"{message} (see '{self.prog} --help')")


def _inputs(args: argparse.Namespace):
    """The run config and schedule of `simulate` and `export`. A schedule file in CONFIG's place
    is the schedule file, so `-c CONFIG` can still give its costs."""
    if args.schedule_file is None and args.config and args.config_flag and is_schedule_file(args.config):
        args.schedule_file, args.config = args.config, None
    return run_and_schedule(config_file(args), flag_values(args), args.schedule, dict(args.option), args.schedule_file)


def _output_flag(args: argparse.Namespace) -> str | None:
    """-o's file unless --no-visualization; a config's output_file names a Gantt chart only."""
    return None if args.no_visualization else getattr(args, "output_file", None)


def _talks(args: argparse.Namespace) -> bool:
    """Whether to print text on stdout: not with --json or --quiet."""
    return not (args.json or args.quiet)


def _live(args: argparse.Namespace) -> bool:
    """Whether to draw a live progress line on stderr: on a terminal, unless --json or --quiet."""
    return _talks(args) and sys.stderr.isatty()


def _command_schedules(args: argparse.Namespace) -> int:
    entries = registered()
    if args.json:
        print(json.dumps([{"name": e.name, "summary": e.summary} for e in entries], indent=1))
    else:
        width = max(len(e.name) for e in entries)
        for entry in entries:
            print(f"{entry.name:<{width}}  {entry.summary}")
    return 0


def _figure_path(args: argparse.Namespace, output_file: str | None) -> str | None:
    """Where to write the chart (checked before any work, with its --style), or None."""
    from zbopt.plot import check_figure_path

    figure = None if args.no_visualization else output_file
    if figure is not None:
        check_figure_path(figure)
    _figure_style(args, figure)
    return figure


def _figure_style(args: argparse.Namespace, figure: str | None) -> str:
    """--style, checked before any work: it needs a figure to write."""
    from zbopt.plot import check_style

    if args.style is None:
        return "screen"
    if figure is None:
        raise ZboptError(f"--style {args.style}: no figure to draw it in (give -o FILE.png, .svg or .pdf)")
    check_style(args.style)
    return args.style


def _command_simulate(args: argparse.Namespace) -> int:
    from zbopt.plot import plot_gantt

    run, schedule = _inputs(args)
    figure = _figure_path(args, run.output_file)
    simulation = simulate(run.problem, schedule)
    print(json.dumps(simulation.to_dict()) if args.json else format_simulation(simulation))
    if figure is not None:
        plot_gantt(simulation, figure, style=_figure_style(args, figure))
        if not args.json:
            print(f"\nGantt chart written to {figure}")
    return _exit_status(simulation)


def _exit_status(simulation: Simulation) -> int:
    """0 for a valid schedule; else each memory violation on stderr and EXIT_INVALID_SCHEDULE."""
    for violation in simulation.violations:
        print(f"zbopt: invalid schedule: {violation}", file=sys.stderr)
    return 0 if simulation.valid else EXIT_INVALID_SCHEDULE


def _command_export(args: argparse.Namespace) -> int:
    target = getattr(args, "output_file", None)
    if target is None:
        raise ZboptError("export needs -o FILE")
    check_export(target, given=args.format)
    run, schedule = _inputs(args)
    simulation = simulate(run.problem, schedule)  # a deadlock fails here, before anything is written
    written = write_export(target, simulation, args.format)
    print(f"{EXPORT_FORMATS[written]} written to {target}")
    return _exit_status(simulation)  # over the memory limit: written as asked, but said


def _command_solve(args: argparse.Namespace) -> int:
    from zbopt.plot import plot_gantt
    from zbopt.solvers import solve

    run = run_config(config_file(args), flag_values(args))
    figure = _figure_path(args, run.output_file)
    if args.export is not None:
        check_export(args.export, run.problem)
    if args.warm_start is not None:
        get(args.warm_start)
    result = solve(run.problem, args.solver, time_limit=args.time_limit, objective=args.objective,
                   warm_start=args.warm_start, workers=args.workers, seed=args.seed, progress=_live(args))
    if args.json:
        print(json.dumps(result.to_dict()))
    elif _talks(args):
        print(format_solve(result))
    if result.simulation is None:
        if args.export is not None:
            print(f"zbopt: no schedule found ({result.status}); {args.export} not written", file=sys.stderr)
        return 0
    if figure is not None:
        plot_gantt(result.simulation, figure, style=_figure_style(args, figure))
        if _talks(args):
            print(f"\nGantt chart written to {figure}")
    if args.export is not None:
        written = write_export(args.export, result.simulation, with_times=True)
        if _talks(args):
            print(f"\n{EXPORT_FORMATS[written]} written to {args.export}")
    return 0


def _command_compare(args: argparse.Namespace) -> int:
    from zbopt.comparison import compare
    from zbopt.frontier import memory_frontier, parse_memory_limits

    if args.time_limit is not None and not (args.optimal or args.frontier):
        raise ZboptError("--time-limit applies to --optimal and --frontier only")
    run = run_config(config_file(args), flag_values(args))
    frontier_limits = None if args.frontier is None else parse_memory_limits(args.frontier)
    output = _output_flag(args)
    if output is None:
        _figure_style(args, None)  # --style without a chart to draw is an error, not ignored
    kind = None if output is None else _comparison_output(args, output)
    limit = {} if args.time_limit is None else {"time_limit": args.time_limit}
    comparison = compare(run.problem, args.schedule, optimal=args.optimal, progress=_live(args), **limit)
    frontier = None
    if frontier_limits is not None:
        frontier = memory_frontier(run.problem, frontier_limits, progress=_live(args), **limit)
    if args.json:
        print(json.dumps(comparison.to_dicts()))
    elif _talks(args):
        print(format_comparison(comparison))
        if frontier is not None:
            print("\n" + format_frontier(frontier))
    if kind is not None:
        _write_comparison(args, kind, output, comparison, frontier)
        if _talks(args):
            print(f"\n{kind} written to {output}")
    return 0


def _comparison_output(args: argparse.Namespace, output: str) -> str:
    """What `compare -o` writes, told by the file's name and checked before any work: "report"
    (.html), "trace" (every row's, in one file: .trace.json) or "comparison chart" (.png, .svg, .pdf)."""
    from zbopt.plot import FIGURE_FORMATS
    from zbopt.report import REPORT_FORMATS

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
        _figure_style(args, None)  # a trace has no style: --style is an error here
        return "trace"
    _figure_style(args, output)
    return "comparison chart"


def _write_comparison(args: argparse.Namespace, kind: str, output: str, comparison, frontier) -> None:
    """Write what `_comparison_output` chose."""
    from zbopt.io.trace import write_comparison_trace
    from zbopt.plot import plot_comparison
    from zbopt.report import write_report

    if kind == "report":
        write_report(output, comparison, frontier=frontier)
    elif kind == "trace":
        write_comparison_trace(output, comparison)
    else:
        plot_comparison(comparison, output, style=_figure_style(args, output))


def _command_block(args: argparse.Namespace) -> int:
    from zbopt.blocks import block_schedule
    from zbopt.blocks.search import optimal_block, published_rows
    from zbopt.plot.block import plot_block

    run = run_config(config_file(args), flag_values(args))
    figure = _figure_path(args, getattr(args, "output_file", None))
    search = optimal_block(run.problem, time_limit=args.time_limit, workers=args.workers, seed=args.seed)
    simulation = simulate(run.problem, block_schedule(search.block))
    published = published_rows(run.problem)
    if args.json:
        print(json.dumps({**search.to_dict(), "schedule": {"makespan": simulation.makespan,
                                                          "peak_memory": list(simulation.peak_memory)},
                          "published": published}))
    elif _talks(args):
        print(format_block(search, simulation, published))
    if figure is not None:
        plot_block(search.block, figure, style=_figure_style(args, figure))
        if _talks(args):
            print(f"\nblock drawing written to {figure}")
    return 0


def _dask_client(address: str):
    """A dask.distributed Client connected to the scheduler at `address` (an optional dependency)."""
    try:
        from distributed import Client
    except ImportError:
        raise ZboptError("--dask needs dask.distributed: pip install 'zbopt[dask]'") from None
    try:
        return Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as error:
        raise ZboptError(f"--dask {address}: cannot connect to the scheduler ({error})") from None


def _command_frontier(args: argparse.Namespace) -> int:
    from zbopt.frontier import memory_frontier, parse_memory_limits, process_pool
    from zbopt.plot import plot_frontier

    if args.dask is not None and args.workers is not None:
        raise ZboptError("--workers and --dask: give one (a dask cluster has its own workers)")
    if args.workers is not None and args.workers < 1:
        raise ZboptError(f"--workers {args.workers}: must be at least 1")
    if hasattr(args, "memory_limit"):
        raise ZboptError("--memory-limit: the sweep sets the limit; give --memory-limits START:STOP:STEP")
    limits = parse_memory_limits(args.memory_limits)
    run = run_config(config_file(args), flag_values(args))
    figure = _figure_path(args, _output_flag(args))
    with contextlib.ExitStack() as stack:
        if args.dask is not None:
            executor = stack.enter_context(_dask_client(args.dask)).get_executor()
        elif args.workers is not None:
            executor = stack.enter_context(process_pool(args.workers))
        else:
            executor = None  # memory_frontier's own pool, one process per core
        frontier = memory_frontier(run.problem, limits, time_limit=args.time_limit, executor=executor,
                                   progress=_live(args))
    if args.json:
        print(json.dumps(frontier.to_dict()))
    elif _talks(args):
        print(format_frontier(frontier))
    if figure is not None:
        plot_frontier(frontier, figure, style=_figure_style(args, figure))
        if _talks(args):
            print(f"\nfrontier figure written to {figure}")
    return 0


def _torch_run_options(args: argparse.Namespace) -> dict:
    return {"steps": args.steps, "microbatch_size": args.microbatch_size, "hidden": args.hidden,
            "layers_per_stage": args.layers_per_stage, "seed": args.seed, "timeout_s": args.timeout}


def _say_if_gradients_differ(report) -> None:
    """The reason for exit status 1 on stderr, when the run's gradients differ from the reference."""
    if not report.passed:
        print(f"zbopt: {report.path}: gradients differ from the single-process reference "
              f"(max abs diff {report.max_abs_diff:.3g})", file=sys.stderr)


def _command_run_torch(args: argparse.Namespace) -> int:
    from zbopt.runtime import format_report, run_torch

    if args.trace is not None:
        check_output_directory(args.trace)
    report = run_torch(args.schedule, **_torch_run_options(args))
    _say_if_gradients_differ(report)
    print(json.dumps(report.to_dict()) if args.json else format_report(report))
    if args.trace is not None:
        write_measured_trace(args.trace, report)
        if not args.json:
            print(f"measured trace of the last step written to {args.trace}")
    return 0 if report.passed else EXIT_INVALID_SCHEDULE


def _command_profile_torch(args: argparse.Namespace) -> int:
    from zbopt.runtime import format_report, profile_torch

    check_output_directory(args.output)
    report, config = profile_torch(args.schedule, args.output, **_torch_run_options(args))
    _say_if_gradients_differ(report)
    print(format_report(report))
    if config is None:  # a wrong run: nothing written
        return EXIT_INVALID_SCHEDULE
    print(f"config written to {args.output} (try: zbopt solve {args.output})")
    return 0


def _add_torch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", metavar="SCHEDULE.csv",
                        help="torch compute-only CSV: one row per rank, cells like 0F1, 2I0, 2W0, 1B3")
    parser.add_argument("--steps", type=int, default=3, help="training steps, the first an untimed warm-up (default 3)")
    parser.add_argument("--microbatch-size", type=int, default=8, help="samples per microbatch (default 8)")
    parser.add_argument("--hidden", type=int, default=128, help="width of the MLP's Linear layers (default 128)")
    parser.add_argument("--layers-per-stage", type=int, default=2, help="Linear+Tanh layers per stage (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and data (default 0)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before the ranks are killed (default 120)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zbopt", description="Pipeline-parallel schedules: simulate, compare, optimize.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    listing = commands.add_parser("schedules", help="list the registered schedules")
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    listing.set_defaults(run=_command_schedules)
    simulating = commands.add_parser("simulate", help="simulate one schedule and print its metrics")
    add_schedule_flags(simulating)
    simulating.add_argument("--json", action="store_true", help="print one JSON object")
    add_input_flags(simulating)
    add_style_flag(simulating)
    simulating.set_defaults(run=_command_simulate)
    exporting = commands.add_parser("export", help="write a schedule for torch.distributed.pipelining or Megatron-LM, "
                                                   "or as a trace for Perfetto")
    add_schedule_flags(exporting)
    exporting.add_argument("--format", choices=list(EXPORT_FORMATS),
                           help="torch-csv (torch's compute-only CSV), megatron (Megatron-LM's per-rank order, JSON), "
                                "json (zbopt's schedule JSON) or chrome-trace (Perfetto / chrome://tracing); default "
                                "from -o's extension (.csv, .json, .trace.json)")
    add_input_flags(exporting, output_help="the file to write (required)")
    exporting.set_defaults(run=_command_export)
    solving = commands.add_parser("solve", help="find the optimal schedule under the memory limit")
    solving.add_argument("--solver", default="cpsat", choices=SOLVERS,
                         help="cpsat (OR-Tools CP-SAT; on 600 ops or more, LNS takes the second half of the "
                              "search unless CP-SAT proved its answer), the MILP with cbc or highs, or lns (CP-SAT "
                              "window by window from the warm start; proves nothing itself) (default cpsat)")
    solving.add_argument("--objective", default="makespan", choices=["makespan", "span"],
                         help="minimize the makespan or the longest device span (the ZB paper's)")
    solving.add_argument("--time-limit", type=float, default=60.0, help="seconds (default 60)")
    solving.add_argument("--warm-start", help="heuristic to start from (default: the best valid one)")
    solving.add_argument("--workers", type=int, default=2, help="solver threads (default 2)")
    solving.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    solving.add_argument("--json", action="store_true", help="print one JSON object")
    add_quiet_flag(solving)
    solving.add_argument("--export", metavar="FILE", help="write the schedule found: .csv torch CSV, .json zbopt JSON, "
                                                         ".trace.json a trace for Perfetto")
    add_input_flags(solving)
    add_style_flag(solving)
    solving.set_defaults(run=_command_solve)
    comparing = commands.add_parser("compare", help="simulate several schedules (and the optimum) side by side")
    comparing.add_argument("--schedule", action="extend", nargs="+", metavar="NAME",
                           help="registered schedule names (default: every one that applies)")
    comparing.add_argument("--optimal", action="store_true", help="add the CP-SAT solver's schedule (row 'cpsat')")
    comparing.add_argument("--frontier", metavar="START:STOP:STEP",
                           help="also solve at these memory limits; the report shows the frontier")
    comparing.add_argument("--time-limit", type=float, help="seconds per solve, --optimal or --frontier (default 60)")
    comparing.add_argument("--json", action="store_true", help="print the rows as a JSON list")
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
    running = commands.add_parser("run-torch", help="run a torch CSV schedule in torch.distributed.pipelining, "
                                  "check its gradients and time its ops")
    _add_torch_flags(running)
    running.add_argument("--json", action="store_true", help="print one JSON object")
    running.add_argument("--trace", metavar="FILE", help="write the last step as a trace for Perfetto, as "
                                                         "`export --format chrome-trace` writes the predicted one")
    running.set_defaults(run=_command_run_torch)
    profiling = commands.add_parser("profile-torch", help="run a torch CSV schedule and write its measured costs "
                                    "as a zbopt config")
    _add_torch_flags(profiling)
    profiling.add_argument("-o", "--output", required=True, metavar="CONFIG.yaml",
                           help="config file to write (.yaml, or .json)")
    profiling.set_defaults(run=_command_profile_torch)
    return parser


def _command_with(argv: list[str], settings: dict[str, object]) -> str:
    """The user's command line with flags that set `settings` (config key -> value) appended: a
    flag overrides the config file and an earlier flag."""
    flags = [token for key, value in settings.items() for token in (f"--{key.replace('_', '-')}", str(value))]
    return shlex.join(["zbopt", *argv, *flags])


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    argv = sys.argv[1:] if argv is None else [str(token) for token in argv]
    try:
        args, unknown = build_parser().parse_known_args(argv)
        if unknown:  # argparse's own message would point to the top-level help, not the command's
            raise ZboptError(f"unrecognized arguments: {' '.join(unknown)} (see 'zbopt {args.command} --help')")
        return args.run(args)
    except MissingSettingsError as error:
        print(f"zbopt: {error}; try: {_command_with(argv, error.settings)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ZboptError as error:
        print(f"zbopt: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader left (`zbopt ... | head`): stop quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as error:
        print(f"zbopt: {error.filename or ''}: {error.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("zbopt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
