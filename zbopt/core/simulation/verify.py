"""Verifying given start times: device order without overlap, dependencies with latency, barriers,
restores, overlapped pairs and shared host links, up to the one tolerance."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from zbopt.core.errors import ScheduleError
from zbopt.core.kinds import REGATHER
from zbopt.core.ops import COMPUTE_LANE, OFFLOAD_LANE, RELOAD_LANE, OpTable
from zbopt.core.schedule import pair_text
from zbopt.core.simulation.ends import end_times
from zbopt.core.simulation.result import Pair
from zbopt.core.simulation.timing import barrier_groups, same_device_input_name
from zbopt.core.tolerance import RELATIVE_TOLERANCE

__all__ = ["check_shared_links", "given_starts", "verify_times"]


def verify_times(table: OpTable, orders: list[list[int]], start_times,
                  pairs: tuple[Pair, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Check given start times: ops on a device in order without overlap, dependencies and latency
    (and iteration barriers) respected, up to a relative tolerance; an overlapped pair's members
    start together and end after its cost."""
    start = given_starts(table, orders, start_times)
    end = start + np.asarray(table.duration)
    pair_of = np.full(table.size, -1)
    for number, pair in enumerate(pairs):
        members = list(pair.members)
        if np.ptp(start[members]) > 0:
            names = ", ".join(f"{table.op(i)} at {start[i]:g}" for i in members)
            text = pair_text([table.op(i) for i in members])
            raise ScheduleError(f"pair {text}: its ops start together, not {names}")
        end[members] = start[members[0]] + pair.cost
        pair_of[members] = number
    tolerance = RELATIVE_TOLERANCE * max(1.0, float(np.abs(end).max()))
    for device, indices in enumerate(orders):
        for before, after in _listed_before(table, indices):
            if pair_of[before] >= 0 and pair_of[before] == pair_of[after]:
                continue  # one op
            if start[after] < end[before] - tolerance:
                raise ScheduleError(
                    f"device {device}: {table.op(after)} starts at {start[after]:g}, before {table.op(before)} "
                    f"(listed before it) ends at {end[before]:g}"
                )
    _check_inputs(table, start, end, pair_of, tolerance)
    return start, end


def given_starts(table: OpTable, orders: list[list[int]], start_times) -> np.ndarray:
    """Per op (numbered by `table`), its start time as given in `start_times`, per device in its order."""
    start = np.zeros(table.size)
    for indices, times in zip(orders, start_times, strict=True):
        start[indices] = times
    return start


def _check_inputs(table: OpTable, start: np.ndarray, end: np.ndarray, pair_of: np.ndarray, tolerance: float) -> None:
    """Every op starts after its inputs: its dependency plus latency, its same-device inputs, its
    stage's weight update (iteration barriers) and its release (FSDP's unshard; in a later
    iteration, its device's step and its stage's next unshard)."""
    predecessor = np.asarray(table.predecessor)
    has_source = (predecessor >= 0) & ((pair_of < 0) | (pair_of[predecessor] != pair_of))  # W after its B in a pair
    ready = np.full(table.size, -np.inf)
    ready[has_source] = end[predecessor[has_source]] + np.asarray(table.latency)[has_source]
    for index, inputs in enumerate(table.same_device_inputs):
        for other in inputs:
            ready[index] = max(ready[index], end[other])
    waits, _, _ = barrier_groups(table)
    for index in np.flatnonzero(np.asarray(waits) >= 0):
        stage, iteration = divmod(waits[index], table.barrier_count)
        ready[index] = max(ready[index], end[list(table.iteration_barrier(stage, iteration))].max())
    release = np.asarray(table.release)
    if table.problem.iteration_ends is not None and table.problem.iterations > 1:
        release = end_times(table.problem, table, end).releases(table)  # later iterations' after the steps
    ready = np.maximum(ready, release)
    early = np.flatnonzero(start < ready - tolerance)
    if early.size:
        index = int(early[0])
        source = table.predecessor[index]
        op = table.op(index)
        for other in table.same_device_inputs[index]:
            if start[index] < end[other] - tolerance:
                raise ScheduleError(f"{op} starts at {start[index]:g}, before "
                                    f"{same_device_input_name(table, index, other)} ends at {end[other]:g}")
        if source >= 0 and start[index] < end[source] + table.latency[index] - tolerance:
            latency = f" plus latency {table.latency[index]:g}" if table.latency[index] else ""
            raise ScheduleError(
                f"{op} starts at {start[index]:g}, before its dependency {table.op(source)} "
                f"(device {table.device[source]}) ends at {end[source]:g}{latency}"
            )
        if start[index] < release[index] - tolerance:
            after = ("its device's unshards (its all-gather lane)" if op.kind == REGATHER else
                     "its stage's unshard (FSDP's all-gather)" if any(table.problem.iteration_ends.unshard_times)
                     else "its device's optimizer step")
            raise ScheduleError(f"{op} starts at {start[index]:g}, before {after} ends at {release[index]:g}")
        raise ScheduleError(f"{op} starts at {start[index]:g}, before its stage's weight update at {ready[index]:g}")


def _listed_before(table: OpTable, indices):
    """(before, after) pairs of one device's order that may not overlap: each op and the compute op
    listed last before it (a copy is issued once that has ended), and each copy and the copy listed
    last before it on its lane."""
    lane = table.lane
    if not any(lane[index] for index in indices):
        yield from pairwise(indices)
        return
    last = {}  # lane -> the op listed last on it so far
    for index in indices:
        if COMPUTE_LANE in last:
            yield last[COMPUTE_LANE], index
        if lane[index] != COMPUTE_LANE and lane[index] in last:
            yield last[lane[index]], index
        last[lane[index]] = index


def check_shared_links(table: OpTable, start: np.ndarray, end: np.ndarray, as_soon_as_possible: bool) -> None:
    """With devices 2k and 2k+1 sharing a host link, no two copies of a pair overlap on a lane.
    Which of a pair's copies goes first is in neither device's order, so orders timed as soon as
    possible may clash here: the message then asks for start times."""
    lane = np.asarray(table.lane)
    device = np.asarray(table.device)
    link = np.asarray([table.problem.host_link(d) for d in table.device])
    tolerance = RELATIVE_TOLERANCE * max(1.0, float(np.abs(end).max()))
    for copy_lane in (OFFLOAD_LANE, RELOAD_LANE):
        copies = np.flatnonzero(lane == copy_lane)
        order = copies[np.lexsort((start[copies], link[copies]))]
        for before, after in pairwise(order):
            if link[before] == link[after] and start[after] < end[before] - tolerance:
                direction = "device-to-host" if copy_lane == OFFLOAD_LANE else "host-to-device"
                hint = "; whose copy goes first is in neither order: give start times" if as_soon_as_possible else ""
                raise ScheduleError(
                    f"{table.op(after)} (device {device[after]}) starts at {start[after]:g}, while "
                    f"{table.op(before)} (device {device[before]}) holds their shared host link "
                    f"({direction}) until {end[before]:g}{hint}")
