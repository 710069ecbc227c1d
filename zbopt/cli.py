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
from pathlib import Path

import yaml

from zbopt.errors import MissingSettingsError, ZboptError
from zbopt.io.config import PROBLEM_KEYS, RunConfig, build_run_config, load_config, read_config_file
from zbopt.io.torch_format import check_exportable, read_torch_csv, write_megatron_order, write_torch_csv
from zbopt.problem import Problem
from zbopt.schedule import Schedule, load_schedule, save_schedule
from zbopt.schedules import TORCH_PREFIX, TORCH_REFUSED, TORCH_SCHEDULES, get, named_schedule, registered
from zbopt.simulate import Simulation, simulate

EXIT_INVALID_SCHEDULE = 1
EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a process ended by SIGPIPE
DASK_CONNECT_TIMEOUT_S = 10
EXPORT_FORMATS = {"torch-csv": "torch CSV", "megatron": "Megatron-LM order", "json": "zbopt schedule JSON"}
EXPORT_EXTENSIONS = {".csv": "torch-csv", ".json": "json"}  # the format `solve --export` and `export` infer
_RUNNABLE_TORCH_SCHEDULES = [name for name in TORCH_SCHEDULES if name not in TORCH_REFUSED]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (plus exit 2) instead of a usage dump."""

    def error(self, message: str):
        raise ZboptError(f"{self.prog}: {message} (see '{self.prog} --help')")


def _numbers(text: str) -> list[float]:
    """One flag token: a number, or comma-separated numbers ("1,2,3")."""
    try:
        return [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers, got '{text}'") from None


def _schedule_option(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE read as a YAML scalar (8 -> int, 0.5 -> float, true -> bool)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got '{text}'")
    return key.strip(), yaml.safe_load(value)


def _add_problem_flags(parser: argparse.ArgumentParser) -> None:
    """Every config key as a flag, with the 1F1B visualizer's spellings. Flags override the file."""
    group = parser.add_argument_group("problem (each flag overrides the config file's key)")
    add = group.add_argument
    suppress = argparse.SUPPRESS
    add("--num-stages", "--num-devices", "-s", dest="num_stages", type=int, default=suppress,
        help="pipeline devices p (default 4)")
    add("--num-microbatches", "--num-batches", "-b", dest="num_microbatches", type=int, default=suppress,
        help="microbatches m per iteration (default 8)")
    add("--chunks-per-device", "-v", dest="chunks_per_device", type=int, default=suppress,
        help="model chunks per device (default 1)")
    add("--placement", default=suppress, help="stage placement: loop or v (default loop)")
    add("--forward-times", "-f", dest="forward_times", type=_numbers, nargs="+", default=suppress,
        help="F time, one value or one per virtual stage (default 1)")
    add("--backward-times", "-bw", dest="backward_times", type=_numbers, nargs="+", default=suppress,
        help="backward time: B when --weight-times is given, else the fused BW (default 2)")
    add("--weight-times", "-w", dest="weight_times", type=_numbers, nargs="+", default=suppress,
        help="W time (splits the backward into B and W)")
    add("--p2p-time", dest="p2p_time", type=float, default=suppress, help="latency between devices (default 0)")
    add("--activation-memory", dest="activation_memory", type=_numbers, nargs="+", default=suppress,
        help="M_B per virtual stage (default 1)")
    add("--weight-memory", dest="weight_memory", type=_numbers, nargs="+", default=suppress,
        help="M_W per virtual stage (split backward only; default half of M_B)")
    add("--memory-limit", dest="memory_limit", type=_numbers, nargs="+", default=suppress,
        help="memory cap per device (default none)")
    add("--iterations", type=int, default=suppress, help="optimizer steps back to back (default 1)")
    add("--no-flush", dest="flush", action="store_false", default=suppress,
        help="iterations do not wait for each other's weight update (PipeDream-2BW double buffering)")


