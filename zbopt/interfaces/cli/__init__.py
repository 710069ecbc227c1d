"""The `zbopt` command line. Any mistake in the input is one line on stderr and exit status 2.

Exit status: 0 done; 1 the schedule ran but breaks the problem's memory limit (or, for run-torch
and profile-torch, its gradients differ from the reference); 2 bad input; 130 interrupted (Ctrl-C:
solve, compare, block, frontier and plan first stop, print and write the best answer so far; see
`zbopt.core.interrupt`); 141 the reader of stdout left (`zbopt ... | head`).

The grammar is `parser`'s; each family of commands is a module (`simulate`, `solve`, `compare`,
`torch_run`) that imports the heavy libraries (OR-Tools, matplotlib, torch) only where it uses
them, so that `zbopt --help` and a small `simulate` start quickly.
"""

from __future__ import annotations

import os
import shlex
import sys

from zbopt.core import interrupt
from zbopt.core.errors import MissingSettingsError, ZboptError, clip, escaped
from zbopt.interfaces.cli.parser import build_parser

__all__ = ["EXIT_BAD_INPUT", "EXIT_BROKEN_PIPE", "main"]

EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a process ended by SIGPIPE


def _command_with(argv: list[str], settings: dict[str, object]) -> str:
    """The user's command line with flags that set `settings` (config key -> value) appended: a
    flag overrides the config file and an earlier flag."""
    flags = [token for key, value in settings.items() for token in (f"--{key.replace('_', '-')}", str(value))]
    return shlex.join(["zbopt", *argv, *flags])


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """Run the CLI; returns the exit status. `started`: the program's start (`time.perf_counter()`),
    from which a command's `--time-limit` counts (the `zbopt` command's own process start); None: now."""
    argv = sys.argv[1:] if argv is None else [str(token) for token in argv]
    try:
        args, unknown = build_parser().parse_known_args(argv)
        args.started = started
        if unknown:  # argparse's own message would point to the top-level help, not the command's
            raise ZboptError(f"unrecognized arguments: {clip(' '.join(unknown))} (see 'zbopt {args.command} --help')")
        return args.run(args)
    except MissingSettingsError as error:
        print(f"zbopt: {escaped(str(error))}; try: {_command_with(argv, error.settings)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ZboptError as error:
        print(f"zbopt: {escaped(str(error))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader left (`zbopt ... | head`): stop quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as error:
        print(f"zbopt: {clip(str(error.filename or ''))}: {error.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C (`zbopt.core.interrupt`): what the command had is printed and written
        print(interrupt.MESSAGE, file=sys.stderr)
        return interrupt.EXIT_INTERRUPTED
