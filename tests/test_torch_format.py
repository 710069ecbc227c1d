"""torch's compute-only CSV and Megatron-LM's order: torch's own checker and lowering accept every
export, the round trips are exact, torch's built-in orders are zbopt's generators, and every
malformed file is one message naming its cell."""

import csv
import io
import json
import shlex
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest

from tests.conftest import require_extra
from tests.reference import mechanism_schedules
from zbopt import (
    NotApplicableError,
    Problem,
    Schedule,
    ScheduleError,
    ZboptError,
    generate,
    load_schedule,
    save_schedule,
    simulate,
    solve,
)
from zbopt.core.ops import Op
from zbopt.interfaces.cli import main
from zbopt.io.torch_format import (
    check_exportable,
    megatron_json,
    megatron_order,
    torch_actions,
    torch_comms_actions,
    torch_comms_csv,
    torch_csv,
    write_torch_csv,
)
from zbopt.io.torch_order import TorchOrder, parse_torch_csv, read_torch_csv
from zbopt.schedules import TORCH_REFUSED, TORCH_SCHEDULES, generate_applicable, registered, torch_schedule
from zbopt.schedules.torch_builtin import TORCH_NEEDS

SPLIT = dict(backward_times=1, weight_times=1)
PAIRS = dict(overlap_times={"FBW": 2.5})  # the combined 1F1B schedules need them; the others do not pair
LAYOUTS = [  # p = 4, m = 8; between them every registered schedule applies to one
    dict(PAIRS),
    dict(SPLIT, p2p_time=0.25),
    dict(PAIRS, chunks_per_device=2),
    dict(SPLIT, chunks_per_device=2),
    dict(chunks_per_device=2, placement="v"),
    dict(SPLIT, chunks_per_device=2, placement="v", p2p_time=0.25),
]
PROBLEMS = [Problem(num_devices=4, num_microbatches=8, **layout) for layout in LAYOUTS]
HEURISTICS = [(problem, name, schedule) for problem in PROBLEMS
              for name, schedule in generate_applicable(problem)[0].items()]
OPTIMA = [Problem(num_devices=2, num_microbatches=4, **SPLIT),
          Problem(num_devices=3, num_microbatches=4, **SPLIT, chunks_per_device=2, placement="v", p2p_time=0.5),
          Problem(num_devices=3, num_microbatches=4)]


def case_id(case) -> str:
    problem, name, _ = case
    return f"{name}-v{problem.chunks_per_device}{problem.placement}-{'split' if problem.split_backward else 'fused'}"


@pytest.fixture(scope="module")
def pipelining():
    require_extra("torch", "checking against torch.distributed.pipelining needs torch")
    from torch.distributed.pipelining import schedules

    return schedules


@pytest.fixture(scope="module")
def optima():
    results = [solve(problem, time_limit=10) for problem in OPTIMA]
    assert [result.status for result in results] == ["optimal"] * len(OPTIMA)
    return [(problem, "cpsat", result.simulation.timed_orders())
            for problem, result in zip(OPTIMA, results, strict=True)]


def stand_in_stages(problem: Problem) -> list:
    """What torch's schedule classes read from their stages (see torch_schedule's docstring)."""
    return [SimpleNamespace(num_stages=problem.num_stages, group_size=problem.num_devices, group_rank=0, submod=None)
            for _ in range(problem.chunks_per_device)]


def crossings(problem: Problem) -> int:
    """Stage boundaries between two ranks, in closed form: every one of the S - 1 under loop
    placement; under v placement all but the v - 1 turns of the V, which stay on one rank."""
    stages, v = problem.num_stages, problem.chunks_per_device
    return stages - 1 if problem.placement == "loop" else stages - v


def test_every_registered_schedule_is_exported():
    """All but those that recompute or offload (torch has no such action) and DualPipe, which sends
    half the microbatches each way (torch runs every stage on every microbatch): their export is
    refused (test_bidirectional); likewise Chimera and BitPipe."""
    moving = mechanism_schedules()
    assert moving == {"1f1b-recompute", "interleaved-1f1b-recompute", "mario-1f1b", "serial-recompute",
                      "pipeoffload", "full-offload", "serial-offload"}
    unexported = moving | {"dualpipe", "chimera", "bitpipe", "seq1f1b"}  # both ways; sequence slices
    assert {name for _, name, _ in HEURISTICS} == {entry.name for entry in registered()} - unexported


def test_a_schedule_that_recomputes_is_not_exported_to_torch(tmp_path):
    problem = Problem(num_devices=2, num_microbatches=2, allow_recompute=True, checkpoint_memory=0.1)
    simulation = simulate(problem, generate("1f1b-recompute", problem))
    with pytest.raises(ZboptError, match=r"a torch schedule CSV has no recompute action, and the schedule "
                                         r"recomputes 4 activation\(s\) \(first 0R0\); export it as zbopt JSON"):
        write_torch_csv(tmp_path / "s.csv", problem, simulation.schedule)
    assert not (tmp_path / "s.csv").exists()
    with pytest.raises(ZboptError, match="Megatron-LM's order has no recompute action"):
        megatron_order(problem, simulation.schedule)
    save_schedule(tmp_path / "s.json", simulation.schedule, problem)
    assert simulate(*reversed(load_schedule(tmp_path / "s.json"))).makespan == simulation.makespan


