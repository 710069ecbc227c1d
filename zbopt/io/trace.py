"""A simulated schedule as a trace for Perfetto and chrome://tracing (the Trace Event Format, JSON).

Why: people who study pipeline schedules look at profiler traces; a schedule zbopt predicts opens
in the same viewer, beside a measured one.

The trace holds, per device, one process ("device d") with a compute track and, where ops run on
them, a device-to-host and a host-to-device copy track and a track of overlapped pairs' members;
one complete event ("X") per op with its simulated start and duration, its kind, stage, chunk and
microbatch in `args`; one counter ("C") per device with its memory after each change; and a flow
("s" then "f", both bound to their enclosing slice) for every dependency between devices. An
overlapped pair is one slice on the compute track, its members nested on the pair track.

Times are integers: the trace's microseconds are the problem's units times `ticks_per_unit`
(`trace_scale`: a power of ten, at least 1000, that makes the costs whole, so milliseconds given
to three decimals become real microseconds). Each op's start and end are rounded, never its
duration alone, so back-to-back ops never overlap.
"""

from __future__ import annotations

import json
from pathlib import Path

from zbopt.io.torch_format import TORCH_KIND
from zbopt.ops import COMPUTE_LANE, KIND_WORDS, OFFLOAD_LANE, RELOAD_LANE
from zbopt.schedule import pair_text
from zbopt.simulate import Simulation
from zbopt.ticks import tick_scale

MIN_TICKS_PER_UNIT = 1000  # one problem unit shows as at least a millisecond
PAIR_TRACK = 3
TRACK_NAMES = {COMPUTE_LANE: "compute", OFFLOAD_LANE: "device-to-host", RELOAD_LANE: "host-to-device",
               PAIR_TRACK: "overlapped pair members"}
TORCH_KIND_WORDS = {letter: KIND_WORDS[kind] for kind, letter in TORCH_KIND.items()}  # torch's B is a full backward


def trace_scale(simulation: Simulation) -> int:
    """Trace microseconds per problem unit: the solvers' tick scale (`zbopt.ticks.tick_scale`),
    at least MIN_TICKS_PER_UNIT."""
    return max(MIN_TICKS_PER_UNIT, tick_scale(simulation.problem).ticks_per_unit)


def chrome_trace(simulation: Simulation) -> dict:
    """The trace of `simulation` as a JSON-able dict (see the module docstring)."""
    problem, table = simulation.problem, simulation.table
    scale = trace_scale(simulation)
    origin = float(simulation.start.min())

    def ticks(time: float) -> int:
        return round((time - origin) * scale)

    chunk_of = {stage: chunk for stages in problem.stages_of_device for chunk, stage in enumerate(stages)}
    paired = {member for pair in simulation.pairs for member in pair.members}
    track_of = [PAIR_TRACK if index in paired else table.lane[index] for index in range(table.size)]
    events = _track_names(problem.num_devices, {(table.device[i], track_of[i]) for i in range(table.size)})
    for index in range(table.size):
        op = table.op(index)
        begin, end = ticks(simulation.start[index]), ticks(simulation.end[index])
        events.append({"ph": "X", "name": str(op), "cat": KIND_WORDS[op.kind], "pid": table.device[index],
                       "tid": track_of[index], "ts": begin, "dur": end - begin,
                       "args": {"kind": op.kind, "stage": op.stage, "chunk": chunk_of[op.stage],
                                "microbatch": op.microbatch, "start": float(simulation.start[index]),
                                "end": float(simulation.end[index])}})
    for pair in simulation.pairs:
        head = pair.members[0]
        begin, end = ticks(simulation.start[head]), ticks(simulation.end[head])
        events.append({"ph": "X", "name": pair_text([table.op(i) for i in pair.members]), "cat": "overlapped pair",
                       "pid": table.device[head], "tid": COMPUTE_LANE, "ts": begin, "dur": end - begin,
                       "args": {"cost": pair.cost, "start": float(simulation.start[head]),
                                "end": float(simulation.end[head])}})
    for device, (times, levels) in enumerate(simulation.memory_steps):
        events.extend({"ph": "C", "name": "memory", "pid": device, "ts": ticks(time), "args": {"held": float(level)}}
                      for time, level in zip(times.tolist(), levels.tolist(), strict=True))
    for consumer, producer in enumerate(table.predecessor):
        if producer < 0 or table.device[producer] == table.device[consumer]:
            continue
        for phase, index in (("s", producer), ("f", consumer)):
            events.append({"ph": phase, "name": "dependency", "cat": "dependency", "id": consumer, "bp": "e",
                           "pid": table.device[index], "tid": track_of[index], "ts": ticks(simulation.start[index])})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": simulation.schedule.name, "problem": problem.describe(),
                          "ticks_per_unit": scale,
                          "time": f"trace microseconds = problem units x {scale}, from the first op's start"}}


def _track_names(num_devices: int, tracks: set[tuple[int, int]]) -> list[dict]:
    """The metadata events naming each device's process ("device d", in device order) and each
    of its (device, track) tracks."""
    events = []
    for device in range(num_devices):
        events.append({"ph": "M", "name": "process_name", "pid": device, "args": {"name": f"device {device}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": device, "args": {"sort_index": device}})
    for device, track in sorted(tracks):
        events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": track,
                       "args": {"name": TRACK_NAMES[track]}})
    return events


def measured_trace(report) -> dict:
    """The last timed step of a `zbopt.runtime.run_torch` report in the same form as
    `chrome_trace` (the predicted step opens beside it): per rank its process and compute track,
    one complete event per torch action run ("3F1", "3I1", "3W1", "3B1", the loss within the last
    stage's F), at microseconds from the step's first op on the clock all ranks share. No memory
    counters or flows: the run measures neither over time."""
    first = min((start for *_, start, _ in report.intervals), default=0.0)

    def microseconds(seconds: float) -> int:
        return round((seconds - first) * 1e6)

    events = _track_names(report.num_ranks, {(rank, COMPUTE_LANE) for rank, *_ in report.intervals})
    for rank, stage, kind, microbatch, start, end in report.intervals:
        begin = microseconds(start)
        events.append({"ph": "X", "name": f"{stage}{kind}{microbatch}", "cat": TORCH_KIND_WORDS[kind], "pid": rank,
                       "tid": COMPUTE_LANE, "ts": begin, "dur": microseconds(end) - begin,
                       "args": {"kind": kind, "stage": stage, "microbatch": microbatch}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": report.path, "measured": "torch.distributed.pipelining, the last of "
                          f"{report.steps} steps", "time": "trace microseconds from the step's first op"}}


def write_chrome_trace(path: str | Path, simulation: Simulation) -> None:
    """Write `chrome_trace` to `path` (open it in ui.perfetto.dev or chrome://tracing)."""
    _write(path, chrome_trace(simulation))


def write_measured_trace(path: str | Path, report) -> None:
    """Write `measured_trace` to `path`."""
    _write(path, measured_trace(report))


def _write(path: str | Path, trace: dict) -> None:
    Path(path).write_text(json.dumps(trace, separators=(",", ":")) + "\n")
