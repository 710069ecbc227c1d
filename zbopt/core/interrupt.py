"""Ctrl-C, one policy for every command and for `solve` and `memory_frontier` called from Python.

While the work runs (`stoppable`), the first Ctrl-C only sets `requested`: no exception can land
inside a solver's C++ callback. The solvers' watchers, LNS's loop, the driver and the frontier poll
it, stop through the solver's own mechanism (CP-SAT's StopSearch; killing the MILP's child) and
raise `Interrupted` carrying the best answer so far. A second Ctrl-C acts as before the work:
Python's KeyboardInterrupt, or, in the `zbopt` command, `exit_at_once`.

A time limit stops work the same way: code that may run long with no solver to stop (a heuristic
at p = 32, m = 512 takes seconds) calls `check` in its loop, which raises `TimeUp` once the
deadline of the enclosing `deadline_scope` has passed or Ctrl-C came.

The one clock: a command's time budget is one `Clock`, made where the command starts (the
command line's from its process's start, `process_started`, so that `--time-limit` holds from
start to exit), passed down and split by named shares (`Clock.share`); the stages read their
deadlines from it, none from a start time of its own.

Deterministic time (`--deterministic`): a Clock may count work instead of wall time, so two runs
decide alike. Its `Meter` sums what CP-SAT reports as its deterministic time (`spend`, after
every solve); all other work counts nothing and so runs to its end, and no wall clock decides
anything. While a metered clock's work runs (`metered`), `now()`, `past` and `check` read the
meter, so code that holds only a deadline (a float) needs no change. A budget is given in seconds
and converted at WORK_PER_SECOND: CP-SAT's deterministic time runs several times slower than the
wall clock on one worker.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from zbopt.core.errors import ZboptError

__all__ = ["EXIT_INTERRUPTED", "EXIT_WAIT_S", "MESSAGE", "MIN_SPEND", "POLL_S", "START_UP_MOST_S", "WORK_PER_SECOND",
           "Clock", "Interrupted", "Meter", "T", "TimeUp", "answer_of", "as_clock", "check", "clock_of",
           "deadline_scope", "deterministic", "exit_at_once", "leave", "left_running", "metered", "now", "past",
           "process_started", "requested", "span", "spend", "stoppable", "watched"]

EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT
MESSAGE = "zbopt: interrupted"

T = TypeVar("T")

requested = threading.Event()  # Ctrl-C came while the work ran
POLL_S = 0.05  # how often work that waits (on a solver, a pool, a child) looks for Ctrl-C and its deadline
EXIT_WAIT_S = 30.0  # the most the interpreter's exit waits for workers left running (`left_running`)
_left_running: list[threading.Event] = []


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the work; `partial` is its best answer so far (a SolveResult, Comparison,
    Frontier, ...) or None. A KeyboardInterrupt, so a loop over solves stops as Python users expect."""

    def __init__(self, partial: object = None):
        super().__init__(MESSAGE)
        self.partial = partial


def answer_of(work: Callable[[], T]) -> tuple[T, Interrupted | None]:
    """(work(), None); after Ctrl-C, (its best answer so far, the `Interrupted` to raise once the
    command has printed and written that answer). Ctrl-C before any answer propagates."""
    try:
        return work(), None
    except Interrupted as stop:
        if stop.partial is None:
            raise
        return stop.partial, stop


# CP-SAT's deterministic time per wall second, one worker (measured on 2 cores: a loop p = 4, m = 8, v = 2
# model spent 5.9 units in 27 s; 0.2-0.25 on the models of bench_certify)
WORK_PER_SECOND = 0.25
MIN_SPEND = 1e-3  # what any solve costs at least: a loop of solves that spend nothing still ends


