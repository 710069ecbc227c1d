"""`zbopt schedules`, `zbopt simulate` and `zbopt export`: one schedule, by name or from a file,
listed, simulated (with its Gantt chart) or written for a runtime."""

from __future__ import annotations

import argparse
import json

from zbopt.core.errors import ZboptError
from zbopt.core.simulation import simulate
from zbopt.interfaces.cli.flags import add_input_flags, add_schedule_flags, add_style_flag, config_file, flag_values
from zbopt.interfaces.cli.inputs import is_schedule_file, run_and_schedule
from zbopt.interfaces.cli.output import check_outputs, exit_status, figure_flag, figure_paths, figure_style, json_text
from zbopt.io.export import EXPORT_FORMATS, check_export, order_note, write_export
from zbopt.presentation.tables import format_simulation
from zbopt.schedules import registered

__all__ = ["add_commands"]


def add_commands(commands) -> None:
    """Add `schedules`, `simulate` and `export` to the subcommands `commands`."""
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


def _inputs(args: argparse.Namespace):
    """The run config and schedule of `simulate` and `export`. A schedule file in CONFIG's place
    is the schedule file, so `-c CONFIG` can still give its costs."""
    if args.schedule_file is None and args.config and args.config_flag and is_schedule_file(args.config):
        args.schedule_file, args.config = args.config, None
    return run_and_schedule(config_file(args), flag_values(args), args.schedule, dict(args.option), args.schedule_file,
                            args.order)


def _command_schedules(args: argparse.Namespace) -> int:
    entries = registered()
    if args.json:
        print(json.dumps([{"name": e.name, "summary": e.summary} for e in entries], indent=1))
    else:
        width = max(len(e.name) for e in entries)
        for entry in entries:
            print(f"{entry.name:<{width}}  {entry.summary}")
    return 0


def _command_simulate(args: argparse.Namespace) -> int:
    run, schedule = _inputs(args)
    figures = figure_paths(args, run.outputs)
    check_outputs(args, [(figure_flag(args), figure) for figure in figures])
    simulation = simulate(run.problem, schedule)
    print(json_text(simulation.to_dict()) if args.json else format_simulation(simulation))
    for figure in figures:
        from zbopt.presentation.plot import plot_gantt

        plot_gantt(simulation, figure, style=figure_style(args, figure))
        if not args.json:
            print(f"\nGantt chart written to {figure}")
    return exit_status(simulation)


def _command_export(args: argparse.Namespace) -> int:
    targets = getattr(args, "output_file", [])
    if not targets:
        raise ZboptError("export needs -o FILE")
    check_outputs(args, [("-o", target) for target in targets])
    for target in targets:
        check_export(target, given=args.format, flag="--format")
    run, schedule = _inputs(args)
    simulation = simulate(run.problem, schedule)  # a deadlock fails here, before anything is written
    for target in targets:
        written = write_export(target, simulation, args.format)
        print(f"{EXPORT_FORMATS[written]} written to {target}")
        note = order_note(simulation, written)
        if note is not None:
            print(note)
    return exit_status(simulation)  # over the memory limit: written as asked, but said
