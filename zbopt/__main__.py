"""`python -m zbopt` runs the CLI; `run` is also the `zbopt` command's entry point.

Ctrl-C is `zbopt.core.interrupt.exit_at_once` from the first line on (one line, exit 130): the CLI's
imports take a few tenths of a second, and a traceback of them helps no one.
"""

import signal
import sys

from zbopt.core import interrupt


def run() -> None:
    signal.signal(signal.SIGINT, interrupt.exit_at_once)
    from zbopt.interfaces.cli import main

    code = main(started=interrupt.process_started())  # the time limit counts start-up and imports too
    if code == interrupt.EXIT_INTERRUPTED:
        interrupt.leave()
    sys.exit(code)


if __name__ == "__main__":
    run()