# ------------------------------------------------------------------- torch accepts every export
def assert_torch_accepts(schedules, problem, schedule):
    """torch's `_validate_schedule` maps every stage to the problem's device, and `_add_send_recv`
    adds one send and one receive per microbatch for every stage boundary between ranks, forward
    and backward, keeping the compute actions in order."""
    rows = list(csv.reader(io.StringIO(torch_csv(problem, schedule), newline="")))
    actions = {rank: [schedules._Action.from_str(cell) for cell in row] for rank, row in enumerate(rows)}
    mapping = schedules._validate_schedule(actions, problem.num_devices, problem.num_stages, problem.num_microbatches)
    assert mapping == {stage: problem.device_of(stage) for stage in range(problem.num_stages)}
    lowered = schedules._add_send_recv({rank: list(row) for rank, row in actions.items()},
                                       stage_to_rank=mapping.__getitem__, num_stages=problem.num_stages)
    counts = Counter(action.computation_type.value for row in lowered.values() for action in row)
    expected = problem.num_microbatches * crossings(problem)
    assert [counts[kind] for kind in ("SEND_F", "RECV_F", "SEND_B", "RECV_B")] == [expected] * 4
    for rank, row in lowered.items():
        assert [action for action in row if action.is_compute_op] == actions[rank]


@pytest.mark.parametrize("case", HEURISTICS, ids=case_id)
def test_torch_validates_and_lowers_every_heuristic(pipelining, case):
    problem, _, schedule = case
    assert_torch_accepts(pipelining, problem, schedule)


def test_torch_validates_and_lowers_cpsat_optima(pipelining, optima):
    for problem, _, schedule in optima:
        assert_torch_accepts(pipelining, problem, schedule)


def test_torch_runtime_loads_the_file_and_dumps_it_back_byte_for_byte(pipelining, optima, tmp_path):
    for index, (problem, _, schedule) in enumerate([*optima, *HEURISTICS[::5]]):
        ours, theirs = tmp_path / f"ours{index}.csv", tmp_path / f"theirs{index}.csv"
        write_torch_csv(ours, problem, schedule)
        runtime = pipelining._PipelineScheduleRuntime(stand_in_stages(problem), problem.num_microbatches)
        runtime._load_csv(str(ours))  # validates, then lowers with sends, receives and REDUCE_GRAD
        runtime._dump_csv(str(theirs), format="compute_only")
        assert theirs.read_bytes() == ours.read_bytes()
        assert len(runtime.pipeline_order_with_comms) == problem.num_devices


# ------------------------------------------------------------------ the lowered (compute_comms) CSV
P2P = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
ENDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")


def assert_lowering_runs(schedules, problem, schedule):
    """The comms CSV of a schedule: its compute actions are the compute-only CSV's, in order; one
    send and one receive per message, each direction between two ranks received in the order sent
    (the runtime's channel matches them so, whatever their kind); torch's own comms simulator
    (`_simulate_comms_compute`, a receive waits for its send) runs it to the end; REDUCE_GRAD lands
    where torch's `_add_reduce_grad` puts it, every stage's UNSHARD first."""
    simulation = simulate(problem, schedule)
    lowered = {rank: [schedules._Action.from_str(text) for text in row]
               for rank, row in enumerate(torch_comms_actions(simulation))}
    compute = [[schedules._Action.from_str(cell) for cell in row] for row in torch_actions(problem, schedule)]
    expected = problem.num_microbatches * crossings(problem)
    counts = Counter(action.computation_type.value for row in lowered.values() for action in row)
    assert [counts[kind] for kind in P2P] == [expected] * 4
    channels: dict[tuple, list] = {}
    for rank, row in lowered.items():
        assert [action for action in row if action.is_compute_op] == compute[rank]
        kinds = [action.computation_type.value for action in row]
        assert kinds[:problem.chunks_per_device] == ["UNSHARD"] * problem.chunks_per_device
        reduced = schedules._add_reduce_grad(list(compute[rank]), problem.num_microbatches)
        assert [action for action in row if action.is_compute_op or action.computation_type.value == "REDUCE_GRAD"] \
            == reduced
        for action in row:
            kind = action.computation_type.value
            if kind in P2P:  # a message as (kind, the receiving stage, microbatch) on its channel
                sent, step = kind.startswith("SEND"), 1 if kind.endswith("F") else -1
                receiving = action.stage_index + step if sent else action.stage_index
                peer = problem.device_of(receiving if sent else action.stage_index - step)
                channel = channels.setdefault((rank, peer) if sent else (peer, rank), {True: [], False: []})
                channel[sent].append((kind[-1], receiving, action.microbatch_index))
    for key, sides in channels.items():
        assert sides[True] == sides[False], key
    p2p_only = {rank: [action for action in row if action.computation_type.value not in ENDS]
                for rank, row in lowered.items()}
    schedules._simulate_comms_compute(p2p_only, problem.device_of, problem.num_stages)


@pytest.mark.parametrize("case", [case for case in HEURISTICS if not case[2].pairs], ids=case_id)
def test_the_comms_csv_of_every_heuristic_runs_in_torchs_comms_simulator(pipelining, case):
    problem, _, schedule = case
    assert_lowering_runs(pipelining, problem, schedule)


def test_the_comms_csv_of_cpsat_optima_runs_and_torch_reads_it_back_byte_for_byte(pipelining, optima, tmp_path):
    for index, (problem, _, schedule) in enumerate(optima):
        assert_lowering_runs(pipelining, problem, schedule)
        ours, theirs = tmp_path / f"ours{index}.csv", tmp_path / f"theirs{index}.csv"
        ours.write_text(torch_comms_csv(simulate(problem, schedule)), newline="")
        runtime = pipelining._PipelineScheduleRuntime(stand_in_stages(problem), problem.num_microbatches)
        runtime._load_csv(str(ours), format="compute_comms")
        runtime._dump_csv(str(theirs), format="compute_comms")
        assert theirs.read_bytes() == ours.read_bytes()


def test_the_compute_only_csv_is_unchanged_by_the_iteration_ends():
    problem = Problem(num_devices=4, num_microbatches=8, **SPLIT)
    ended = problem.replace(grad_reduce_times=3, optimizer_step_times=1, unshard_times=0.5, unshard_memory=2)
    schedule = generate("zb-h1", problem)
    assert torch_csv(ended, schedule) == torch_csv(problem, schedule)
    assert torch_comms_csv(simulate(ended, schedule)).count("REDUCE_GRAD") == 4


