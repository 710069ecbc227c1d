"""The one simulator: the only place where times, makespan, bubble rates and memory are computed.

`simulate(problem, schedule)` times the per-device orders, or verifies given start times, and
returns a `Simulation` with every metric; it names what is broken in a schedule.
"""

from zbopt.simulation.engine import activation_choices, simulate
from zbopt.simulation.result import MemoryViolation, Simulation

__all__ = ["MemoryViolation", "Simulation", "activation_choices", "simulate"]
