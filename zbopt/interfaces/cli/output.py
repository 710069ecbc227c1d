"""What every command shares about its output: whether to print text or a progress line, where
its files go (checked before any work: each creatable, none an input, a figure's with its
--style), and the exit status of a schedule."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from zbopt.core.errors import ZboptError
from zbopt.core.interrupt import Clock
from zbopt.core.simulation import Simulation
from zbopt.io.write import check_writable

__all__ = ["EXIT_INVALID_SCHEDULE", "OUTPUT_RESERVE_S", "check_outputs", "command_clock", "exit_status", "figure_flag",
           "figure_paths", "figure_style", "json_text", "live", "output_flag", "talks"]

EXIT_INVALID_SCHEDULE = 1


def output_flag(args: argparse.Namespace) -> list[str]:
    """-o's files, in the order given, unless --no-visualization; a config's output_file names a
    Gantt chart only."""
    return [] if args.no_visualization else list(getattr(args, "output_file", []))


def talks(args: argparse.Namespace) -> bool:
    """Whether to print text on stdout: not with --json or --quiet."""
    return not (args.json or args.quiet)


def live(args: argparse.Namespace) -> bool:
    """Whether to draw a live progress line on stderr: on a terminal, unless --json or --quiet."""
    return talks(args) and sys.stderr.isatty()


def check_outputs(args: argparse.Namespace, outputs: dict[str, str | None] | list[tuple[str, str | None]],
                  inputs: dict[str, str] | None = None) -> None:
    """Before any work, every file a command will write (flag -> path; None: not asked for) can be
    created, and none is another output or one of its inputs (the config, --schedule-file, and
    `inputs`, a description -> path): one line naming the flag and the path otherwise."""
    given = [("the config file", getattr(args, "config", None)),
             ("the config file", getattr(args, "config_flag", None)),
             ("the schedule file", getattr(args, "schedule_file", None)), *(inputs or {}).items()]
    pairs = outputs.items() if isinstance(outputs, dict) else outputs
    asked = [(flag, path) for flag, path in pairs if path is not None]
    for number, (flag, path) in enumerate(asked):
        try:
            check_writable(path)
        except ZboptError as error:
            raise ZboptError(f"{flag} {error}") from None
        earlier = [(f"the {other_flag} file", other) for other_flag, other in asked[:number]]
        for what, other in given + earlier:
            if other is not None and _same_file(path, other):
                raise ZboptError(f"{flag} '{path}': is {what}; writing it would replace it (give another file)")


def figure_flag(args: argparse.Namespace) -> str:
    """What gave the figure's path, for a message: -o, else the config's output_file."""
    return "-o" if hasattr(args, "output_file") else "output_file"


def _same_file(one: str, other: str) -> bool:
    """Whether two paths name one file: the same inode when both exist, else the same resolved path."""
    if os.path.exists(one) and os.path.exists(other):
        return os.path.samefile(one, other)
    return Path(one).resolve() == Path(other).resolve()


def figure_paths(args: argparse.Namespace, outputs) -> list[str]:
    """Where to write the chart, each file (checked before any work, with its --style), or none."""
    figures = [] if args.no_visualization else list(outputs)
    if figures:
        from zbopt.presentation.plot import check_figure_path

        for figure in figures:
            check_figure_path(figure)
    figure_style(args, figures[0] if figures else None)
    return figures


def figure_style(args: argparse.Namespace, figure: str | None) -> str:
    """--style, checked before any work: it needs a figure to write."""
    if args.style is None:
        return "screen"
    if figure is None:
        raise ZboptError(f"--style {args.style}: no figure to draw it in (give -o FILE.png, .svg or .pdf)")
    from zbopt.presentation.plot import check_style

    check_style(args.style)
    return args.style


def exit_status(simulation: Simulation) -> int:
    """0 for a valid schedule; else each memory violation on stderr and EXIT_INVALID_SCHEDULE."""
    for violation in simulation.violations:
        print(f"zbopt: invalid schedule: {violation}", file=sys.stderr)
    return 0 if simulation.valid else EXIT_INVALID_SCHEDULE


# of --time-limit, kept for what follows the work: printing the answer and writing its files (a chart's
# matplotlib import alone takes tenths of a second; not measured per command yet)
OUTPUT_RESERVE_S = 0.5


def command_clock(args, name: str) -> Clock:
    """The command's one clock: `--time-limit` from the program's start (`main`'s `started`: the
    `zbopt` process's, so the limit holds from start to exit), less OUTPUT_RESERVE_S for the
    output (at most a tenth of the limit); the work's stages share it. With `--deterministic`,
    `--time-limit` of work on a fresh meter (`zbopt.core.interrupt.metered`): no wall clock."""
    if getattr(args, "deterministic", False):
        return Clock.start(args.time_limit, name, deterministic=True)
    clock = Clock.start(args.time_limit, name, began=args.started)
    return clock.share("work", reserve=min(OUTPUT_RESERVE_S, 0.1 * args.time_limit))


def json_text(data: object) -> str:
    """`data` as one line of JSON, every finite float at 12 significant digits: sums of float costs
    carry noise in their last bits that no input had (2951.999999999993 is 2952.0), and 12 digits
    keep far more than any cost or memory a user gives."""
    return json.dumps(_without_float_noise(data))


def _without_float_noise(data: object) -> object:
    if isinstance(data, float):
        return float(f"{data:.12g}") if math.isfinite(data) else data
    if isinstance(data, dict):
        return {key: _without_float_noise(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_without_float_noise(value) for value in data]
    return data

