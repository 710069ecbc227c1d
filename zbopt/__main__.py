"""`python -m zbopt` runs the CLI; `run` is also the `zbopt` command's entry point.

Ctrl-C is `zbopt.core.interrupt.exit_at_once` from the first line on (one line, exit 130): the CLI's
imports take a few tenths of a second, and a traceback of them helps no one.
"""

import signal
import sys
import threading

from zbopt.core import interrupt

LEFT_BEHIND = ("zbopt-search", "zbopt-watched")  # the solve driver's and a watched solver's (`interrupt.watched`)


def run() -> None:
    signal.signal(signal.SIGINT, interrupt.exit_at_once)
    from zbopt.interfaces.cli import main

    code = main(started=interrupt.process_started())  # the time limit counts start-up and imports too
    if code == interrupt.EXIT_INTERRUPTED or _left_behind():
        interrupt.leave(code)
    sys.exit(code)


def _left_behind() -> bool:
    """Whether a worker thread still runs (a solver the driver left behind at the time limit, inside
    C++): the interpreter's shutdown would then abort the process after its complete output."""
    return any(thread.name in LEFT_BEHIND and thread.is_alive() for thread in threading.enumerate())


if __name__ == "__main__":
    run()