class Meter:
    """Deterministic time spent: the sum of what CP-SAT reported after each solve (`spend`)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._lock = threading.Lock()

    def spend(self, seconds: float) -> None:
        with self._lock:
            self.spent += max(MIN_SPEND, seconds)


_meter: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("zbopt_meter", default=None)


def now() -> float:
    """The time deadlines are read against: `time.perf_counter()`, or inside `metered` the work
    spent so far (deterministic time)."""
    meter = _meter.get()
    return time.perf_counter() if meter is None else meter.spent


def span(seconds: float) -> float:
    """A fixed budget of `seconds` (a stage's cap, say) on the clock under way: as it is, or inside
    `metered` in deterministic time (WORK_PER_SECOND)."""
    return seconds if _meter.get() is None else seconds * WORK_PER_SECOND


def clock_of(seconds: float, name: str) -> Clock:
    """A Clock of `seconds` from now on the clock under way (counting its meter inside `metered`)."""
    return Clock(now() + seconds, name, _meter.get())


def deterministic() -> bool:
    """Whether the work under way counts deterministic time (`metered`)."""
    return _meter.get() is not None


def spend(seconds: float) -> None:
    """Count a solve's deterministic time (CP-SAT's `deterministic_time`) on the meter, if any."""
    meter = _meter.get()
    if meter is not None:
        meter.spend(seconds)


def past(deadline: float) -> bool:
    """Whether the work should stop: `deadline` (`now()`) has passed or Ctrl-C came."""
    return requested.is_set() or now() > deadline


class TimeUp(Exception):
    """The work under a `deadline_scope` ran past its deadline (or Ctrl-C came) and stopped."""


@dataclass(frozen=True)
class Clock:
    """A time budget: the `time.perf_counter()` by which the work must be done, and what it is for
    ("plan", "plan.heuristics"). Made once where the work starts (`start`), split by `share`."""

    deadline: float
    name: str = "work"
    meter: Meter | None = None  # counting deterministic time (`metered`), not the wall clock

    @classmethod
    def start(cls, seconds: float, name: str = "work", began: float | None = None,
              deterministic: bool = False) -> Clock:
        """`seconds` from `began` (a `time.perf_counter()`; default now); a ZboptError unless
        positive. `deterministic`: `seconds` of work at WORK_PER_SECOND on a fresh `Meter`."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:  # NaN too
            raise ZboptError(f"time limit {seconds:g}: must be positive" if isinstance(seconds, (int, float))
                             else f"time limit {seconds!r}: expected a number of seconds")
        if deterministic:
            return cls(seconds * WORK_PER_SECOND, name, Meter())
        return cls((time.perf_counter() if began is None else began) + seconds, name)

    def now(self) -> float:
        """This clock's time: `time.perf_counter()`, or the work its meter counted."""
        return time.perf_counter() if self.meter is None else self.meter.spent

    def left(self) -> float:
        """Seconds to the deadline (of work, on a meter), never below 0."""
        return max(0.0, self.deadline - self.now())

    def past(self) -> bool:
        """Whether the work should stop: the deadline has passed or Ctrl-C came."""
        return requested.is_set() or self.now() > self.deadline

    def share(self, name: str, fraction: float = 1.0, *, most: float = math.inf, reserve: float = 0.0) -> Clock:
        """A stage's part of what is left: `fraction` of it after `reserve` seconds kept for what
        follows (the answer's output, say), at most `most` seconds."""
        seconds = min(most, fraction * max(0.0, self.left() - reserve))
        return Clock(self.now() + seconds, f"{self.name}.{name}", self.meter)


@contextlib.contextmanager
def metered(clock: Clock | None) -> Iterator[None]:
    """While the block runs, `now()` (and so `past`, `check`) reads `clock`'s meter where it has
    one; else (no clock, or one on the wall clock) nothing changes. Threads started in the block see it only through
    `contextvars.copy_context()`."""
    if clock is None or clock.meter is None:
        yield
        return
    token = _meter.set(clock.meter)
    try:
        yield
    finally:
        _meter.reset(token)


START_UP_MOST_S = 10.0  # more is no start-up: a process that ran other work before it exec'd zbopt


