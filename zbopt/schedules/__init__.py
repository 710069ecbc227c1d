"""Heuristic schedule generators, one module per family, all registered by name; and torch's
built-in schedules ("torch:NAME"), resolved beside them by `named_schedule`."""

# The families register in the order `zbopt schedules` lists them; the block-built schedules,
# registered from the building blocks' floor, list after zero_bubble's, as built on these four.
# isort: off
from zbopt.schedules import (
    vshape_greedy,  # noqa: F401  (zb-v, v-half, v-zb, zb-v-auto)
    vshape,  # noqa: F401  (its rules list beside the authors' algorithms above)
    classic,  # noqa: F401  (registers gpipe, 1f1b)
    seq1f1b,  # noqa: F401  (1F1B over sequence slices)
    interleaved,  # noqa: F401
    hanayo,  # noqa: F401  (the wave on placement v, after the interleaved schedules)
    combined,  # noqa: F401  (1F1B and interleaved 1F1B with overlapped F&B pairs)
    zero_bubble,  # noqa: F401
    dualpipe,  # noqa: F401
    chimera,  # noqa: F401  (bidirectional, after dualpipe)
    bitpipe,  # noqa: F401  (bidirectional with two V's, after chimera)
    greedy,  # noqa: F401  (the fallback for any memory limit)
    offload,  # noqa: F401  (registers pipeoffload after the bases it adds copies to)
    recompute,  # noqa: F401  (registers the full-recomputation variants after their bases)
)
# isort: on

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
