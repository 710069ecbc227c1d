"""Schedules as Chrome / Perfetto traces (Trace Event Format): read back, every number is the
simulator's."""

import json
from collections import defaultdict

import pytest

from zbopt import Problem, Schedule, generate, simulate
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS
from zbopt.interfaces.cli import main
from zbopt.io.export import export_format
from zbopt.io.trace import chrome_trace, trace_scale


def zb_v():
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, weight_times=1)
    return simulate(problem, generate("zb-v", problem))


def slices(trace):
    return [event for event in trace["traceEvents"] if event["ph"] == "X"]


def assert_tracks_nest(trace):
    """On every (process, track), each slice either starts at or after the end of every slice
    still open before it, or lies within it."""
    by_track = defaultdict(list)
    for event in slices(trace):
        by_track[event["pid"], event["tid"]].append((event["ts"], -event["dur"], event["name"]))
    for track in by_track.values():
        open_ends = []
        for start, negative, name in sorted(track):
            end = start - negative
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], (name, start, end, open_ends)
            open_ends.append(end)


def test_zb_v_trace_reads_back_as_the_simulation():
    """Done-when of issue 17: every op one complete event with exact start and duration, slices on
    each track nest, the counters are the simulator's memory steps, the flows the DAG's
    cross-device edges."""
    simulation = zb_v()
    trace = json.loads(json.dumps(chrome_trace(simulation)))
    scale = trace["otherData"]["ticks_per_unit"]
    assert scale == trace_scale(simulation.problem) == 1000
    table = simulation.table
    ops = {event["name"]: event for event in slices(trace)}
    assert len(ops) == len(slices(trace)) == table.size
    for index, op in enumerate(table.ops()):
        event = ops[str(op)]
        assert (event["pid"], event["tid"]) == (table.device[index] + 1, 1)  # pid and tid 0 are Perfetto's idle task
        assert event["ts"] == simulation.start[index] * scale and event["dur"] == table.duration[index] * scale
        assert event["args"] == {"kind": op.kind, "stage": op.stage, "microbatch": op.microbatch,
                                 "chunk": simulation.problem.stages_of_device[table.device[index]].index(op.stage),
                                 "start": simulation.start[index], "end": simulation.end[index]}
    assert_tracks_nest(trace)
    counters = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "C":
            counters[event["pid"] - 1].append((event["ts"] / scale, event["args"]["held"]))
    for device, (times, levels) in enumerate(simulation.memory_steps):
        assert counters[device] == list(zip(times.tolist(), levels.tolist(), strict=True))
    flows = defaultdict(dict)
    for event in trace["traceEvents"]:
        if event["ph"] in "sf":
            flows[event["id"]][event["ph"]] = (event["pid"], event["ts"], event["bp"])
    edges = {(table.op(source), table.op(target)) for target, source in enumerate(table.predecessor)
             if source >= 0 and table.device[source] != table.device[target]}
    assert len(flows) == len(edges)
    for target_index, ends in flows.items():  # each end in the middle of its op's slice: it binds to that slice
        source_index = table.predecessor[target_index]
        assert (table.op(source_index), table.op(target_index)) in edges
        for phase, index in (("s", source_index), ("f", target_index)):
            slice_ = ops[str(table.op(index))]
            assert ends[phase] == (table.device[index] + 1, slice_["ts"] + slice_["dur"] / 2, "e")


def test_float_costs_give_whole_microseconds_and_no_overlap():
    """The 1.5B model's costs (ms, three decimals): a trace microsecond is a real one (1000 per
    ms), every start and end a whole number, and back-to-back ops touch without overlapping."""
    costs = ZERO_BUBBLE_MODELS["1.5B"]
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=costs.forward, backward_times=costs.backward,
                      weight_times=costs.weight, p2p_time=costs.comm)
    simulation = simulate(problem, generate("zb-h1", problem))
    trace = chrome_trace(simulation)
    assert trace["otherData"]["ticks_per_unit"] == 1000
    for event in slices(trace):
        assert isinstance(event["ts"], int) and isinstance(event["dur"], int)
        assert abs(event["ts"] / 1000 - (event["args"]["start"] - float(simulation.start.min()))) <= 5e-4
    assert_tracks_nest(trace)


def test_copies_and_pairs_get_their_own_tracks():
    """Offloads and reloads on the copy tracks; an overlapped pair one slice on the compute track,
    its members side by side on a track each (on one track they would nest as a call stack)."""
    offloading = Problem(num_devices=2, num_microbatches=4, weight_times=1, allow_offload=True, offload_times=0.5,
                         memory_limit=1)
    trace = chrome_trace(simulate(offloading, generate("serial-offload", offloading)))
    tracks = {event["args"]["kind"]: event["tid"] for event in slices(trace)}
    assert (tracks["O"], tracks["L"], tracks["F"]) == (2, 3, 1)
    assert_tracks_nest(trace)
    paired = Problem(num_devices=1, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1,
                     overlap_times={"FBW": 1.5})
    trace = chrome_trace(simulate(paired, Schedule([["0F0", "(0F1;0B0;0W0)", "0B1", "0W1"]])))
    by_name = {event["name"]: event for event in slices(trace)}
    assert (by_name["(0F1;0B0;0W0)"]["tid"], by_name["(0F1;0B0;0W0)"]["dur"]) == (1, 1500)
    assert [by_name[name]["tid"] for name in ("0F1", "0B0", "0W0")] == [4, 5, 6]  # side by side, not nested
    assert_tracks_nest(trace)


@pytest.mark.parametrize(("name", "expected"), [("run.trace.json", "chrome-trace"), ("RUN.TRACE.JSON", "chrome-trace"),
                                                ("run.json", "json"), ("run.csv", "torch-csv")])
def test_a_trace_is_told_by_its_double_extension(name, expected):
    assert export_format(name) == expected


def test_cli_exports_a_trace(tmp_path, capsys):
    target = tmp_path / "zbv.trace.json"
    code = main(["export", "--num-stages", "4", "--num-batches", "8", "-v", "2", "--placement", "v", "-f", "1",
                 "-bw", "1", "-w", "1", "--schedule", "zb-v", "-o", str(target)])
    assert code == 0 and "trace written to" in capsys.readouterr().out
    assert len(slices(json.loads(target.read_text()))) == zb_v().table.size