def _add_schedule_flags(parser: argparse.ArgumentParser) -> None:
    """Which schedule: a registered name with its options, a torch built-in, or a file."""
    parser.add_argument("--schedule", metavar="NAME",
                        help=f"registered schedule name (default 1f1b), or {TORCH_PREFIX}NAME for a torch."
                             f"distributed.pipelining built-in ({', '.join(_RUNNABLE_TORCH_SCHEDULES)}; "
                             f"needs torch)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", type=_schedule_option,
                        help="an option of the schedule's generator, e.g. microbatch_group_size_per_vp_stage=8")
    parser.add_argument("--schedule-file", metavar="FILE",
                        help="a torch compute-only CSV (.csv; its ranks, stages and microbatches fill what the "
                             "config leaves out) or a zbopt schedule JSON (its stored problem fills what the "
                             "config and flags leave out)")


def _add_input_flags(parser: argparse.ArgumentParser,
                     output_help: str = "write a Gantt chart (.png, .svg or .pdf)") -> None:
    parser.add_argument("config", nargs="?", help="YAML or JSON config file (optional)")
    parser.add_argument("-c", "--config", dest="config_flag", metavar="CONFIG", help="same as the positional CONFIG")
    parser.add_argument("-o", "--output", "--output-file", dest="output_file", default=argparse.SUPPRESS,
                        help=output_help)
    parser.add_argument("--no-visualization", action="store_true", help="write no chart, even if the config names one")
    _add_problem_flags(parser)


def _flag_values(args: argparse.Namespace) -> dict:
    """The config keys the user gave as flags; a single number stays a scalar."""
    keys = ("num_stages", "num_microbatches", "chunks_per_device", "placement", "forward_times",
            "backward_times", "weight_times", "p2p_time", "activation_memory", "weight_memory",
            "memory_limit", "iterations", "flush", "output_file")
    values = {}
    for key in keys:
        if hasattr(args, key):
            value = getattr(args, key)
            if isinstance(value, list):
                flat = [number for token in value for number in token]
                value = flat[0] if len(flat) == 1 else flat
            values[key] = value
    return values


def _run_config(args: argparse.Namespace, layout: dict | None = None) -> RunConfig:
    """The problem from the config file and flags; `layout` (problem parameters a schedule file
    implies) fills each parameter neither of them gives."""
    if args.config and args.config_flag and args.config != args.config_flag:
        raise ZboptError(f"two config files given ('{args.config}' and '{args.config_flag}'); give one")
    path = args.config or args.config_flag
    flags = _flag_values(args)
    if layout:
        given = {PROBLEM_KEYS.get(key, key) for key in [*(read_config_file(path) if path else {}), *flags]}
        flags.update({key: value for key, value in layout.items() if key not in given})
    return load_config(path, flags) if path else build_run_config(flags, source="flags")


def _schedule_from_file(args: argparse.Namespace) -> tuple[RunConfig, Schedule]:
    """--schedule-file: a torch CSV (.csv), whose layout fills what the config and flags leave out,
    or a zbopt JSON schedule, whose stored problem fills what the config and flags leave out."""
    path = Path(args.schedule_file)
    if path.suffix.lower() == ".csv":
        order = read_torch_csv(path)
        run = _run_config(args, order.layout)
        return run, order.to_schedule(run.problem, path.name)
    schedule, stored = load_schedule(path)
    return _run_config(args, None if stored is None else stored.to_dict()), schedule


def _named_schedule(args: argparse.Namespace, problem: Problem) -> Schedule:
    """--schedule NAME (default 1f1b) with its --option's, or torch:NAME, a torch built-in."""
    return named_schedule(args.schedule or "1f1b", problem, **dict(args.option))


