"""torch.distributed.pipelining's built-in schedules by name ("torch:NAME"), beside zbopt's own.

Each built-in computes every rank's `pipeline_order` from the stage count, group size and
microbatch count alone; zbopt reads that order through the torch CSV reader, so a built-in is
checked and simulated like any schedule. torch is imported only when a built-in is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from zbopt.core.errors import MissingSettingsError, NotApplicableError, ScheduleError, UnknownScheduleError, ZboptError
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.io.torch_order import TorchOrder
from zbopt.schedules.ordering import Order, in_order
from zbopt.schedules.registry import generate

__all__ = ["TORCH_NEEDS", "TORCH_PREFIX", "TORCH_REFUSED", "TORCH_SCHEDULES", "named_schedule", "torch_schedule"]


@dataclass(frozen=True)
class _Needs:
    """What a torch built-in's order needs of the problem (tests check each against torch's order)."""

    chunks_per_device: int | None = None  # stages per rank; None: any number
    placement: str = "loop"  # of the stages, when a rank holds more than one
    split_backward: bool = False  # its order has I and W steps: the problem needs weight_times


# torch 2.13's get_schedule_class names of the schedules that build their own order, and their needs
TORCH_NEEDS = {
    "GPipe": _Needs(chunks_per_device=1),
    "1F1B": _Needs(chunks_per_device=1),
    "LoopedBFS": _Needs(),
    "Interleaved1F1B": _Needs(),
    "InterleavedZeroBubble": _Needs(split_backward=True),
    "ZBVZeroBubble": _Needs(chunks_per_device=2, placement="v", split_backward=True),
    "DualPipeV": _Needs(chunks_per_device=2, placement="v", split_backward=True),
}
TORCH_SCHEDULES = tuple(TORCH_NEEDS)
# torch 2.13's Schedule1F1B numbers its last rank's forwards 1..m: zbopt refuses its order
TORCH_REFUSED = ("1F1B",)
TORCH_PREFIX = "torch:"


def _missing_settings(needs: _Needs, problem: Problem) -> dict[str, object]:
    """Config key -> a value that works, for every setting of `problem` a built-in cannot run on."""
    missing: dict[str, object] = {}
    chunks = needs.chunks_per_device or problem.chunks_per_device
    if chunks != problem.chunks_per_device:
        missing["chunks_per_device"] = chunks
    if chunks > 1 and problem.placement != needs.placement:
        missing["placement"] = needs.placement
    if needs.split_backward and not problem.split_backward:
        missing["weight_times"] = 1
    if problem.iterations != 1:
        missing["iterations"] = 1
    return missing


def _describe(settings: dict[str, object]) -> str:
    """The missing settings as one clause each: "chunks_per_device = 2, placement 'v' and weight_times (...)"."""
    clauses = [f"placement '{value}'" if key == "placement"
               else "weight_times (its order splits the backward into I and W)" if key == "weight_times"
               else f"{key} = {value}" for key, value in settings.items()]
    return clauses[0] if len(clauses) == 1 else f"{', '.join(clauses[:-1])} and {clauses[-1]}"


def named_schedule(name: str, problem: Problem, order: Order = None, **options) -> Schedule:
    """A registered schedule with its `options`, or for "torch:NAME" torch's built-in NAME (which
    takes no options), its microbatches entering in `order` (`generate`): the one place a schedule
    name is resolved for the CLI and `compare`."""
    if not name.startswith(TORCH_PREFIX):
        return generate(name, problem, order, **options)
    if options:
        raise ZboptError(f"torch's schedules take no options ('{name}' given {', '.join(options)})")
    return in_order(lambda planned: torch_schedule(name.removeprefix(TORCH_PREFIX), planned), problem, order)


def torch_schedule(name: str, problem: Problem) -> Schedule:
    """torch.distributed.pipelining's built-in schedule `name` for `problem`, named "torch:<name>".

    `name` is one of TORCH_SCHEDULES, as torch's `get_schedule_class` takes it (any case, "Schedule"
    prefix optional). The classes compute every rank's `pipeline_order` in their constructor from
    the stage count, group size and microbatch count alone; they get stand-in stages carrying those
    numbers (and `submod=None`, which the torch.compile check skips), because a real PipelineStage
    needs a process group and a module that the order never reads. The REDUCE_GRAD steps of GPipe
    and 1F1B (data-parallel gradient reduction, no pipeline work) are left out; all else goes through
    the CSV reader's checks.

    Raises ZboptError when torch is missing, UnknownScheduleError for an unknown name,
    MissingSettingsError naming at once every setting the class needs (TORCH_NEEDS: stages per rank,
    placement, a split backward, one training step) and NotApplicableError when torch's class
    rejects the problem itself (e.g. too few microbatches).
    """
    key = name[len("schedule"):] if name.lower().startswith("schedule") else name
    spelled = {known.lower(): known for known in TORCH_SCHEDULES}
    if key.lower() not in spelled:
        raise UnknownScheduleError(f"unknown torch schedule '{name}' (known: {', '.join(TORCH_SCHEDULES)})")
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        raise ZboptError("torch schedules need torch.distributed.pipelining: pip install 'zbopt[torch]'") from None
    cls = schedules.get_schedule_class(key)
    if problem.sequence_slices > 1:
        raise NotApplicableError(f"torch's {cls.__name__} needs sequence_slices = 1 (it knows no slices)")
    missing = _missing_settings(TORCH_NEEDS[spelled[key.lower()]], problem)
    if missing:
        raise MissingSettingsError(f"torch's {cls.__name__} needs {_describe(missing)}", missing)
    p, v = problem.num_devices, problem.chunks_per_device
    stages = [SimpleNamespace(num_stages=p * v, group_size=p, group_rank=0, submod=None) for _ in range(v)]
    single = issubclass(cls, schedules.PipelineScheduleSingle)
    try:
        built = cls(stages[0] if single else stages, problem.num_microbatches)
    except (ValueError, AssertionError) as error:
        raise NotApplicableError(f"torch's {cls.__name__}: {str(error).splitlines()[0]}") from None
    order = TorchOrder.from_cells([[(str(action), f"torch {cls.__name__} rank {rank}, step {step}")
                                    for step, action in enumerate(built.pipeline_order[rank])
                                    if action is not None and action.computation_type != schedules.REDUCE_GRAD]
                                   for rank in range(p)], f"torch {cls.__name__}")
    try:
        return order.to_schedule(problem, TORCH_PREFIX + cls.__name__.removeprefix("Schedule"))
    except ScheduleError as error:  # torch 2.13's Schedule1F1B numbers the last rank's forwards 1..m
        raise ScheduleError(f"torch's {cls.__name__} builds an invalid pipeline_order: {error}") from None