# ---------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("case", HEURISTICS, ids=case_id)
def test_round_trips_are_exact(case):
    problem, name, schedule = case
    text = torch_csv(problem, schedule)
    order = parse_torch_csv(text)
    assert order.layout == {"num_devices": 4, "chunks_per_device": problem.chunks_per_device,
                            "placement": problem.placement, "num_microbatches": 8}
    back = order.to_schedule(problem, name)
    assert back.orders == schedule.orders  # zbopt -> CSV -> zbopt
    assert torch_csv(problem, back) == text  # CSV -> zbopt -> CSV


def test_export_of_a_timed_schedule_reads_back_on_a_skeleton(optima):
    problem, _, timed = optima[1]  # the solver's schedule, with its start times
    assert torch_csv(problem, timed) == torch_csv(problem, timed.without_times())
    order = parse_torch_csv(torch_csv(problem, timed))
    skeleton = order.problem(backward_times=1, weight_times=1, p2p_time=0.5)
    assert skeleton == problem
    assert order.to_schedule(skeleton).orders == timed.orders
    assert simulate(skeleton, order.to_schedule(skeleton)).makespan == pytest.approx(27.5)


def test_file_round_trip_keeps_the_bytes(tmp_path):
    problem = PROBLEMS[5]
    path = tmp_path / "zbv.csv"
    write_torch_csv(path, problem, generate("zb-v", problem))
    text = path.read_bytes()
    assert text.startswith(b"0F0,0F1,0F2,0F3,0F4,0F5,0F6,7F0,7I0,7W0,") and text.count(b"\r\n") == 4
    order = read_torch_csv(path)
    write_torch_csv(tmp_path / "again.csv", problem, order.to_schedule(problem))
    assert (tmp_path / "again.csv").read_bytes() == text


def test_a_full_backward_on_a_split_problem_is_b_then_w_and_overlap_runs_f_first():
    order = parse_torch_csv("0F0,(0F1;1B0)OVERLAP_F_B,,0I1,0W1,1B1\r\n")
    assert order.layout["chunks_per_device"] == 2 and order.split_backward
    text = "0F0,1F0,1B0,0B0,0F1,1F1,1B1,0B1\r\n"
    fused = parse_torch_csv(text).to_schedule(Problem(num_devices=1, num_microbatches=2, chunks_per_device=2))
    assert [str(op) for op in fused.orders[0]][:4] == ["0F0", "1F0", "1BW0", "0BW0"]
    split = parse_torch_csv("0F0,1F0,1B0,0I0,0W0\r\n").to_schedule(
        Problem(num_devices=1, num_microbatches=1, chunks_per_device=2, **SPLIT))
    assert [str(op) for op in split.orders[0]] == ["0F0", "1F0", "1B0", "1W0", "0B0", "0W0"]


def test_torch_dumps_of_its_built_ins_import_and_simulate(pipelining, tmp_path):
    for cls, problem, zbopt_name in [
        (pipelining.ScheduleZBVZeroBubble, PROBLEMS[5], "torch-zbv"),
        (pipelining.ScheduleDualPipeV, PROBLEMS[5], "dualpipe-v"),
        (pipelining.ScheduleInterleavedZeroBubble, PROBLEMS[3], "torch-zb-interleaved"),
        (pipelining.ScheduleInterleaved1F1B, PROBLEMS[2], "interleaved-1f1b"),
    ]:
        path = tmp_path / f"{cls.__name__}.csv"
        cls(stand_in_stages(problem), problem.num_microbatches)._dump_csv(str(path), format="compute_only")
        order = read_torch_csv(path)
        assert order.layout == {"num_devices": 4, "chunks_per_device": 2, "placement": problem.placement,
                                "num_microbatches": 8}
        costs = dict(SPLIT) if order.split_backward else {}
        imported = order.problem(**costs, p2p_time=problem.p2p_time)
        simulation = simulate(imported, order.to_schedule(imported))
        assert simulation.valid
        assert simulation.makespan == simulate(problem, generate(zbopt_name, problem)).makespan


# ---------------------------------------------------------------------------- torch's built-ins
@pytest.mark.parametrize(
    ("torch_name", "zbopt_name", "problem"),
    [
        ("GPipe", "gpipe", PROBLEMS[0]),
        ("LoopedBFS", "looped-bfs", PROBLEMS[0]),
        ("LoopedBFS", "looped-bfs", PROBLEMS[3]),
        ("Interleaved1F1B", "eager-1f1b", PROBLEMS[0]),  # one chunk: warm-up 2(p - r - 1)
        ("Interleaved1F1B", "interleaved-1f1b", PROBLEMS[2]),
        ("InterleavedZeroBubble", "zb-h1", PROBLEMS[1]),
        ("InterleavedZeroBubble", "torch-zb-interleaved", PROBLEMS[3]),
        ("ZBVZeroBubble", "torch-zbv", PROBLEMS[5]),
        ("DualPipeV", "dualpipe-v", PROBLEMS[5]),
        ("dualpipev", "dualpipe-v", PROBLEMS[5].replace(num_microbatches=12)),
    ],
)
def test_torch_built_ins_are_zbopt_generators(pipelining, torch_name, zbopt_name, problem):
    ours = generate(zbopt_name, problem)
    theirs = torch_schedule(torch_name, problem)
    assert theirs.orders == ours.orders
    assert theirs.name.lower() == f"torch:{torch_name}".lower()
    assert simulate(problem, theirs).makespan == simulate(problem, ours).makespan