def _is_schedule_file(path: str) -> bool:
    """Whether a positional file is a schedule rather than a config: a torch CSV, or a JSON with
    the 'orders' of a zbopt schedule (`zbopt export SCHEDULE.json -o FILE.csv`)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return True
    return suffix == ".json" and "orders" in read_config_file(path)


def _run_and_schedule(args: argparse.Namespace) -> tuple[RunConfig, Schedule]:
    """The problem and the schedule of `simulate` and `export`: from --schedule-file (or a
    schedule file given in the config's place) or by name."""
    if args.schedule_file is None and args.config and _is_schedule_file(args.config):
        args.schedule_file, args.config = args.config, None
    if args.schedule_file is None:
        run = _run_config(args)
        return run, _named_schedule(args, run.problem)
    if args.schedule is not None or args.option:
        raise ZboptError("--schedule-file: give it without --schedule and --option")
    return _schedule_from_file(args)


def _format_table(simulation: Simulation) -> str:
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


def _command_schedules(args: argparse.Namespace) -> int:
    entries = registered()
    if args.json:
        print(json.dumps([{"name": e.name, "summary": e.summary} for e in entries], indent=1))
    else:
        width = max(len(e.name) for e in entries)
        for entry in entries:
            print(f"{entry.name:<{width}}  {entry.summary}")
    return 0


def _figure_path(args: argparse.Namespace, run: RunConfig) -> str | None:
    """Where to write the Gantt chart (checked before any work), or None."""
    from zbopt.plot import check_figure_path

    figure = None if args.no_visualization else run.output_file
    if figure is not None:
        check_figure_path(figure)
    return figure


def _command_simulate(args: argparse.Namespace) -> int:
    from zbopt.plot import plot_gantt

    run, schedule = _run_and_schedule(args)
    figure = _figure_path(args, run)
    simulation = simulate(run.problem, schedule)
    if args.json:
        print(json.dumps(simulation.to_dict()))
    else:
        print(_format_table(simulation))
    if figure is not None:
        plot_gantt(simulation, figure)
        if not args.json:
            print(f"\nGantt chart written to {figure}")
    return _exit_status(simulation)


def _exit_status(simulation: Simulation) -> int:
    """0 for a valid schedule; else each memory violation on stderr and EXIT_INVALID_SCHEDULE."""
    for violation in simulation.violations:
        print(f"zbopt: invalid schedule: {violation}", file=sys.stderr)
    return 0 if simulation.valid else EXIT_INVALID_SCHEDULE


def _export_format(path: str, given: str | None) -> str:
    """The export format: `given`, else from the file's extension (.csv torch CSV, .json zbopt JSON)."""
    if given is not None:
        return given
    suffix = Path(path).suffix.lower()
    if suffix not in EXPORT_EXTENSIONS:
        raise ZboptError(f"'{path}': cannot tell the export format from '{suffix or 'no extension'}' "
                         f"(.csv torch CSV, .json zbopt JSON; or give --format)")
    return EXPORT_EXTENSIONS[suffix]


def _write_export(path: str, export_format: str, problem: Problem, schedule: Schedule) -> None:
    """Write `schedule` (already simulated: a broken one raised there) as `export_format`."""
    if export_format == "torch-csv":
        write_torch_csv(path, problem, schedule)
    elif export_format == "megatron":
        write_megatron_order(path, problem, schedule)
    else:
        save_schedule(path, schedule, problem)


def _check_output_directory(path: str) -> None:
    """Fail before any work when the file to write cannot be created."""
    if not Path(path).resolve().parent.is_dir():
        raise ZboptError(f"'{path}': no such directory")


def _command_export(args: argparse.Namespace) -> int:
    target = getattr(args, "output_file", None)
    if target is None:
        raise ZboptError("export needs -o FILE")
    export_format = _export_format(target, args.format)
    _check_output_directory(target)
    run, schedule = _run_and_schedule(args)
    simulation = simulate(run.problem, schedule)  # a deadlock fails here, before anything is written
    _write_export(target, export_format, run.problem, schedule)
    print(f"{EXPORT_FORMATS[export_format]} written to {target}")
    return _exit_status(simulation)  # over the memory limit: written as asked, but said


def _command_solve(args: argparse.Namespace) -> int:
    from zbopt.plot import plot_gantt
    from zbopt.solvers import solve

    run = _run_config(args)
    figure = _figure_path(args, run)
    export_format = None if args.export is None else _export_format(args.export, None)
    if export_format is not None:
        check_exportable(run.problem, export_format)
        _check_output_directory(args.export)
    if args.warm_start is not None:
        get(args.warm_start)
    live = not (args.json or args.quiet) and sys.stderr.isatty()
    result = solve(run.problem, args.solver, time_limit=args.time_limit, objective=args.objective,
                   warm_start=args.warm_start, workers=args.workers, seed=args.seed, progress=live)
    if args.json:
        print(json.dumps(result.to_dict()))
    elif not args.quiet:
        gap = "n/a" if result.gap is None else f"{result.gap:.2%}"
        value = "none" if result.objective is None else f"{result.objective:.6g}"
        resolution = "no model built" if result.resolution is None else f"resolution {result.resolution:g}"
        print(f"status          {result.status}\n{args.objective:<16}{value}\n"
              f"lower_bound     {result.lower_bound:.6g}\ngap             {gap}\n"
              f"decided_by      {result.decided_by or 'n/a'}\n"
              f"solve_time_s    {result.solve_time_s:.2f}\nsolver          {result.solver} "
              f"({resolution})\nwarm_start      {result.warm_start or 'none'}\n")
        if result.simulation is not None:
            print(_format_table(result.simulation))
    if figure is not None and result.simulation is not None:
        plot_gantt(result.simulation, figure)
    if export_format is not None:
        if result.simulation is None:
            print(f"zbopt: no schedule found ({result.status}); {args.export} not written", file=sys.stderr)
        else:
            _write_export(args.export, export_format, run.problem, result.simulation.timed_orders())
    return 0


def _format_comparison(comparison) -> str:
    """The problem, the lower bound, then one aligned line per row (sorted by makespan), and the
    schedules left out with their reasons."""
    from zbopt.compare import COLUMNS

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
    return "\n".join(lines)


def _command_compare(args: argparse.Namespace) -> int:
    from zbopt.compare import compare
    from zbopt.frontier import memory_frontier, parse_memory_limits
    from zbopt.report import check_report_path, write_report

    if args.time_limit is not None and not (args.optimal or args.frontier):
        raise ZboptError("--time-limit applies to --optimal and --frontier only")
    run = _run_config(args)
    frontier_limits = None if args.frontier is None else parse_memory_limits(args.frontier)
    # the report comes from -o only: a config's output_file names a Gantt chart (the visualizer's key)
    report = None if args.no_visualization else getattr(args, "output_file", None)
    if report is not None:
        report = check_report_path(report)
    live = not args.json and sys.stderr.isatty()
    limit = {} if args.time_limit is None else {"time_limit": args.time_limit}
    comparison = compare(run.problem, args.schedule, optimal=args.optimal, progress=live, **limit)
    frontier = None
    if frontier_limits is not None:
        frontier = memory_frontier(run.problem, frontier_limits, progress=live, **limit)
    if args.json:
        print(json.dumps(comparison.to_dicts()))
    else:
        print(_format_comparison(comparison))
        if frontier is not None:
            print("\n" + _format_frontier(frontier))
    if report is not None:
        write_report(report, comparison, frontier=frontier)
        if not args.json:
            print(f"\nreport written to {report}")
    return 0


def _format_frontier(frontier) -> str:
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
        gap = "n/a" if point.gap is None else f"{point.gap:.2%}"
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
    from zbopt.plot import check_figure_path, plot_frontier

    if args.dask is not None and args.workers is not None:
        raise ZboptError("--workers and --dask: give one (a dask cluster has its own workers)")
    if args.workers is not None and args.workers < 1:
        raise ZboptError(f"--workers {args.workers}: must be at least 1")
    if hasattr(args, "memory_limit"):
        raise ZboptError("--memory-limit: the sweep sets the limit; give --memory-limits START:STOP:STEP")
    limits = parse_memory_limits(args.memory_limits)
    run = _run_config(args)
    # the figure comes from -o only: a config's output_file names a Gantt chart (the visualizer's key)
    figure = None if args.no_visualization else getattr(args, "output_file", None)
    if figure is not None:
        check_figure_path(figure)
    live = not args.json and sys.stderr.isatty()
    with contextlib.ExitStack() as stack:
        if args.dask is not None:
            executor = stack.enter_context(_dask_client(args.dask)).get_executor()
        elif args.workers is not None:
            executor = stack.enter_context(process_pool(args.workers))
        else:
            executor = None  # memory_frontier's own pool, one process per core
        frontier = memory_frontier(run.problem, limits, time_limit=args.time_limit, executor=executor,
                                   progress=live)
    if args.json:
        print(json.dumps(frontier.to_dict()))
    else:
        print(_format_frontier(frontier))
    if figure is not None:
        plot_frontier(frontier, figure)
        if not args.json:
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

    report = run_torch(args.schedule, **_torch_run_options(args))
    _say_if_gradients_differ(report)
    print(json.dumps(report.to_dict()) if args.json else format_report(report))
    return 0 if report.passed else EXIT_INVALID_SCHEDULE


def _command_profile_torch(args: argparse.Namespace) -> int:
    from zbopt.runtime import format_report, profile_torch

    _check_output_directory(args.output)
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
    _add_schedule_flags(simulating)
    simulating.add_argument("--json", action="store_true", help="print one JSON object")
    _add_input_flags(simulating)
    simulating.set_defaults(run=_command_simulate)
    exporting = commands.add_parser("export", help="write a schedule for torch.distributed.pipelining or Megatron-LM")
    _add_schedule_flags(exporting)
    exporting.add_argument("--format", choices=list(EXPORT_FORMATS),
                           help="torch-csv (torch's compute-only CSV), megatron (Megatron-LM's per-rank order, JSON) "
                                "or json (zbopt's schedule JSON); default from -o's extension (.csv, .json)")
    _add_input_flags(exporting, output_help="the file to write (required)")
    exporting.set_defaults(run=_command_export)
    solving = commands.add_parser("solve", help="find the optimal schedule under the memory limit")
    solving.add_argument("--solver", default="cpsat", choices=["cpsat", "cbc", "highs"],
                         help="cpsat (OR-Tools CP-SAT) or the MILP with cbc or highs (default cpsat)")
    solving.add_argument("--objective", default="makespan", choices=["makespan", "span"],
                         help="minimize the makespan or the longest device span (the ZB paper's)")
    solving.add_argument("--time-limit", type=float, default=60.0, help="seconds (default 60)")
    solving.add_argument("--warm-start", help="heuristic to start from (default: the best valid one)")
    solving.add_argument("--workers", type=int, default=2, help="solver threads (default 2)")
    solving.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    solving.add_argument("--json", action="store_true", help="print one JSON object")
    solving.add_argument("--quiet", action="store_true", help="print nothing (use -o or --json)")
    solving.add_argument("--export", metavar="FILE", help="write the schedule found: .csv torch CSV, .json zbopt JSON")
    _add_input_flags(solving)
    solving.set_defaults(run=_command_solve)
    comparing = commands.add_parser("compare", help="simulate several schedules (and the optimum) side by side")
    comparing.add_argument("--schedule", action="extend", nargs="+", metavar="NAME",
                           help="registered schedule names (default: every one that applies)")
    comparing.add_argument("--optimal", action="store_true", help="add the CP-SAT solver's schedule (row 'cpsat')")
    comparing.add_argument("--frontier", metavar="START:STOP:STEP",
                           help="also solve at these memory limits; the report shows the frontier")
    comparing.add_argument("--time-limit", type=float, help="seconds per solve, --optimal or --frontier (default 60)")
    comparing.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    _add_input_flags(comparing, output_help="write an HTML report (.html) with every schedule's charts")
    comparing.set_defaults(run=_command_compare)
    sweeping = commands.add_parser("frontier", help="the optimal makespan at each memory limit of a sweep")
    sweeping.add_argument("--memory-limits", required=True, metavar="START:STOP:STEP",
                          help="per-device memory limits to solve at, STOP included (e.g. 1:8:1)")
    sweeping.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve (default 60)")
    sweeping.add_argument("--workers", type=int, help="solves at once, one process each (default: one per core)")
    sweeping.add_argument("--dask", metavar="ADDRESS",
                          help="run the solves on a dask.distributed cluster, e.g. tcp://host:8786")
    sweeping.add_argument("--json", action="store_true", help="print the frontier as one JSON object")
    _add_input_flags(sweeping, output_help="write the frontier figure (.png, .svg or .pdf)")
    sweeping.set_defaults(run=_command_frontier)
    running = commands.add_parser("run-torch", help="run a torch CSV schedule in torch.distributed.pipelining, "
                                  "check its gradients and time its ops")
    _add_torch_flags(running)
    running.add_argument("--json", action="store_true", help="print one JSON object")
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
        args = build_parser().parse_args(argv)
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
