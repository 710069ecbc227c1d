"""Name -> schedule generator. Every heuristic is a function `(problem, **options) -> Schedule`.

The registry lists its schedules in the order they were registered (`zbopt schedules`, `compare`).
Schedules a floor above builds (block-NAME, from the building blocks) are registered by that floor:
the root package leaves their loader in `zbopt.core.wiring`, run here before the first lookup or listing.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from zbopt.core.errors import NotApplicableError, UnknownScheduleError, ZboptError
from zbopt.core.problem import Problem
from zbopt.core.problem.microbatches import every_microbatch_at
from zbopt.core.schedule import Schedule
from zbopt.core.wiring import load_deferred
from zbopt.schedules.ordering import Order, in_order

__all__ = ["RENAMED", "Generator", "MemoryBound", "RegisteredSchedule", "applicable", "generate",
           "generate_applicable", "get", "options_of", "register", "registered", "require"]

Generator = Callable[..., Schedule]
MemoryBound = Callable[[Problem], Sequence[float]]


@dataclass(frozen=True)
class RegisteredSchedule:
    """A generator with its one-line summary and, when its source states one, the per-device peak
    memory it promises (tests hold every generator to its promise)."""

    name: str
    generator: Generator
    summary: str
    peak_memory_bound: MemoryBound | None = None
    bidirectional: bool = False  # builds schedules for the bidirectional placement (`Problem.routes`)
    sliced: bool = False  # orders the slices of a sequence as `zbopt.core.problem.slices` requires


_REGISTRY: dict[str, RegisteredSchedule] = {}
# Former names -> the name the same generator has now (an error naming it, not a second entry).
RENAMED = {"zb-v-rule": "torch-zbv"}


def register(
    name: str, summary: str, peak_memory_bound: MemoryBound | None = None, bidirectional: bool = False,
    after: str | None = None, sliced: bool = False,
) -> Callable[[Generator], Generator]:
    """Decorator: register a generator under `name` with a one-line `summary` and optionally
    `peak_memory_bound(problem) -> per-device bound` on the peak memory its schedules reach.
    Only a generator registered `bidirectional` is asked for problems with that placement: the
    others send every microbatch through every stage; likewise only one registered `sliced` is
    asked for problems with sequence slices. It is listed last, or right after the schedule named
    `after`."""

    def decorate(generator: Generator) -> Generator:
        if name in _REGISTRY:
            raise RuntimeError(f"schedule {name!r} is registered twice")
        bound = peak_memory_bound if peak_memory_bound is None or sliced else _at_largest(peak_memory_bound)
        entry = RegisteredSchedule(name, generator, summary, bound, bidirectional, sliced)
        entries = list(_REGISTRY.values())
        entries.insert(len(entries) if after is None else list(_REGISTRY).index(after) + 1, entry)
        _REGISTRY.clear()
        _REGISTRY.update((each.name, each) for each in entries)
        return generator

    return decorate


def _at_largest(bound: MemoryBound) -> MemoryBound:
    """`bound` where microbatches differ: taken as if every microbatch held the largest activation
    of each stage (a promise counts activations in flight; each is at most that large)."""

    def largest(problem: Problem, **options) -> Sequence[float]:
        if problem.microbatches_equal:
            return bound(problem, **options)
        return bound(every_microbatch_at(problem, max), **options)

    return largest


def _loaded() -> dict[str, RegisteredSchedule]:
    """The registry, with the schedules registered from the floors above loaded."""
    load_deferred(__name__)
    return _REGISTRY


def registered() -> list[RegisteredSchedule]:
    """All registered schedules, in registration order.

    Returns
    -------
    list of RegisteredSchedule : each with its `name`, `summary`, `source` and the checks of what
        it applies to; the block-built schedules (`block-NAME`) among them.

    Examples
    --------
    >>> "1f1b" in [entry.name for entry in registered()]
    True
    """
    return list(_loaded().values())


def get(name: str) -> RegisteredSchedule:
    """The schedule registered as `name`; UnknownScheduleError lists the known names."""
    known = _loaded()
    try:
        return known[name]
    except KeyError:
        if name in RENAMED:
            raise UnknownScheduleError(f"schedule '{name}' is now '{RENAMED[name]}' (the same order)") from None
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownScheduleError(
            f"unknown schedule '{name}'{hint} (known: {', '.join(known)})"
        ) from None


def options_of(name: str) -> list[str]:
    """The keyword options the generator `name` accepts besides the problem."""
    parameters = list(inspect.signature(get(name).generator).parameters.values())[1:]
    return [parameter.name for parameter in parameters]


def generate(name: str, problem: Problem, order: Order = None, **options) -> Schedule:
    """Build the schedule `name` for `problem`, named after it.

    Parameters
    ----------
    name : a registered schedule (`registered()`, `zbopt schedules`), or "torch:NAME" for torch's
        built-in NAME.
    problem : the problem to schedule.
    order : the microbatches enter the pipeline in this order: a rule (given, longest-first,
        shortest-first, dynapipe) or a permutation, `order[k]` entering k-th
        (`zbopt.schedules.ordering`); None: as the generator numbers them.
    **options : the generator's own options (`zbopt schedules --json` lists them).

    Returns
    -------
    Schedule : the per-device op orders (start times only where the generator plans them).

    Raises
    ------
    UnknownScheduleError : for a name no one registered (the message lists the known ones).
    NotApplicableError : where the problem breaks the generator's preconditions (placement,
        chunks, microbatch counts, mechanisms), saying which.
    ZboptError : for an option the generator does not take, naming it.

    Examples
    --------
    1F1B at p = 4, m = 8, F = 1, BW = 2 takes (m + p - 1)(F + BW), device 0 warming up with p forwards:

    >>> from zbopt import Problem, simulate
    >>> problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    >>> schedule = generate("1f1b", problem)
    >>> [str(op) for op in schedule.orders[0][:5]], simulate(problem, schedule).makespan
    (['0F0', '0F1', '0F2', '0F3', '0BW0'], 33.0)
    """
    accepted = options_of(name)
    for option in options:
        if option not in accepted:
            takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
            raise ZboptError(f"schedule '{name}' has no option '{option}' ({takes})")
    entry = get(name)
    if problem.bidirectional and not entry.bidirectional:
        raise NotApplicableError(f"{name} needs a placement other than 'bidirectional' (it sends every microbatch "
                                 "through every stage)")
    if problem.sequence_slices > 1 and not entry.sliced:
        raise NotApplicableError(f"{name} needs sequence_slices = 1 (it does not run a sequence's slices in the "
                                 "order their attention needs: forwards first to last, backwards last to first)")
    def build(planned: Problem) -> Schedule:
        schedule = entry.generator(planned, **options)
        if schedule.start_times is not None and not problem.microbatches_equal:
            schedule = schedule.without_times()  # planned with the stage values: the simulator times each microbatch
        return schedule

    return in_order(build, problem, order).renamed(name)


def applicable(problem: Problem, reasons: dict[str, str] | None = None,
               names: Iterable[str] | None = None, order: Order = None) -> Iterator[tuple[str, Schedule]]:
    """(name, schedule) of every registered schedule (or of `names`, in their order) that applies to
    `problem`, built one at a time (a caller may stop early) in `order` (`generate`); the reason
    each other one does not apply goes into `reasons` when given."""
    for name in (entry.name for entry in registered()) if names is None else names:
        try:
            schedule = generate(name, problem, order)
        except NotApplicableError as error:
            if reasons is not None:
                reasons[name] = str(error)
            continue
        yield name, schedule


def generate_applicable(problem: Problem, order: Order = None) -> tuple[dict[str, Schedule], dict[str, str]]:
    """Every registered schedule built for `problem` (in `order`, see `generate`): those that
    apply, by name in registry order, and for each of the others the reason it does not."""
    reasons: dict[str, str] = {}
    return dict(applicable(problem, reasons, order=order)), reasons


def require(condition: bool, schedule: str, needs: str) -> None:
    """Raise NotApplicableError('<schedule> needs <needs>') unless `condition` holds."""
    if not condition:
        raise NotApplicableError(f"{schedule} needs {needs}")