@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 8), (4, 8), (4, 11)])
def test_dualpipe_v_pairs_are_torchs_overlap_f_b(pipelining, p, m):
    """With an FBW cost, zbopt's DualPipeV pairs exactly the actions torch's ScheduleDualPipeV
    writes as OVERLAP_F_B (the last rank's first F0 and B1 apart in both), read back as pairs."""
    problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, weight_times=1, overlap_times={"FBW": 2.5})
    ours, theirs = generate("dualpipe-v", problem), torch_schedule("DualPipeV", problem)
    assert theirs.orders == ours.orders and set(theirs.pairs) == set(ours.pairs) and ours.pairs
    assert simulate(problem, theirs).makespan == simulate(problem, ours).makespan


def test_torch_interleaved_zero_bubble_beats_interleaved_1f1b(pipelining):
    problem = PROBLEMS[3]  # F = B = W = 1: (m + p - 1)(F + B) + mW per chunk pass for 1F1B-like orders
    zero_bubble = simulate(problem, torch_schedule("ScheduleInterleavedZeroBubble", problem))
    assert (zero_bubble.makespan, simulate(problem, torch_schedule("Interleaved1F1B", problem)).makespan) == (51, 54)
    assert zero_bubble.valid


def test_torch_1f1b_order_is_broken_in_torch_and_said_so(pipelining):
    # torch's Schedule1F1B._get_pipeline_order numbers the last rank's forwards 1..m (no 0); its
    # step() does not use that order, but zbopt reads nothing else, so it refuses it.
    with pytest.raises(ScheduleError, match=r"Schedule1F1B builds an invalid pipeline_order: .*rank 3, step 14: "
                                            r"microbatch 8 out of range"):
        torch_schedule("1F1B", PROBLEMS[0])


SPLITS = "weight_times (its order splits the backward into I and W)"


@pytest.mark.parametrize(
    ("name", "problem", "needle"),
    [
        ("ZBVZeroBubble", PROBLEMS[3], "torch's ScheduleZBVZeroBubble needs placement 'v'"),
        ("ZBVZeroBubble", PROBLEMS[4], f"torch's ScheduleZBVZeroBubble needs {SPLITS}"),
        ("ZBVZeroBubble", PROBLEMS[1], "torch's ScheduleZBVZeroBubble needs chunks_per_device = 2 and placement 'v'"),
        ("ZBVZeroBubble", PROBLEMS[0], f"torch's ScheduleZBVZeroBubble needs chunks_per_device = 2, placement 'v' "
                                       f"and {SPLITS}"),
        ("GPipe", PROBLEMS[2], "torch's ScheduleGPipe needs chunks_per_device = 1"),
        ("GPipe", PROBLEMS[2].replace(iterations=2), "torch's ScheduleGPipe needs chunks_per_device = 1 and "
                                                     "iterations = 1"),
        ("LoopedBFS", PROBLEMS[4], "torch's ScheduleLoopedBFS needs placement 'loop'"),
        ("DualPipeV", PROBLEMS[5].replace(num_microbatches=6), "DualPipeV requires at least as many microbatches"),
    ],
)
def test_torch_built_ins_that_do_not_apply_say_why(pipelining, name, problem, needle):
    with pytest.raises(NotApplicableError) as error:
        torch_schedule(name, problem)
    assert needle in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", TORCH_SCHEDULES)
def test_torch_needs_are_what_torchs_orders_need(pipelining, name):
    """TORCH_NEEDS, which names every missing setting before torch runs, against torch's own orders:
    the placement they put a rank's stages in and whether they split the backward."""
    needs = TORCH_NEEDS[name]
    v = needs.chunks_per_device or 2
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=v, placement=needs.placement,
                      weight_times=1 if needs.split_backward else None)
    cls = pipelining.get_schedule_class(name)
    stages = stand_in_stages(problem)
    built = cls(stages[0] if issubclass(cls, pipelining.PipelineScheduleSingle) else stages, 8)
    kinds = {action.computation_type for actions in built.pipeline_order.values() for action in actions if action}
    assert (pipelining.BACKWARD_INPUT in kinds) == needs.split_backward
    if v > 1:
        cells = [[(str(action), "") for action in actions if action and action.computation_type in
                   (pipelining.FORWARD, pipelining.BACKWARD_INPUT, pipelining.BACKWARD_WEIGHT,
                    pipelining.FULL_BACKWARD)] for _, actions in sorted(built.pipeline_order.items())]
        assert TorchOrder.from_cells(cells, name).layout["placement"] == needs.placement
    if name in TORCH_REFUSED:
        with pytest.raises(ScheduleError, match="builds an invalid pipeline_order"):
            torch_schedule(name, problem)
    else:
        assert simulate(problem, torch_schedule(name, problem)).valid


@pytest.mark.parametrize(
    ("flags", "needs"),
    [
        (("--schedule", "torch:ZBVZeroBubble"),
         f"ZBVZeroBubble needs chunks_per_device = 2, placement 'v' and {SPLITS}"),
        (("--schedule", "torch:DualPipeV", "-v", 2), f"DualPipeV needs placement 'v' and {SPLITS}"),
        (("--schedule", "torch:InterleavedZeroBubble"), f"InterleavedZeroBubble needs {SPLITS}"),
        (("--schedule", "torch:InterleavedZeroBubble", "-v", 2, "--placement", "v"),
         f"InterleavedZeroBubble needs placement 'loop' and {SPLITS}"),
        (("--schedule", "torch:Interleaved1F1B", "-v", 2, "--placement", "v"),
         "Interleaved1F1B needs placement 'loop'"),
        (("--schedule", "torch:LoopedBFS", "-v", 2, "--placement", "v", "--iterations", 2),
         "LoopedBFS needs placement 'loop' and iterations = 1"),
        (("--schedule", "torch:GPipe", "-v", 2), "GPipe needs chunks_per_device = 1"),
    ],
)
def test_cli_names_every_missing_setting_of_a_torch_built_in_and_a_command_that_runs(pipelining, capsys, flags,
                                                                                      needs):
    status, out, err = run(capsys, "simulate", *flags)
    assert (status, out) == (2, "")
    message, _, command = err.removesuffix("\n").partition("; try: ")
    assert message == f"zbopt: torch's Schedule{needs}"
    argv = shlex.split(command)
    assert argv[:len(flags) + 2] == ["zbopt", "simulate", *map(str, flags)]
    assert run(capsys, *argv[1:])[0] == 0


