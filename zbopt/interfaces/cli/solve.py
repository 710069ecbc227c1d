"""`zbopt solve`: the optimal schedule under the memory limit, printed, drawn and exported."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zbopt.core.interrupt import answer_of
from zbopt.interfaces.cli.flags import (
    add_deterministic_flag,
    add_input_flags,
    add_order_flag,
    add_quiet_flag,
    add_style_flag,
    config_file,
    flag_values,
)
from zbopt.interfaces.cli.inputs import run_config
from zbopt.interfaces.cli.output import (
    check_outputs,
    command_clock,
    figure_flag,
    figure_paths,
    figure_style,
    json_text,
    live,
    talks,
)
from zbopt.io.export import EXPORT_FORMATS, check_export, order_note, write_export
from zbopt.io.read import load_schedule
from zbopt.io.torch_order import read_torch_csv
from zbopt.presentation.tables import format_solve
from zbopt.schedules import get

__all__ = ["add_commands"]


def add_commands(commands) -> None:
    """Add `solve` to the subcommands `commands`; its flags when it is parsed (they name the solvers)."""
    commands.add_parser("solve", help="find the optimal schedule under the memory limit", flags=_add_solve_flags)


def _add_solve_flags(solving: argparse.ArgumentParser) -> None:
    from zbopt.solvers import SOLVERS

    solving.add_argument("--solver", default="cpsat", choices=SOLVERS,
                         help="cpsat (OR-Tools CP-SAT; on 600 ops or more, LNS takes the second half of the "
                              "search unless CP-SAT proved its answer), the MILP with cbc or highs, or lns (CP-SAT "
                              "window by window from the warm start; proves nothing itself) (default cpsat)")
    solving.add_argument("--objective", default="makespan", choices=["makespan", "span"],
                         help="minimize the makespan or the longest device span (the ZB paper's)")
    solving.add_argument("--time-limit", type=float, default=60.0, help="seconds (default 60)")
    solving.add_argument("--warm-start", metavar="NAME|FILE",
                         help="what to start from: a heuristic's name, or a saved schedule (.json zbopt JSON, "
                              ".csv torch CSV) (default: the best valid heuristic)")
    solving.add_argument("--workers", type=int, default=2, help="solver threads (default 2)")
    solving.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    solving.add_argument("--json", action="store_true", help="print one JSON object")
    add_quiet_flag(solving)
    solving.add_argument("--export", metavar="FILE", help="write the schedule found: .csv torch CSV, .json zbopt JSON, "
                                                         ".trace.json a trace for Perfetto")
    add_order_flag(solving, "the warm start's heuristics: ")
    add_deterministic_flag(solving)
    add_input_flags(solving)
    add_style_flag(solving)
    solving.set_defaults(run=_command_solve)


def _command_solve(args: argparse.Namespace) -> int:
    from zbopt.solvers import solve

    run = run_config(config_file(args), flag_values(args))
    figures = figure_paths(args, run.outputs)
    check_outputs(args, [*((figure_flag(args), figure) for figure in figures), ("--export", args.export)])
    if args.export is not None:
        check_export(args.export, run.problem)
    warm = _warm_start(args.warm_start, run.problem)
    clock = command_clock(args, "solve")
    result, stop = answer_of(lambda: solve(run.problem, args.solver, time_limit=clock,
                                           objective=args.objective, warm_start=warm, order=args.order,
                                           workers=args.workers, seed=args.seed, progress=live(args),
                                           deterministic=args.deterministic))
    _show(args, result, figures)
    if stop is not None:
        raise stop
    return 0


def _warm_start(given: str | None, problem):
    """--warm-start: a registered name (checked now), or a schedule file read for `problem`."""
    if given is None or Path(given).suffix.lower() not in (".json", ".csv"):
        if given is not None:
            get(given)  # an unknown name: one line, naming the close ones
        return given
    if Path(given).suffix.lower() == ".csv":
        return read_torch_csv(given).to_schedule(problem, Path(given).name)
    schedule, _ = load_schedule(given)
    return schedule


def _show(args: argparse.Namespace, result, figures: list[str]) -> None:
    """Print the answer, draw it and export it, as asked."""
    if args.json:
        print(json_text(result.to_dict()))
    elif talks(args):
        print(format_solve(result))
    if result.simulation is None:
        if args.export is not None:
            print(f"zbopt: no schedule found ({result.status}); {args.export} not written", file=sys.stderr)
        return
    for figure in figures:
        from zbopt.presentation.plot import plot_gantt

        plot_gantt(result.simulation, figure, style=figure_style(args, figure))
        if talks(args):
            print(f"\nGantt chart written to {figure}")
    if args.export is not None:
        written = write_export(args.export, result.simulation, with_times=True)
        note = order_note(result.simulation, written)
        if talks(args):
            print(f"\n{EXPORT_FORMATS[written]} written to {args.export}" + ("" if note is None else f"\n{note}"))
