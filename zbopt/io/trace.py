"""A simulated schedule as a trace for Perfetto and chrome://tracing (the Trace Event Format, JSON).

Why: people who study pipeline schedules look at profiler traces; a schedule zbopt predicts opens
in the same viewer, beside a measured one.

The trace holds, per device, one process ("device d", pid d + 1: Perfetto treats pid and tid 0
as the kernel's idle task) with a compute track and, where ops run on them, a device-to-host and a
host-to-device copy track and one track per place in an overlapped pair; one complete event ("X")
per op with its simulated start and duration, its kind, stage, chunk and microbatch in `args`; one
counter ("C") per device with its memory after each change; and a flow ("s" then "f") for every
dependency between devices, each end in the middle of its op's slice so that it binds to that
slice and not to a neighbour touching it. An overlapped pair is one slice on the compute track,
its members side by side on the pair tracks. Where the problem has the iteration's ends, each
device has a communication track with its unshards and gradient reductions, and its optimizer
step is a slice on its compute track.

Times are integers: the trace's microseconds are the problem's units times `ticks_per_unit`
(`trace_scale`: a power of ten, at least 1000, that makes the costs whole where the solvers'
resolution allows, so milliseconds given to three decimals become real microseconds). Each op's
start and end are rounded, never its duration alone, so back-to-back ops never overlap.
"""

from __future__ import annotations

import json
from pathlib import Path

from zbopt.core.kinds import KINDS
from zbopt.core.ops import COMPUTE_LANE, GATHER_LANE, OFFLOAD_LANE, RELOAD_LANE
from zbopt.core.problem import Problem
from zbopt.core.problem.microbatches import tokens_of
from zbopt.core.schedule import pair_text
from zbopt.core.simulation import Simulation
from zbopt.core.simulation.ends import END_NAMES
from zbopt.core.ticks import tick_scale
from zbopt.io.torch_format import TORCH_KIND
from zbopt.io.write import write_file

__all__ = ["COMMUNICATION_TRACK", "MIN_TICKS_PER_UNIT", "PAIR_TRACKS", "TORCH_KIND_WORDS", "TRACE_EXTENSION",
           "TRACK_NAMES", "chrome_trace", "comparison_trace", "measured_trace", "trace_scale", "write_chrome_trace",
           "write_comparison_trace", "write_measured_trace"]

TRACE_EXTENSION = ".trace.json"  # a trace is JSON too: .json alone names zbopt's schedule JSON
MIN_TICKS_PER_UNIT = 1000  # one problem unit shows as at least a millisecond
PAIR_TRACKS = (3, 4, 5)  # an overlapped pair's forward, then its backward's one or two ops
COMMUNICATION_TRACK = 6  # the iteration's ends: unshards and gradient reductions
GATHER_TRACK = 7  # re-gathers (G), FSDP's all-gather lane
TRACK_NAMES = {COMPUTE_LANE: "compute", OFFLOAD_LANE: "device-to-host", RELOAD_LANE: "host-to-device",
               **{track: f"pair member {place + 1}" for place, track in enumerate(PAIR_TRACKS)},
               COMMUNICATION_TRACK: "communication", GATHER_TRACK: "all-gather"}
TORCH_KIND_WORDS = {letter: KINDS[kind].word for kind, letter in TORCH_KIND.items()}  # torch's B is a full backward


def trace_scale(problem: Problem) -> int:
    """Trace microseconds per problem unit: the solvers' tick scale (`zbopt.core.ticks.tick_scale`),
    at least MIN_TICKS_PER_UNIT."""
    return max(MIN_TICKS_PER_UNIT, tick_scale(problem).ticks_per_unit)


def chrome_trace(simulation: Simulation) -> dict:
    """The trace of `simulation` as a JSON-able dict (see the module docstring)."""
    problem = simulation.problem
    scale = trace_scale(problem)
    return {"traceEvents": _schedule_events(simulation, scale), "displayTimeUnit": "ms",
            "otherData": {"schedule": simulation.schedule.name, "problem": problem.describe(),
                          "ticks_per_unit": scale, "time": _time_note(scale)}}