def test_cli_help_lists_only_the_torch_built_ins_zbopt_takes(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(GPipe, LoopedBFS, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV; needs torch)" in text


def test_unknown_torch_names_and_missing_torch(monkeypatch):
    with pytest.raises(ZboptError, match=r"unknown torch schedule 'Foo' \(known: GPipe, 1F1B, LoopedBFS"):
        torch_schedule("Foo", PROBLEMS[0])
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed.pipelining", None)
    with pytest.raises(ZboptError, match=r"pip install 'zbopt\[torch\]'"):
        torch_schedule("GPipe", PROBLEMS[0])


def test_the_module_imports_without_torch():
    code = "import sys, zbopt.io.torch_format, zbopt.interfaces.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_the_torch_names_are_torchs(pipelining):
    assert all(pipelining.get_schedule_class(name).__name__ == f"Schedule{name}" for name in TORCH_SCHEDULES)


# ------------------------------------------------------------------------------- Megatron order
def megatron_reference(p: int, v: int, m: int, rank: int, group: int | None = None) -> list[int]:
    """Megatron-LM's order for `rank`, rebuilt from its published rules (megatron/core/pipeline_
    parallel/schedules.py): the schedule table lists, per group of `group` microbatches (default p),
    chunk 0's microbatches, then chunk 1's, ...; get_pp_rank_microbatches warms up p - r - 1
    microbatches without interleaving, 2(p - r - 1) + (v - 1)·group with it (at most m·v);
    convert_schedule_table_to_order writes chunk + 1 for a forward and chunk - v for the backward
    of the table's entry (the backward of chunk v - 1 - chunk), warm-up forwards first, then
    forward/backward pairs, then the remaining backwards."""
    group = group or p
    table = [chunk for start in range(0, m, group) for chunk in range(v) for _ in range(start, min(start + group, m))]
    warmup = min(p - rank - 1 if v == 1 else 2 * (p - rank - 1) + (v - 1) * group, m * v)
    forward, backward = [chunk + 1 for chunk in table], [chunk - v for chunk in table]
    order = forward[:warmup]
    for i in range(warmup, len(forward)):
        order += [forward[i], backward[i - warmup]]
    return order + backward[len(backward) - warmup:]


@pytest.mark.parametrize(("name", "layout"), [("1f1b", {}), ("interleaved-1f1b", dict(chunks_per_device=2)),
                                              ("interleaved-1f1b", dict(chunks_per_device=4))])
def test_megatron_order_is_megatrons(name, layout):
    problem = Problem(num_devices=4, num_microbatches=8, **layout)
    orders = megatron_order(problem, generate(name, problem))
    v = problem.chunks_per_device
    assert orders == [megatron_reference(4, v, 8, rank) for rank in range(4)]
    assert all(len(order) == 2 * 8 * v for order in orders)
    assert {value for order in orders for value in order} == {*range(1, v + 1), *range(-v, 0)}


def test_megatron_closed_forms():
    problem = PROBLEMS[0]
    orders = megatron_order(problem, generate("1f1b", problem))
    assert orders[0][:7] == [1, 1, 1, 1, -1, 1, -1] and orders[3][:4] == [1, -1, 1, -1]
    for order in orders:  # Megatron's own test: no prefix backs out more than it ran, all cancel out
        prefix = [sum(order[:i + 1]) for i in range(len(order))]
        assert min(prefix) >= 0 and prefix[-1] == 0


def test_megatron_refuses_v_placement():
    """Megatron maps chunk k of rank r to stage k·p + r; under V placement rank 0's second chunk is
    stage 2p - 1, so an order would run the wrong layers."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="v")
    with pytest.raises(ZboptError, match=r"chunk k of rank r at stage k·p \+ r \(loop placement\)"):
        megatron_order(problem, generate("zb-v", problem))


def test_megatron_json_has_one_line_per_rank():
    problem = PROBLEMS[2]
    schedule = generate("interleaved-1f1b", problem)
    text = megatron_json(problem, schedule)
    data = json.loads(text)
    assert data["format"] == "megatron-order" and data["order"] == megatron_order(problem, schedule)
    assert text.count("\n  [") == 4 and (data["num_devices"], data["chunks_per_device"]) == (4, 2)


@pytest.mark.parametrize(
    ("problem", "name", "needle"),
    [
        (PROBLEMS[1], "zb-h1", "Megatron-LM's order cannot hold a split backward (weight_times given): upstream "
                               "Megatron-LM has no weight-gradient step"),
        (PROBLEMS[0].replace(iterations=2), "1f1b", "Megatron-LM's order holds one training step: iterations = 2"),
        (PROBLEMS[0], "looped-bfs", "device 0 runs 0BW7 where stage 0's full backward (B) of microbatch 0 is due"),
    ],
)
def test_megatron_refusals_name_the_reason(problem, name, needle):
    with pytest.raises(ZboptError) as error:
        megatron_order(problem, generate(name, problem))
    assert needle in str(error.value)


def test_exportability_is_checked_before_any_work():
    check_exportable(PROBLEMS[1], "torch-csv")
    with pytest.raises(ZboptError, match="a torch schedule CSV holds one training step: iterations = 3 must be 1"):
        check_exportable(PROBLEMS[1].replace(iterations=3), "torch-csv")
    with pytest.raises(ZboptError, match="no weight-gradient step"):
        check_exportable(PROBLEMS[1], "megatron")


def test_megatron_refuses_a_split_backward_and_names_the_export_that_holds_it(tmp_path, capsys):
    argv = ["export", "-s", "2", "-b", "4", "-w", "1", "--schedule", "zb-h1"]
    assert main([*argv, "--format", "megatron", "-o", str(tmp_path / "order.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--format torch-csv" in err and not (tmp_path / "order.json").exists()
    # the export it names holds the weight-gradient steps: torch's I and W, 2 × 4 of each
    assert main([*argv, "--format", "torch-csv", "-o", str(tmp_path / "zbh1.csv")]) == 0
    actions = (tmp_path / "zbh1.csv").read_text().replace("\r\n", ",").split(",")
    assert sum(action[1:2] == "I" for action in actions) == sum(action[1:2] == "W" for action in actions) == 8


# -------------------------------------------------------------------------------- malformed CSV
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0,3X1\r\n",
         "run.csv row 1, column 2: unknown action '3X1' (expected stage, F/I/W/B, microbatch, e.g. '3F1')"),
        ("0F0,0F1 x\r\n", "run.csv row 1, column 2: unknown action '0F1 x'"),
        ("0F0,0SEND_F0\r\n", "run.csv row 1, column 2: '0SEND_F0' is a communication or sharding action; a "
                             "compute-only schedule holds only F, I, W, B and OVERLAP_F_B"),
        ("0F0,0REDUCE_GRAD\r\n", "run.csv row 1, column 2: '0REDUCE_GRAD' is a communication or sharding action"),
        ("0F\r\n", "run.csv row 1, column 1: action '0F' has no microbatch"),
        ("0F0,1F0\r\n1B0,0B0\r\n", "run.csv row 2, column 1: stage 1 appears on ranks 0 and 1"),
        ("0F0,0B0\r\n2F0,2B0\r\n", "run.csv: stage 1 has no actions (stages run up to 2)"),
        ("0F0,0B0\r\n\r\n", "run.csv: rank 1 has no actions; every rank needs a stage"),
        ("", "run.csv: no ranks (no rows)"),
        ("0F0,2F0\r\n1F0\r\n", "run.csv: 3 stages on 2 ranks; zbopt needs the same number of stages on every rank"),
        ("0F0,1F0\r\n2F0,3F0\r\n", "run.csv: the stages fit neither placement: loop placement puts stage 1 on rank "
                                   "1, not 0; v placement puts stage 1 on rank 1, not 0"),
    ],
)
def test_malformed_csv_names_the_cell(text, message):
    with pytest.raises(ScheduleError) as error:
        parse_torch_csv(text, "run.csv")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


PAIR = Problem(num_devices=2, num_microbatches=2)  # 1F1B on it: 0F0,0F1,0B0,0B1 / 1F0,1B0,1F1,1B1


@pytest.mark.parametrize(
    ("text", "problem", "message"),
    [
        ("0F0,0F1,0B1\r\n1F0,1B0,1F1,1B1\r\n", PAIR, "run.csv: stage 0 misses the full backward (B) of microbatch 0"),
        ("0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1\r\n", PAIR, "run.csv: stage 1 misses the full backward (B) of microbatch 1"),
        ("0F0,0F1,0F0,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n", PAIR,
         "run.csv row 1, column 3: '0F0' repeats the forward (F) of stage 0, microbatch 0 (already at run.csv row 1, "
         "column 1: '0F0')"),
        ("0F0,0F1,0I0,0B0,0W0,0B1\r\n1F0,1B0,1F1,1B1\r\n", PAIR.replace(**SPLIT),
         "run.csv row 1, column 4: '0B0' repeats the input-gradient backward (I) of stage 0, microbatch 0"),
        ("0F0,0F1,0I0,0W0,0B1\r\n1F0,1B0,1F1,1B1\r\n", PAIR,
         "run.csv row 1, column 3: '0I0' is a split backward step, but the problem's backward is fused"),
        ("0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n", Problem(num_devices=4, num_microbatches=2),
         "run.csv has 2 ranks (rows), the problem 4 devices"),
        ("0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n", PAIR.replace(num_microbatches=1),
         "run.csv row 1, column 2: microbatch 1 out of range (the problem has 1)"),
        ("0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n", PAIR.replace(iterations=2), "run.csv holds one training step"),
        ("0F0,0F1,0B0,0B1,2F0,2F1,2B0,2B1\r\n1F0,1B0,1F1,1B1,3F0,3B0,3F1,3B1\r\n",
         Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, placement="v"),
         "run.csv row 1, column 5: stage 2 is on rank 0, but the problem (v placement, 2 chunks per device) puts it "
         "on device 1"),
    ],
)
def test_csv_checked_against_a_problem_names_the_culprit(text, problem, message):
    with pytest.raises(ZboptError) as error:
        parse_torch_csv(text, "run.csv").to_schedule(problem)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_skeleton_refuses_layout_keys_and_a_split_without_weight_times():
    order = parse_torch_csv("0F0,0I0,0W0\r\n", "run.csv")
    with pytest.raises(ZboptError, match=r"run.csv splits the backward \(I, W\): give weight_times"):
        order.problem()
    with pytest.raises(ZboptError, match=r"num_microbatches comes from run.csv \(1\); do not give it"):
        order.problem(num_microbatches=2, weight_times=1)


def test_missing_file():
    with pytest.raises(ZboptError, match=r"schedule file 'nowhere\.csv' not found"):
        read_torch_csv("nowhere.csv")


# ------------------------------------------------------------------------------------------ CLI
def run(capsys, *argv):
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


ZB_FLAGS = ("-s", 4, "-b", 8, "-w", 1, "-bw", 1)


def test_cli_export_writes_what_the_functions_write(tmp_path, capsys):
    problem = Problem(num_devices=4, num_microbatches=8, **SPLIT)
    status, out, err = run(capsys, "export", *ZB_FLAGS, "--schedule", "zb-h2", "-o", tmp_path / "zb.csv")
    assert (status, err) == (0, "") and out == f"torch CSV written to {tmp_path / 'zb.csv'}\n"
    assert (tmp_path / "zb.csv").read_bytes() == torch_csv(problem, generate("zb-h2", problem)).encode()

    status, _, _ = run(capsys, "export", "-s", 4, "-b", 8, "-v", 2, "--schedule", "interleaved-1f1b",
                       "--option", "microbatch_group_size_per_vp_stage=8", "--format", "megatron", "-o",
                       tmp_path / "m.json")
    fused = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2)
    schedule = generate("interleaved-1f1b", fused, microbatch_group_size_per_vp_stage=8)
    assert status == 0 and (tmp_path / "m.json").read_text() == megatron_json(fused, schedule)
    assert json.loads((tmp_path / "m.json").read_text())["order"][1] == megatron_reference(4, 2, 8, 1, group=8)

    status, _, _ = run(capsys, "export", *ZB_FLAGS, "--schedule", "zb-h1", "-o", tmp_path / "zb.json")
    assert status == 0 and load_schedule(tmp_path / "zb.json") == (generate("zb-h1", problem), problem)


def test_cli_converts_files_between_formats(tmp_path, capsys):
    run(capsys, "export", "-s", 4, "-b", 8, "--schedule", "1f1b", "-o", tmp_path / "a.json")
    status, _, _ = run(capsys, "export", "--schedule-file", tmp_path / "a.json", "-o", tmp_path / "a.csv")
    assert status == 0
    status, _, _ = run(capsys, "export", "--schedule-file", tmp_path / "a.csv", "--format", "megatron",
                       "-o", tmp_path / "a.megatron.json")
    assert status == 0 and json.loads((tmp_path / "a.megatron.json").read_text())["order"][0][:5] == [1, 1, 1, 1, -1]
    # the spelling: the schedule file in the config's place
    status, _, _ = run(capsys, "export", tmp_path / "a.json", "--format", "torch-csv", "-o", tmp_path / "b.csv")
    assert status == 0 and (tmp_path / "b.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()
    status, out, _ = run(capsys, "simulate", tmp_path / "b.csv", "--json")
    default = Problem(num_devices=4, num_microbatches=8)
    assert status == 0 and json.loads(out)["makespan"] == simulate(default, generate("1f1b", default)).makespan


def test_cli_simulates_a_csv_with_its_layout_and_the_given_costs(tmp_path, capsys):
    problem = PROBLEMS[5]
    write_torch_csv(tmp_path / "zbv.csv", problem, generate("zb-v", problem))
    status, out, err = run(capsys, "simulate", "--schedule-file", tmp_path / "zbv.csv", "-w", 1, "-bw", 1,
                           "--p2p-time", 0.25, "--json")
    result = json.loads(out)
    assert (status, err) == (0, "") and result["schedule"] == "zbv.csv"
    assert (result["num_devices"], result["chunks_per_device"], result["placement"]) == (4, 2, "v")
    assert result["makespan"] == simulate(problem, generate("zb-v", problem)).makespan


def test_cli_takes_a_csv_in_the_configs_place_with_costs_from_a_config(tmp_path, capsys):
    problem = PROBLEMS[5]
    write_torch_csv(tmp_path / "zbv.csv", problem, generate("zb-v", problem))
    (tmp_path / "costs.yaml").write_text("weight_times: 1\nbackward_times: 1\np2p_time: 0.25\n")
    status, out, err = run(capsys, "simulate", tmp_path / "zbv.csv", "-c", tmp_path / "costs.yaml", "--json")
    assert (status, err) == (0, "")
    assert json.loads(out)["makespan"] == simulate(problem, generate("zb-v", problem)).makespan


def test_cli_simulates_torch_built_ins_by_name(pipelining, capsys):
    status, out, _ = run(capsys, "simulate", "-s", 4, "-b", 8, "-v", 2, "--placement", "v", "-w", 1, "-bw", 1,
                         "--schedule", "torch:ZBVZeroBubble", "--json")
    assert status == 0 and json.loads(out)["schedule"] == "torch:ZBVZeroBubble" and json.loads(out)["makespan"] == 51


def test_cli_solve_exports_its_schedule(tmp_path, capsys):
    status, _, _ = run(capsys, "solve", "-s", 2, "-b", 3, "-w", 1, "-bw", 1, "--time-limit", 10, "--quiet",
                       "--export", tmp_path / "best.csv")
    order = read_torch_csv(tmp_path / "best.csv")
    problem = order.problem(**SPLIT)
    # the optimum: the last device waits for one F, then works m(F + B + W) = 9 without a gap
    assert status == 0 and simulate(problem, order.to_schedule(problem)).makespan == 10
    status, _, _ = run(capsys, "solve", "-s", 2, "-b", 3, "--time-limit", 10, "--quiet", "--export",
                       tmp_path / "best.json")
    schedule, stored = load_schedule(tmp_path / "best.json")
    assert status == 0 and stored == Problem(num_devices=2, num_microbatches=3)
    assert simulate(stored, schedule).makespan == 12  # (m + p - 1)(F + BW) = 4 · 3


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("export", "-s", 2, "-b", 2), "export needs -o FILE"),
        (("export", "-s", 2, "-b", 2, "-o", "x.txt"), "from '.txt' (.trace.json a trace, .csv torch CSV, .json zbopt "
                                                     "JSON; or give --format)"),
        (("export", "-s", 2, "-b", 2, "--iterations", 2, "-o", "x.csv"), "iterations = 2 must be 1"),
        (("export", "-s", 2, "-b", 2, "-w", 1, "--format", "megatron", "-o", "x.json"), "no weight-gradient step"),
        (("export", "--schedule", "1f1b", "--schedule-file", "a.csv", "-o", "x.csv"),
         "--schedule-file: give it without --schedule and --option"),
        (("export", "--schedule", "torch:Foo", "-o", "x.csv"), "unknown torch schedule 'Foo'"),
        (("export", "--schedule", "torch:GPipe", "--option", "a=1", "-o", "x.csv"),
         "torch's schedules take no options ('torch:GPipe' given a)"),
        (("simulate", "--schedule-file", "bad.csv"), "bad.csv row 2, column 3: unknown action '1Q1'"),
        (("simulate", "--schedule-file", "nowhere.csv"), "schedule file 'nowhere.csv' not found"),
        (("solve", "-s", 2, "-b", 2, "--iterations", 2, "--export", "x.csv"), "iterations = 2 must be 1"),
        (("solve", "-s", 2, "-b", 2, "--export", "x.png"), "from '.png' (.trace.json a trace, .csv torch CSV, .json "
                                                            "zbopt JSON)\n"),  # solve has no --format to offer
    ],
)
def test_cli_export_errors_are_one_line(tmp_path, monkeypatch, capsys, argv, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.csv").write_text("0F0,0F1\n1F0,1F1,1Q1\n")
    status, out, err = run(capsys, *argv)
    assert (status, out) == (2, "") and len(err.strip().splitlines()) == 1 and needle in err
    assert not list(tmp_path.glob("x.*"))


def test_cli_layout_given_must_agree_with_the_csv(tmp_path, capsys):
    problem = PROBLEMS[0]
    write_torch_csv(tmp_path / "g.csv", problem, generate("gpipe", problem))
    status, _, err = run(capsys, "simulate", "--schedule-file", tmp_path / "g.csv", "-s", 2)
    assert status == 2 and "g.csv has 4 ranks (rows), the problem 2 devices" in err


def test_cli_a_stored_problem_fills_what_flags_leave_out(tmp_path, capsys):
    """A flag changes its own key only: the stored per-stage costs and limit stay."""
    stored = Problem(num_devices=2, num_microbatches=3, forward_times=[1, 3], backward_times=[2, 4], memory_limit=5)
    save_schedule(tmp_path / "s.json", generate("1f1b", stored), stored)
    status, out, _ = run(capsys, "simulate", tmp_path / "s.json", "--p2p-time", 0.1, "--json")
    expected = simulate(stored.replace(p2p_time=0.1), generate("1f1b", stored))
    assert status == 0 and json.loads(out)["makespan"] == pytest.approx(expected.makespan)
    assert json.loads(out)["memory_limit"] == [5, 5]


def test_cli_export_says_when_the_schedule_breaks_the_memory_limit(tmp_path, capsys):
    status, _, err = run(capsys, "export", "-s", 4, "-b", 8, "--schedule", "gpipe", "--memory-limit", 2,
                         "-o", tmp_path / "g.csv")
    assert status == 1 and (tmp_path / "g.csv").exists()
    assert err.startswith("zbopt: invalid schedule: device 0") and err.count("\n") >= 1


def test_cli_checks_output_directories_before_any_work(tmp_path, capsys):
    for argv in (("solve", "-s", 2, "-b", 2, "--export", tmp_path / "no" / "x.csv"),
                 ("export", "--schedule", "1f1b", "-o", tmp_path / "no" / "x.csv"),
                 ("profile-torch", tmp_path / "missing.csv", "-o", tmp_path / "no" / "x.yaml")):
        status, out, err = run(capsys, *argv)
        assert (status, out) == (2, "") and err == f"zbopt: {argv[-2]} '{argv[-1]}': no such directory\n"


def test_a_regather_is_lowered_to_a_reshard_after_the_last_forward_and_an_unshard_at_the_g(pipelining, tmp_path):
    """Two chunks per device, each chunk 0 gathered again (G) after chunk 1's backwards: on each
    rank RESHARD of chunk 0 right after its last forward, UNSHARD where its G starts, before its
    first backward; the compute actions are the same schedule's without the G's; torch reads the
    CSV back byte for byte. The compute-only CSV refuses the G, naming it."""
    problem = Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1, unshard_times=1, unshard_memory=2, allow_reshard=True)
    orders = ["0F0 0F1 2F0 2F1 2B0 2W0 2B1 2W1 0G0 0B0 0W0 0B1 0W1",
              "1F0 1F1 3F0 3F1 3B0 3W0 3B1 3W1 1G0 1B0 1W0 1B1 1W1"]
    schedule = Schedule([[Op.from_str(text) for text in order.split()] for order in orders])
    without = Schedule([[op for op in order if op.kind != "G"] for order in schedule.orders])
    rows = torch_comms_actions(simulate(problem, schedule))
    for rank, row in enumerate(rows):
        chunk = str(rank)  # chunk 0 of rank d is stage d
        between = row[row.index(f"{chunk}F1") + 1:row.index(f"{chunk}RESHARD")]
        assert all("SEND" in cell for cell in between)  # right after its last forward (and the send of its output)
        assert row.index(f"{chunk}UNSHARD", 2) < row.index(f"{chunk}I0")
        assert [cell for cell in row if cell[-1].isdigit() and "SEND" not in cell and "RECV" not in cell] == \
            torch_actions(problem, without)[rank]
    with pytest.raises(ZboptError, match=r"has no re-gather, .* \(first 0G0\)"):
        torch_csv(problem, schedule)
    ours, theirs = tmp_path / "ours.csv", tmp_path / "theirs.csv"
    ours.write_text(torch_comms_csv(simulate(problem, schedule)), newline="")
    runtime = pipelining._PipelineScheduleRuntime(stand_in_stages(problem), problem.num_microbatches)
    runtime._load_csv(str(ours), format="compute_comms")
    runtime._dump_csv(str(theirs), format="compute_comms")
    assert theirs.read_bytes() == ours.read_bytes()
