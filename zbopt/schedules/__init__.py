"""Heuristic schedule generators, one module per family, all registered by name."""

from zbopt.schedules import (
    classic,  # noqa: F401  (registers gpipe, 1f1b)
    dualpipe,  # noqa: F401
    interleaved,  # noqa: F401
    vshape,  # noqa: F401
    zero_bubble,  # noqa: F401
)
from zbopt.schedules.registry import generate, generate_applicable, get, register, registered, require

__all__ = ["generate", "generate_applicable", "get", "register", "registered", "require"]