def comparison_trace(comparison) -> dict:
    """The traces of a comparison's rows in one file, each from time 0, so Perfetto shows the
    schedules one above the other: row r's device d is process "schedule · device d" (pid
    r·p + d + 1), in the table's order (shortest makespan first), on the problem's one scale, flow
    ids apart."""
    rows = comparison.rows
    problem = comparison.problem
    scale = trace_scale(problem)
    events: list[dict] = []
    flows = 0
    for place, row in enumerate(rows):
        events += _schedule_events(row.simulation, scale, first_pid=place * problem.num_devices + 1,
                                   label=f"{row.name} · ", first_flow=flows)
        flows += row.simulation.table.size
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedules": [row.name for row in rows], "problem": problem.describe(),
                          "ticks_per_unit": scale, "time": _time_note(scale)}}


def _time_note(scale: int) -> str:
    return f"trace microseconds = problem units x {scale}, from the first op's start"


def _schedule_events(simulation: Simulation, scale: int, *, first_pid: int = 1, label: str = "",
                     first_flow: int = 0) -> list[dict]:
    """One schedule's events: device d is process first_pid + d, named `label` + "device d"; flow
    ids start at first_flow."""
    problem, table = simulation.problem, simulation.table
    origin = simulation.origin

    def ticks(time: float) -> int:
        return round(float(time - origin) * scale)  # a Python float rounds to an int

    chunk_of = problem.chunk_of
    track_of = [GATHER_TRACK if lane == GATHER_LANE else lane for lane in table.lane]
    for pair in simulation.pairs:
        for place, member in enumerate(pair.members):
            track_of[member] = PAIR_TRACKS[place]
    tracks = {(table.device[i], track_of[i]) for i in range(table.size)}
    if simulation.ends is not None:
        tracks |= {(device, COMMUNICATION_TRACK) for device in range(problem.num_devices)}
    events = _track_names(problem.num_devices, tracks, first_pid, label) + _end_events(simulation, ticks, first_pid)
    for index in range(table.size):
        op = table.op(index)
        begin, end = ticks(simulation.start[index]), ticks(simulation.end[index])
        events.append({"ph": "X", "name": str(op), "cat": KINDS[op.kind].word, "pid": table.device[index] + first_pid,
                       "tid": track_of[index] + 1, "ts": begin, "dur": end - begin,
                       "args": {"kind": op.kind, "stage": op.stage, "chunk": chunk_of[op.stage],
                                "microbatch": op.microbatch, **_tokens(problem, op.microbatch),
                                "start": float(simulation.start[index]), "end": float(simulation.end[index])}})
    for pair in simulation.pairs:
        head = pair.members[0]
        begin, end = ticks(simulation.start[head]), ticks(simulation.end[head])
        events.append({"ph": "X", "name": pair_text([table.op(i) for i in pair.members]), "cat": "overlapped pair",
                       "pid": table.device[head] + first_pid, "tid": COMPUTE_LANE + 1, "ts": begin,
                       "dur": end - begin, "args": {"cost": pair.cost, "start": float(simulation.start[head]),
                                                    "end": float(simulation.end[head])}})
    for device, (times, levels) in enumerate(simulation.memory_steps):
        events.extend({"ph": "C", "name": "memory", "pid": device + first_pid, "ts": ticks(time),
                       "args": {"held": level}} for time, level in zip(times.tolist(), levels.tolist(), strict=True))
    for consumer, producer in enumerate(table.predecessor):
        if producer < 0 or table.device[producer] == table.device[consumer]:
            continue
        for phase, index in (("s", producer), ("f", consumer)):  # in the middle of the op's slice
            middle = (ticks(simulation.start[index]) + ticks(simulation.end[index])) / 2
            events.append({"ph": phase, "name": "dependency", "cat": "dependency", "id": first_flow + consumer,
                           "bp": "e", "pid": table.device[index] + first_pid, "tid": track_of[index] + 1,
                           "ts": middle})
    return events


