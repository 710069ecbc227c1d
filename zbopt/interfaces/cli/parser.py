"""The command line's grammar: one subcommand per job, each family's flags in its own module."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from zbopt.core.errors import ZboptError
from zbopt.interfaces.cli import compare, costs, plan, simulate, solve, torch_run

__all__ = ["COMMAND_FAMILIES", "build_parser"]

COMMAND_FAMILIES = (simulate, solve, compare, costs, plan, torch_run)  # in --help's order


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (plus exit 2) instead of a usage dump; and a
    command given `flags=` adds its flags when it is parsed, so that a command whose flags name a
    heavy package's contents (solve's --solver choices, the solvers) costs nothing to the others."""

    def __init__(self, *args, flags: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._flags = flags

    def parse_known_args(self, args=None, namespace=None):
        if self._flags is not None:
            add_flags, self._flags = self._flags, None
            add_flags(self)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        raise ZboptError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The `zbopt` parser; each subcommand sets `run`, the function that carries it out."""
    parser = _Parser(prog="zbopt", description="Pipeline-parallel schedules: simulate, compare, optimize.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for family in COMMAND_FAMILIES:
        family.add_commands(commands)
    return parser
