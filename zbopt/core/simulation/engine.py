"""`simulate`: the simulator's steps in order. Read the schedule into op numbers (`orders`), time
its orders as soon as possible (`timing`) or verify its given start times (`verify`), follow each
device's memory (`memory`) and return the `Simulation`.

It names what is broken: a missing, duplicated or misplaced op, a deadlock, a start time that
breaks a dependency or overlaps, a memory violation."""

from __future__ import annotations

import numpy as np

from zbopt.core.errors import MemoryLimitError
from zbopt.core.ops import op_table
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import compute_slowed
from zbopt.core.schedule import Schedule
from zbopt.core.simulation.ends import end_times
from zbopt.core.simulation.memory import memory_steps, memory_violations
from zbopt.core.simulation.orders import activation_choices, index_orders, overlapped_pairs
from zbopt.core.simulation.result import Simulation
from zbopt.core.simulation.timing import time_orders
from zbopt.core.simulation.verify import check_shared_links, given_starts, verify_times

__all__ = ["simulate"]


def simulate(problem: Problem, schedule: Schedule, *, strict: bool = False) -> Simulation:
    """Time (or verify) `schedule` on `problem` and compute its metrics.

    Parameters
    ----------
    problem : the problem the schedule is for.
    schedule : per-device orders; with start times, those are verified instead of computed (see Notes).
    strict : raise MemoryLimitError on a memory violation instead of reporting it.

    Returns
    -------
    Simulation with start/end times and every metric (see `Simulation`).

    Raises
    ------
    ScheduleError : an op is missing, duplicated, unknown or on the wrong device, or a given start
        time overlaps another op on its device or starts before a dependency allows.
    DeadlockError : the orders wait on each other in a cycle; names each stuck device.
    MemoryLimitError : with strict=True, the first memory violation (device, time, amount).

    Notes
    -----
    An O or L runs on its device's copy lane (`Problem.allow_offload`); it is issued when the
    compute op listed before it has ended (a runtime reaches it in its program there), and starts
    once its lane is free and its F (for O) or O (for L) has ended; compute does not wait for it,
    only the backward waits for its L. With a shared host link, two copies of a device pair that
    overlap on a lane are a ScheduleError. The iteration's ends (`Problem.iteration_ends`) are
    timed as torch's lowering places them (`ends`): a forward waits for its stage's unshard. Where
    compute slows while its device communicates (`comm_slowdown`), given start times are verified
    without it (a plan's times leave it out), then kept as each op's earliest start: every op is
    timed as soon as possible from there (the simulation's times, not the schedule's, are its own).

    Examples
    --------
    >>> from zbopt.schedules import generate
    >>> problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    >>> simulate(problem, generate("1f1b", problem)).makespan
    33.0
    """
    table = op_table(problem, *activation_choices(schedule))
    orders = index_orders(problem, table, schedule)
    pairs = overlapped_pairs(problem, table, schedule, orders)
    device_ops = tuple(np.asarray(indices, dtype=np.int64) for indices in orders)
    if schedule.start_times is None:
        start, end = time_orders(table, orders, pairs)
    elif compute_slowed(problem):  # valid without the slowdown, then each op as soon as possible from its own
        verify_times(table, orders, schedule.start_times, pairs)
        start, end = time_orders(table, orders, pairs, not_before=given_starts(table, orders, schedule.start_times))
    else:
        start, end = verify_times(table, orders, schedule.start_times, pairs)
    if problem.offload is not None and problem.offload.shared_host_link:
        check_shared_links(table, start, end, as_soon_as_possible=schedule.start_times is None)
    ends = None if problem.iteration_ends is None else end_times(problem, table, end)
    steps, memory_after = memory_steps(problem, table, start, end, ends)
    violations = memory_violations(problem, steps)
    if strict and violations:
        raise MemoryLimitError(str(violations[0]))
    return Simulation(problem, schedule, table, device_ops, start, end, steps, violations, pairs, memory_after, ends)
