"""zbopt: optimal and heuristic pipeline-parallel training schedules, on one shared simulator."""

from zbopt.compare import Comparison, ComparisonRow, compare
from zbopt.errors import (
    DeadlockError,
    MemoryLimitError,
    NotApplicableError,
    ProblemError,
    ScheduleError,
    UnknownScheduleError,
    ZboptError,
)
from zbopt.frontier import Frontier, memory_frontier
from zbopt.ops import Op, critical_path, device_work, op_graph
from zbopt.problem import Problem
from zbopt.schedule import Schedule, load_schedule, save_schedule
from zbopt.schedules import generate, registered
from zbopt.simulate import MemoryViolation, Simulation, simulate
from zbopt.solvers import SolveResult, lower_bounds, solve

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "ComparisonRow",
    "DeadlockError",
    "Frontier",
    "MemoryLimitError",
    "MemoryViolation",
    "NotApplicableError",
    "Op",
    "Problem",
    "ProblemError",
    "Schedule",
    "ScheduleError",
    "Simulation",
    "SolveResult",
    "UnknownScheduleError",
    "ZboptError",
    "compare",
    "critical_path",
    "device_work",
    "generate",
    "load_schedule",
    "lower_bounds",
    "memory_frontier",
    "op_graph",
    "registered",
    "save_schedule",
    "simulate",
    "solve",
]