def _end_events(simulation: Simulation, ticks, first_pid: int) -> list[dict]:
    """The iteration's ends (`EndTimes.windows`): each stage's unshard and gradient reduction on its
    device's communication track, named as torch's actions ("0UNSHARD", "0REDUCE_GRAD"), and each
    device's optimizer step on its compute track."""
    if simulation.ends is None:
        return []
    return [{"ph": "X", "name": window.name, "cat": END_NAMES[window.what], "pid": window.device + first_pid,
             "tid": (COMPUTE_LANE if window.what == "step" else COMMUNICATION_TRACK) + 1, "ts": ticks(window.begin),
             "dur": ticks(window.end) - ticks(window.begin), "args": {"start": window.begin, "end": window.end}}
            for window in simulation.ends.windows(simulation.problem)]


def _track_names(num_devices: int, tracks: set[tuple[int, int]], first_pid: int = 1, label: str = "") -> list[dict]:
    """The metadata events naming each device's process (`label` + "device d", in device order)
    and each of its (device, track) tracks."""
    events = []
    for device in range(num_devices):
        pid = device + first_pid
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{label}device {device}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
    for device, track in sorted(tracks):
        events.append({"ph": "M", "name": "thread_name", "pid": device + first_pid, "tid": track + 1,
                       "args": {"name": TRACK_NAMES[track]}})
    return events


def measured_trace(report) -> dict:
    """The last timed step of a `zbopt.interfaces.runtime.run_torch` report in the same layout as
    `chrome_trace` (the predicted step opens beside it): per rank its process and compute track,
    one complete event per torch action run, named as torch names it ("3F1", "3I1", "3W1", and
    "3B1" for a full backward, zbopt's B and W or BW; the loss within the last stage's F), at
    microseconds from the step's first op on the clock all ranks share. No memory counters or
    flows: the run measures neither over time."""
    first = min((start for *_, start, _ in report.intervals), default=0.0)

    def microseconds(seconds: float) -> int:
        return round(float(seconds - first) * 1e6)

    events = _track_names(report.num_ranks, {(rank, COMPUTE_LANE) for rank, *_ in report.intervals})
    for rank, stage, kind, microbatch, start, end in report.intervals:
        begin = microseconds(start)
        events.append({"ph": "X", "name": f"{stage}{kind}{microbatch}", "cat": TORCH_KIND_WORDS[kind],
                       "pid": rank + 1, "tid": COMPUTE_LANE + 1, "ts": begin, "dur": microseconds(end) - begin,
                       "args": {"kind": kind, "stage": stage, "microbatch": microbatch}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": report.path, "measured": "torch.distributed.pipelining, the last of "
                          f"{report.steps} steps", "time": "trace microseconds from the step's first op"}}


def write_chrome_trace(path: str | Path, simulation: Simulation, split: dict | None = None) -> None:
    """Write `chrome_trace` to `path` (open it in ui.perfetto.dev or chrome://tracing); a plan's
    `split` (layers per stage) goes into its otherData."""
    trace = chrome_trace(simulation)
    if split is not None:
        trace["otherData"]["split"] = split
    _write(path, trace)


def write_comparison_trace(path: str | Path, comparison) -> None:
    """Write `comparison_trace` to `path`."""
    _write(path, comparison_trace(comparison))


def write_measured_trace(path: str | Path, report) -> None:
    """Write `measured_trace` to `path`."""
    _write(path, measured_trace(report))


def _write(path: str | Path, trace: dict) -> None:
    write_file(path, json.dumps(trace, separators=(",", ":")) + "\n")


def _tokens(problem: Problem, microbatch: int) -> dict:
    """{"tokens": the microbatch's tokens} where the problem gives them; else nothing."""
    tokens = tokens_of(problem, microbatch)
    return {} if tokens is None else {"tokens": tokens}
