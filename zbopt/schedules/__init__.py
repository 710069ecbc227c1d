"""Heuristic schedule generators, one module per family, all registered by name; and torch's
built-in schedules ("torch:NAME"), resolved beside them by `named_schedule`."""

from zbopt.schedules import (
    block_built,  # noqa: F401  (registers block-NAME after the families it builds)
    classic,  # noqa: F401  (registers gpipe, 1f1b)
    dualpipe,  # noqa: F401
    greedy,  # noqa: F401  (the fallback for any memory limit)
    interleaved,  # noqa: F401
    offload,  # noqa: F401  (registers pipeoffload after the bases it adds copies to)
    recompute,  # noqa: F401  (registers the full-recomputation variants after their bases)
    vshape,  # noqa: F401
    zero_bubble,  # noqa: F401
)
from zbopt.schedules.registry import (
    applicable,
    generate,
    generate_applicable,
    get,
    register,
    registered,
    require,
)
from zbopt.schedules.torch_builtin import TORCH_PREFIX, TORCH_REFUSED, TORCH_SCHEDULES, named_schedule, torch_schedule

__all__ = ["TORCH_PREFIX", "TORCH_REFUSED", "TORCH_SCHEDULES", "applicable", "generate", "generate_applicable", "get",
           "named_schedule", "register", "registered", "require", "torch_schedule"]
