"""The exceptions a user can cause. The CLI turns any of them into one line and exit status 2."""

import reprlib

__all__ = ["SHORT_LENGTH", "DeadlockError", "MemoryLimitError", "MissingSettingsError", "NotApplicableError",
           "ProblemError", "ScheduleError", "UnknownScheduleError", "ZboptError", "clip", "described", "escaped",
           "shorten"]

SHORT_LENGTH = 80  # the most characters a message spends on one value the user gave

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 8, 8, 4, 4
_REPR.maxstring = _REPR.maxother = SHORT_LENGTH - 4
_REPR.maxlong = SHORT_LENGTH // 2


def shorten(value: object) -> str:
    """`value`'s repr in at most SHORT_LENGTH characters (as `reprlib` shortens it): the one form in
    which every message shows a value the user gave, however large or deeply nested."""
    return clip(_REPR.repr(value))


def clip(text: str) -> str:
    """`text` as typed (`escaped`) and cut to SHORT_LENGTH characters, "..." marking the cut: a
    value shown as the user typed it."""
    text = escaped(text)
    return text if len(text) <= SHORT_LENGTH else text[:SHORT_LENGTH - 3] + "..."


def escaped(text: str) -> str:
    """`text` on one line: a line break or other unprintable character escaped, as repr does (a
    path with a line break in it still makes one line of a message)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def described(error: BaseException) -> str:
    """An exception from code zbopt runs (torch, a user's model) in one line: its type and first
    line, and its root cause's (torch wraps the real failure: "Failed to run stage backward:"
    caused by "grad can be implicitly created only for scalar outputs")."""

    def first_line(exception: BaseException) -> str:
        lines = [line.strip() for line in str(exception).splitlines() if line.strip()]
        return escaped(f"{type(exception).__name__}: {lines[0] if lines else ''}")

    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    return first_line(error) + (f" (caused by {first_line(root)})" if root is not error else "")


class ZboptError(ValueError):
    """A mistake in what the user gave (config, schedule, options); the message names the culprit."""


class ProblemError(ZboptError):
    """A problem parameter is invalid. `key` is the parameter's name, so callers can rename it."""

    def __init__(self, key: str, value: object, reason: str):
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"{key} = {shorten(value)}: {reason}")


class ScheduleError(ZboptError):
    """A schedule cannot run on its problem: missing, duplicated or misplaced op, bad start time."""


class DeadlockError(ScheduleError):
    """Every device that still has work waits on an op that can never finish."""


class MemoryLimitError(ScheduleError):
    """A device holds more memory than its limit at some moment."""


class UnknownScheduleError(ZboptError):
    """No generator is registered under the requested name."""


class NotApplicableError(ZboptError):
    """A generator's preconditions do not hold for the problem (e.g. it needs v = 1)."""


class MissingSettingsError(NotApplicableError):
    """A schedule needs problem settings this problem lacks. `settings` maps each config key to a
    value that works, so that the CLI can print a command line that runs."""

    def __init__(self, message: str, settings: dict[str, object]):
        self.settings = settings
        super().__init__(message)
