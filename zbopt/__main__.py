"""`python -m zbopt` runs the CLI; `run` is also the `zbopt` command's entry point.

Ctrl-C is `zbopt.interrupt.exit_at_once` from the first line on (one line, exit 130): the CLI's
imports take a few tenths of a second, and a traceback of them helps no one.
"""

import signal
import sys

from zbopt.interrupt import exit_at_once


def run() -> None:
    signal.signal(signal.SIGINT, exit_at_once)
    from zbopt.cli import main

    sys.exit(main())


if __name__ == "__main__":
    run()