def process_started() -> float:
    """This process's start as a `time.perf_counter()` value (Linux: from /proc; elsewhere, now),
    so that a command's budget counts the interpreter's start-up and its imports too."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            age = float(uptime.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        age = 0.0
    return time.perf_counter() - min(max(age, 0.0), START_UP_MOST_S)


def as_clock(time_limit: float | Clock, name: str, deterministic: bool = False) -> Clock:
    """A function's `time_limit`: seconds from now (of work with `deterministic`), or a Clock its
    caller is already counting (then `deterministic` must match it)."""
    if not isinstance(time_limit, Clock):
        return Clock.start(time_limit, name, deterministic=deterministic)
    if deterministic and time_limit.meter is None:
        raise ZboptError(f"{name}: deterministic=True with a wall-clock time_limit Clock; give seconds, or a Clock "
                         "made with deterministic=True")
    return time_limit


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("zbopt_deadline", default=None)


@contextlib.contextmanager
def deadline_scope(deadline: float) -> Iterator[None]:
    """While the block runs, `check` raises `TimeUp` past `deadline` (`now()`), or
    past an enclosing scope's deadline if that comes first, or after Ctrl-C."""
    enclosing = _deadline.get()
    token = _deadline.set(deadline if enclosing is None else min(deadline, enclosing))
    try:
        yield
    finally:
        _deadline.reset(token)


def check() -> None:
    """Raise `TimeUp` if the enclosing `deadline_scope` has passed or Ctrl-C came. Outside any
    scope, nothing: the caller there (a frontier's heuristic points, compare) stops on Ctrl-C by
    its own means, and expects no exception from a generator."""
    deadline = _deadline.get()
    if deadline is not None and past(deadline):
        raise TimeUp


def exit_at_once(_signum=None, _frame=None) -> None:
    """The `zbopt` command's SIGINT handler outside the work (start-up, a second Ctrl-C): one line
    on stderr, then `leave`."""
    os.write(2, f"\n{MESSAGE}\n".encode() if _mid_line() else f"{MESSAGE}\n".encode())
    leave()


def left_running(done: threading.Event) -> None:
    """A worker told to stop and left behind, still running (a backend past its deadline, `done`
    set when it returns): the interpreter's exit waits for it, at most EXIT_WAIT_S, since a thread
    still inside C++ at shutdown aborts the process ("terminate called without an active
    exception", exit 134, after a complete output)."""
    _left_running[:] = [event for event in _left_running if not event.is_set()] + [done]


def _await_left_running() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for done in _left_running:
        done.wait(max(0.0, deadline - time.monotonic()))


atexit.register(_await_left_running)


def leave(status: int = EXIT_INTERRUPTED) -> None:
    """Exit with `status` (130) at once, what was printed flushed: no interpreter shutdown, which
    would wait for nothing useful, could meet a solver thread still inside C++ (it aborts the
    process: "terminate called without an active exception", exit 134, after a complete output),
    and lets a further Ctrl-C end the process by the signal."""
    with contextlib.suppress(OSError, RuntimeError, ValueError):  # a write under way, or stdout closed
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def _mid_line() -> bool:
    """Whether a live progress line may be on stderr's terminal (then the message starts a line)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """While the block runs, the first Ctrl-C sets `requested` and a second acts as before it.
    Only in the main thread and over Python's default handler or `exit_at_once`; any other handler
    (someone's own, SIG_IGN in a frontier worker, or an enclosing `stoppable`) is left alone. The
    outermost use clears `requested` as it starts and ends: the block looks at it before it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous not in (signal.default_int_handler, exit_at_once):
        yield
        return
    requested.clear()

    def first(_signum, _frame) -> None:
        requested.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        requested.clear()


def watched(work: Callable[[], T], stop: Callable[[], None], stop_when: Callable[[], bool] = requested.is_set) -> T:
    """`work()` (a solver's blocking call) in a thread of its own while this thread watches and
    calls `stop()` once `stop_when()` holds (by default: Ctrl-C came). So the main thread stays in
    Python, where a signal handler can run, and nothing raises inside the solver; a KeyboardInterrupt
    here (a second Ctrl-C) stops the work on its way out. `stop` is repeated: a solver ignores it
    before it has started."""
    outcome: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="zbopt-watched", daemon=True).start()
    try:
        while not done.wait(POLL_S):
            if stop_when():
                stop()
    except BaseException:
        stop()
        left_running(done)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
