"""What every command shares about its output: whether to print text or a progress line, where
its figure goes (checked before any work, with its --style), and the exit status of a schedule."""

from __future__ import annotations

import argparse
import sys

from zbopt.errors import ZboptError
from zbopt.simulation import Simulation

EXIT_INVALID_SCHEDULE = 1


def output_flag(args: argparse.Namespace) -> str | None:
    """-o's file unless --no-visualization; a config's output_file names a Gantt chart only."""
    return None if args.no_visualization else getattr(args, "output_file", None)


def talks(args: argparse.Namespace) -> bool:
    """Whether to print text on stdout: not with --json or --quiet."""
    return not (args.json or args.quiet)


def live(args: argparse.Namespace) -> bool:
    """Whether to draw a live progress line on stderr: on a terminal, unless --json or --quiet."""
    return talks(args) and sys.stderr.isatty()


def figure_path(args: argparse.Namespace, output_file: str | None) -> str | None:
    """Where to write the chart (checked before any work, with its --style), or None."""
    figure = None if args.no_visualization else output_file
    if figure is not None:
        from zbopt.plot import check_figure_path

        check_figure_path(figure)
    figure_style(args, figure)
    return figure


def figure_style(args: argparse.Namespace, figure: str | None) -> str:
    """--style, checked before any work: it needs a figure to write."""
    if args.style is None:
        return "screen"
    if figure is None:
        raise ZboptError(f"--style {args.style}: no figure to draw it in (give -o FILE.png, .svg or .pdf)")
    from zbopt.plot import check_style

    check_style(args.style)
    return args.style


def exit_status(simulation: Simulation) -> int:
    """0 for a valid schedule; else each memory violation on stderr and EXIT_INVALID_SCHEDULE."""
    for violation in simulation.violations:
        print(f"zbopt: invalid schedule: {violation}", file=sys.stderr)
    return 0 if simulation.valid else EXIT_INVALID_SCHEDULE
