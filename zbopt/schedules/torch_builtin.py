"""torch.distributed.pipelining's built-in schedules by name ("torch:NAME"), beside zbopt's own.

Each built-in computes every rank's `pipeline_order` from the stage count, group size and
microbatch count alone; zbopt reads that order through the torch CSV reader, so a built-in is
checked and simulated like any schedule. torch is imported only when a built-in is asked for.
"""

from __future__ import annotations

from types import SimpleNamespace

from zbopt.errors import NotApplicableError, ScheduleError, UnknownScheduleError, ZboptError
from zbopt.io.torch_format import TorchOrder
from zbopt.problem import Problem
from zbopt.schedule import Schedule
from zbopt.schedules.registry import generate

# torch 2.13's get_schedule_class names of the schedules that build their own order
TORCH_SCHEDULES = ("GPipe", "1F1B", "LoopedBFS", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble",
                   "DualPipeV")
TORCH_PREFIX = "torch:"


def named_schedule(name: str, problem: Problem, **options) -> Schedule:
    """A registered schedule with its `options`, or for "torch:NAME" torch's built-in NAME (which
    takes no options): the one place a schedule name is resolved for the CLI and `compare`."""
    if not name.startswith(TORCH_PREFIX):
        return generate(name, problem, **options)
    if options:
        raise ZboptError(f"torch's schedules take no options ('{name}' given {', '.join(options)})")
    return torch_schedule(name.removeprefix(TORCH_PREFIX), problem)


def torch_schedule(name: str, problem: Problem) -> Schedule:
    """torch.distributed.pipelining's built-in schedule `name` for `problem`, named "torch:<name>".

    `name` is one of TORCH_SCHEDULES, as torch's `get_schedule_class` takes it (any case, "Schedule"
    prefix optional). The classes compute every rank's `pipeline_order` in their constructor from
    the stage count, group size and microbatch count alone; they get stand-in stages carrying those
    numbers (and `submod=None`, which the torch.compile check skips), because a real PipelineStage
    needs a process group and a module that the order never reads. The REDUCE_GRAD steps of GPipe
    and 1F1B (data-parallel gradient reduction, no pipeline work) are left out; all else goes through
    the CSV reader's checks.

    Raises ZboptError when torch is missing, UnknownScheduleError for an unknown name and
    NotApplicableError when torch's class rejects the problem or needs another layout.
    """
    key = name[len("schedule"):] if name.lower().startswith("schedule") else name
    if key.lower() not in {known.lower() for known in TORCH_SCHEDULES}:
        raise UnknownScheduleError(f"unknown torch schedule '{name}' (known: {', '.join(TORCH_SCHEDULES)})")
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:
        raise ZboptError("torch schedules need torch.distributed.pipelining: pip install 'zbopt[torch]'") from None
    cls = schedules.get_schedule_class(key)
    title = cls.__name__.removeprefix("Schedule")
    if problem.iterations != 1:
        raise ZboptError(f"torch's {cls.__name__} holds one training step: iterations = {problem.iterations} "
                         f"must be 1")
    p, v = problem.num_devices, problem.chunks_per_device
    stages = [SimpleNamespace(num_stages=p * v, group_size=p, group_rank=0, submod=None) for _ in range(v)]
    single = issubclass(cls, schedules.PipelineScheduleSingle)
    if single and v != 1:
        raise NotApplicableError(f"torch's {cls.__name__} runs one stage per rank: it needs chunks_per_device = 1")
    try:
        built = cls(stages[0] if single else stages, problem.num_microbatches)
    except (ValueError, AssertionError) as error:
        raise NotApplicableError(f"torch's {cls.__name__}: {str(error).splitlines()[0]}") from None
    order = TorchOrder.from_cells([[(str(action), f"torch {cls.__name__} rank {rank}, step {step}")
                                    for step, action in enumerate(built.pipeline_order[rank])
                                    if action is not None and action.computation_type != schedules.REDUCE_GRAD]
                                   for rank in range(p)], f"torch {cls.__name__}")
    if v > 1 and order.layout["placement"] != problem.placement:
        raise NotApplicableError(f"torch's {cls.__name__} needs placement '{order.layout['placement']}'")
    if order.split_backward and not problem.split_backward:
        raise NotApplicableError(f"torch's {cls.__name__} splits the backward (I, W): it needs weight_times")
    try:
        return order.to_schedule(problem, TORCH_PREFIX + title)
    except ScheduleError as error:  # torch 2.13's Schedule1F1B numbers the last rank's forwards 1..m
        raise ScheduleError(f"torch's {cls.__name__} builds an invalid pipeline_order: {error}") from None
