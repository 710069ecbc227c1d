"""The one simulator: the only place where times, makespan, bubble rates and memory are computed.

`simulate(problem, schedule)` times the per-device orders, or verifies given start times, and
returns a `Simulation` with every metric; it names what is broken in a schedule.

engine: `simulate`, the steps in order. orders: the schedule read into op numbers, checked.
timing: the orders timed as soon as possible. verify: given start times checked. memory: memory
over time and its violations. result: `Simulation`, its metrics and serialisation.
"""

from zbopt.core.simulation.engine import simulate
from zbopt.core.simulation.orders import activation_choices
from zbopt.core.simulation.result import MemoryViolation, Simulation

__all__ = ["MemoryViolation", "Simulation", "activation_choices", "simulate"]
