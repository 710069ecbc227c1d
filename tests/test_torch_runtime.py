"""Schedules run for real in torch.distributed.pipelining (CPU ranks, gloo): zbopt's and torch's own
schedules give the single-process gradients, the check can fail, profiles load as zbopt configs,
and a broken CSV fails fast with one line. Run alone: pytest tests/test_torch_runtime.py (or -m torch).
"""

import dataclasses
import multiprocessing
import os
import re
from itertools import pairwise
from types import SimpleNamespace

import pytest

from tests.conftest import require_extra

torch = require_extra("torch", "needs the optional extra zbopt[torch]")

from torch.distributed.pipelining.schedules import (  # noqa: E402
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
    _Action,
    _add_send_recv,
)

from tests.reference import mechanism_schedules  # noqa: E402
from zbopt import (  # noqa: E402
    Problem,
    generate,
    load_problem,
    solve,
)
from zbopt.core.errors import DeadlockError, ScheduleError, ZboptError  # noqa: E402
from zbopt.core.placement import stage_device  # noqa: E402
from zbopt.interfaces.cli import main  # noqa: E402
from zbopt.interfaces.runtime import (  # noqa: E402
    ATOL,
    ToyModel,
    check,
    compare_gradients,
    format_report,
    profile_config,
    profile_torch,
    run_torch,
    save_profile,
)
from zbopt.io.torch_format import write_torch_csv  # noqa: E402
from zbopt.io.torch_order import read_torch_csv  # noqa: E402
from zbopt.io.trace import measured_trace  # noqa: E402
from zbopt.schedules import generate_applicable, registered  # noqa: E402

pytestmark = pytest.mark.torch

# A small model keeps every run well under a second once the fork server is up.
SMALL = {"steps": 2, "microbatch_size": 2, "hidden": 16, "layers_per_stage": 2}
# Per stage, autograd saves the stage input and each Tanh output (the next Linear's input is the
# same tensor): layers + 1 float32 tensors of microbatch_size x hidden.
ACTIVATION_BYTES = (SMALL["layers_per_stage"] + 1) * SMALL["microbatch_size"] * SMALL["hidden"] * 4


def zbopt_csv(path, name, **problem):
    """zbopt's generator `name` written as a torch compute-only CSV."""
    problem = Problem(**problem)
    write_torch_csv(path, problem, generate(name, problem))
    return path


def torch_csv(path, schedule_class, num_ranks, stages_per_rank, num_microbatches):
    """torch's own schedule class, dumped with its `_dump_csv` (stand-in stages: only the order is built)."""
    stages = [
        SimpleNamespace(num_stages=num_ranks * stages_per_rank, group_size=num_ranks, group_rank=0,
                        stage_index=index, submod=None)
        for index in range(stages_per_rank)
    ]
    schedule = schedule_class(stages, n_microbatches=num_microbatches, loss_fn=torch.nn.functional.mse_loss)
    schedule._dump_csv(str(path), format="compute_only")
    return path


def written(path, text):
    path.write_text(text)
    return path


SCHEDULES = {
    "1f1b-p2": lambda d: zbopt_csv(d / "a.csv", "1f1b", num_devices=2, num_microbatches=4),
    "1f1b-p4": lambda d: zbopt_csv(d / "a.csv", "1f1b", num_devices=4, num_microbatches=8),
    "zb-h1-p2": lambda d: zbopt_csv(d / "a.csv", "zb-h1", num_devices=2, num_microbatches=4, weight_times=1),
    "zb-h1-p4": lambda d: zbopt_csv(d / "a.csv", "zb-h1", num_devices=4, num_microbatches=8, weight_times=1),
    "interleaved-p2v2": lambda d: zbopt_csv(d / "a.csv", "interleaved-1f1b", num_devices=2, num_microbatches=4,
                                            chunks_per_device=2),
    "zb-v-p2": lambda d: zbopt_csv(d / "a.csv", "zb-v", num_devices=2, num_microbatches=4, chunks_per_device=2,
                                   placement="v", weight_times=1),
    "torch-zbv-p4": lambda d: torch_csv(d / "a.csv", ScheduleZBVZeroBubble, 4, 2, 8),
    "torch-interleaved-zb-p2": lambda d: torch_csv(d / "a.csv", ScheduleInterleavedZeroBubble, 2, 2, 4),
    # torch runs an OVERLAP_F_B cell's sub-actions one after the other
    "overlap-p2": lambda d: written(d / "a.csv", "0F0,0F1,(0B0;0F2)OVERLAP_F_B,(0B1;0F3)OVERLAP_F_B,0B2,0B3\n"
                                                 "1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"),
}
# name -> (ranks, stages, microbatches, placement, kinds every stage runs)
EXPECTED = {
    "1f1b-p2": (2, 2, 4, "loop", {"F", "B"}),
    "1f1b-p4": (4, 4, 8, "loop", {"F", "B"}),
    "zb-h1-p2": (2, 2, 4, "loop", {"F", "I", "W"}),
    "zb-h1-p4": (4, 4, 8, "loop", {"F", "I", "W"}),
    "interleaved-p2v2": (2, 4, 4, "loop", {"F", "B"}),
    "zb-v-p2": (2, 4, 4, "v", {"F", "I", "W"}),
    "torch-zbv-p4": (4, 8, 8, "v", {"F", "I", "W"}),
    "torch-interleaved-zb-p2": (2, 4, 4, "loop", {"F", "I", "W"}),
    "overlap-p2": (2, 2, 4, "loop", {"F", "B"}),
}


# The check: every registered schedule that fits p=4, m=8 (v=2 where it needs it), and
# CP-SAT optima of small problems, run for real with gradients equal to the reference.
REGISTRY_PROBLEMS = [Problem(num_devices=4, num_microbatches=8, **layout) for layout in (
    {"overlap_times": {"FBW": 2.5}}, {"weight_times": 1}, {"chunks_per_device": 2, "overlap_times": {"FBW": 2.5}},
    {"chunks_per_device": 2, "weight_times": 1},
    {"chunks_per_device": 2, "placement": "v", "weight_times": 1})]
OPTIMA_PROBLEMS = [Problem(num_devices=3, num_microbatches=4, weight_times=1, memory_limit=2),
                   Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="v", weight_times=1,
                           p2p_time=0.5)]


def test_every_registered_schedule_and_cpsat_optima_run_with_the_reference_gradients(tmp_path):
    cases = [(problem, name, schedule) for problem in REGISTRY_PROBLEMS
             for name, schedule in generate_applicable(problem)[0].items()]
    for problem in OPTIMA_PROBLEMS:
        result = solve(problem, time_limit=10)
        assert result.status == "optimal"
        cases.append((problem, "cpsat", result.simulation.timed_orders()))
    # torch has no recompute or offload action
    # both ways; slices (torch has none)
    exportable = {entry.name for entry in registered()} - mechanism_schedules() - {"dualpipe", "chimera", "bitpipe",
                                                                                    "seq1f1b"}
    assert {name for _, name, _ in cases} == exportable | {"cpsat"}
    reports = {}  # a file torch already ran (many schedules give the same orders): its report
    for index, (problem, name, schedule) in enumerate(cases):
        path = tmp_path / f"{index}-{name}.csv"
        write_torch_csv(path, problem, schedule)
        key = (problem.num_devices, problem.num_stages, problem.num_microbatches, problem.placement, path.read_text())
        report = reports[key] = reports.get(key) or run_torch(path, **SMALL)
        assert report.passed and report.max_abs_diff <= ATOL, (name, problem.describe())
        assert (report.num_ranks, report.num_stages, report.num_microbatches, report.placement) == (
            problem.num_devices, problem.num_stages, problem.num_microbatches, problem.placement), name


def test_overlapped_pairs_run_with_the_reference_gradients(tmp_path):
    """DualPipeV and CP-SAT's optimum with FBW pairs, written as torch's OVERLAP_F_B (torch runs
    a pair's sub-actions one after the other: the gradients are the reference's either way)."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, weight_times=1, overlap_times={"FBW": 2.2})
    optimum = solve(problem, time_limit=10, lower_peak=False)
    for name, schedule in (("dualpipe-v", generate("dualpipe-v", problem)), ("cpsat", optimum.simulation.schedule)):
        assert schedule.pairs, name
        path = tmp_path / f"{name}.csv"
        write_torch_csv(path, problem, schedule)
        assert "OVERLAP_F_B" in path.read_text()
        report = run_torch(path, **SMALL)
        assert report.passed and report.max_abs_diff <= ATOL, name


def test_two_replicas_on_zbopts_lowering_reproduce_the_single_process_gradients(tmp_path, capsys):
    """Issue 44 item 4: torch-zb-interleaved (split backward, two chunks, messages both ways between
    the ranks) lowered by zbopt (its compute_comms CSV: sends, receives, REDUCE_GRAD), run by two
    replicas of the pipeline over gloo with their stages replicated: every replica's gradient is
    the single-process one over both replicas' batches. Without the reduction a replica's gradient
    would be its own share's, which the gradient check tells apart (test_the_gradient_check_can_fail)."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, weight_times=1)
    path = tmp_path / "zb.csv"
    write_torch_csv(path, problem, generate("torch-zb-interleaved", problem))
    report = run_torch(path, **SMALL, data_parallel=2, lowering="zbopt")
    per_replica = problem.num_stages * SMALL["layers_per_stage"] * 2  # a weight and a bias per Linear
    assert len(report.parameters) == 2 * per_replica
    assert report.passed and report.max_abs_diff <= ATOL
    assert not any(check.passed for check in compare_gradients(report.gradients, _first_share_only(report)))
    assert main(["run-torch", str(path), "--data-parallel", "2", "--model", "m:f"]) == 2
    assert "--data-parallel and --lowering run the toy model" in capsys.readouterr().err


def _first_share_only(report) -> list[dict]:
    """Per step, the gradients the first replica would have without the reduction: the mean loss
    of its own microbatches alone (as `ToyModel.reference_gradients` computes over all of them)."""
    import torch

    from zbopt.interfaces.runtime.model import named_gradients

    model = report.model
    modules = model.stage_modules()
    whole = torch.nn.Sequential(*modules)
    inputs, targets = model.batches(report.steps)
    gradients = []
    for step in range(report.steps):
        whole.zero_grad(set_to_none=True)
        share, target = inputs[step][0].tensor_split(2)[0], targets[step].tensor_split(2)[0]
        losses = [torch.nn.functional.mse_loss(whole(x), y) for x, y in
                  zip(share.tensor_split(model.num_microbatches), target.tensor_split(model.num_microbatches),
                      strict=True)]
        (sum(losses) / len(losses)).backward()
        gradients.append(named_gradients(modules, range(model.num_stages)))
    return gradients


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """One real run per schedule, shared by the tests below."""
    runs = {}
    for name, write in SCHEDULES.items():
        directory = tmp_path_factory.mktemp(name)
        runs[name] = run_torch(write(directory), **SMALL)
    return runs


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_gradients_match_the_single_process_reference(reports, name):
    report = reports[name]
    ranks, stages, microbatches, placement, kinds = EXPECTED[name]
    assert (report.num_ranks, report.num_stages, report.num_microbatches, report.placement) == (
        ranks, stages, microbatches, placement)
    assert report.passed, format_report(report)
    assert report.max_abs_diff < ATOL
    assert len(report.parameters) == stages * SMALL["layers_per_stage"] * 2  # weight and bias per Linear
    for stage in report.stages:
        assert set(stage.times) == kinds
        # one timed step: every op of the stage ran once per microbatch
        assert all(time.count == microbatches and time.median_s > 0 for time in stage.times.values())
        assert stage.activation_bytes == ACTIVATION_BYTES
    # the ranks hold the stages where zbopt's placement puts them (V: rank 0 holds 0 and 2p-1)
    assert [stage.rank for stage in report.stages] == [stage_device(s, ranks, placement) for s in range(stages)]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_measured_trace_runs_each_rank_in_its_csv_order(reports, name):
    """run-torch --trace: the last step's actions, each rank's in the CSV's order (an OVERLAP_F_B's
    sub-actions in turn), one after another on its track, on one clock (every start >= 0, the
    first at 0)."""
    report = reports[name]
    trace = measured_trace(report)
    order = read_torch_csv(report.path)
    starts = [event["ts"] for event in trace["traceEvents"] if event["ph"] == "X"]
    assert min(starts) == 0
    for rank, actions in enumerate(order.actions):
        ran = sorted((event["ts"], event["dur"], event["name"]) for event in trace["traceEvents"]
                     if event["ph"] == "X" and event["pid"] == rank + 1)  # pid 0 is Perfetto's idle task
        assert [text for *_, text in ran] == [str(action) for action in actions]
        assert all(start + duration <= following for (start, duration, _), (following, _, _) in pairwise(ran))


def test_the_gradient_check_can_fail(reports):
    """Negative controls: a reference with other weights and data, or one that sums the microbatch
    losses instead of averaging them as torch's schedule does, must not match."""
    report = reports["1f1b-p2"]
    other_seed = dataclasses.replace(report.model, seed=1).reference_gradients(report.steps)
    checks = compare_gradients(report.gradients, other_seed)
    assert not any(check.passed for check in checks)
    assert min(check.max_abs_diff for check in checks) > 100 * ATOL
    m = report.num_microbatches
    reference = report.model.reference_gradients(report.steps)
    summed = [{name: m * gradient for name, gradient in step.items()} for step in reference]
    assert not any(check.passed for check in compare_gradients(report.gradients, summed))


def test_profile_loads_as_a_zbopt_config(reports, tmp_path):
    for name, split in (("zb-h1-p4", True), ("1f1b-p2", False), ("zb-v-p2", True)):
        report = reports[name]
        path = tmp_path / f"{name}.yaml"
        save_profile(profile_config(report), path, report)
        problem = load_problem(path)
        ranks, stages, microbatches, placement, _ = EXPECTED[name]
        assert (problem.num_devices, problem.num_stages, problem.num_microbatches, problem.placement) == (
            ranks, stages, microbatches, placement)
        assert problem.split_backward == split
        times = problem.forward_times + problem.backward_times + (problem.weight_times or ())
        assert len(times) == stages * (3 if split else 2) and all(t > 0 for t in times)
        assert problem.p2p_time > 0  # measured between ranks 0 and 1
        assert problem.activation_memory == pytest.approx((ACTIVATION_BYTES / 2**20,) * stages, rel=1e-3)


def test_profile_torch_writes_the_config(tmp_path):
    csv_path = zbopt_csv(tmp_path / "one.csv", "1f1b", num_devices=1, num_microbatches=2)
    report, config = profile_torch(csv_path, tmp_path / "one.json", **SMALL)
    assert report.passed and report.p2p_time_s is None
    assert config["p2p_time"] == 0.0  # one rank: nothing to send
    assert load_problem(tmp_path / "one.json").forward_times == tuple(config["forward_times"])


@pytest.fixture
def doubled_reference(monkeypatch):
    """A reference twice the true gradients: every gradient check fails."""
    true_reference = ToyModel.reference_gradients

    def doubled(model, steps):
        return [{name: 2 * gradient for name, gradient in step.items()} for step in true_reference(model, steps)]

    monkeypatch.setattr(ToyModel, "reference_gradients", doubled)


def test_profile_torch_does_not_profile_a_wrong_run(tmp_path, doubled_reference):
    csv_path = zbopt_csv(tmp_path / "one.csv", "1f1b", num_devices=1, num_microbatches=2)
    report, config = profile_torch(csv_path, tmp_path / "one.yaml", **SMALL)
    assert (report.passed, config) == (False, None)
    assert not any(check.passed for check in report.parameters)
    assert not (tmp_path / "one.yaml").exists()


SMALL_FLAGS = ["--steps", "2", "--microbatch-size", "2", "--hidden", "16", "--layers-per-stage", "2"]


def test_cli_profile_torch_writes_the_library_profile(tmp_path, capsys):
    csv_path = zbopt_csv(tmp_path / "one.csv", "1f1b", num_devices=1, num_microbatches=2)
    output = tmp_path / "one.yaml"
    assert main(["profile-torch", str(csv_path), "-o", str(output), *SMALL_FLAGS]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.endswith(f"config written to {output} (try: zbopt solve {output})\n")
    assert "gradients match the single-process reference" in out
    assert load_problem(output).num_microbatches == 2


def test_cli_profile_torch_exits_1_without_writing_a_wrong_run(tmp_path, capsys, doubled_reference):
    csv_path = zbopt_csv(tmp_path / "one.csv", "1f1b", num_devices=1, num_microbatches=2)
    output = tmp_path / "one.yaml"
    assert main(["profile-torch", str(csv_path), "-o", str(output), *SMALL_FLAGS]) == 1
    out, err = capsys.readouterr()
    assert "gradients DIFFER FROM the single-process reference" in out and "config written" not in out
    assert re.fullmatch(rf"zbopt: {re.escape(str(csv_path))}: gradients differ from the single-process reference "
                        r"\(max abs diff [0-9.e-]+\)\n", err)
    assert not output.exists()


def test_a_placement_zbopt_cannot_represent_is_refused_when_read(tmp_path):
    """torch would run these (a rank holds whatever stages its row names), but zbopt's Problem, and
    so the checks and the profile, knows only loop and V placement with as many stages per rank."""
    path = written(tmp_path / "three.csv", "0F0,0F1,2F0,2F1,2B0,2B1,0B0,0B1\n1F0,1F1,1B0,1B1\n")
    with pytest.raises(ScheduleError, match=r"^three.csv: 3 stages on 2 ranks; zbopt needs the same number of "
                                            r"stages on every rank$"):
        run_torch(path, **SMALL)
    path = written(tmp_path / "blocks.csv", "0F0,1F0,1B0,0B0\n2F0,3F0,3B0,2B0\n")
    with pytest.raises(ScheduleError, match=r"^blocks.csv: the stages fit neither placement: loop placement puts "
                                            r"stage 1 on rank 1, not 0; v placement puts stage 1 on rank 1, not 0$"):
        run_torch(path, **SMALL)
    assert not multiprocessing.active_children()


def test_a_deadlock_is_named_before_any_rank_starts(tmp_path):
    """Rank 0 waits for the backward of microbatch 0 before sending microbatch 1's forward, which
    rank 1 needs before that backward. torch's own lowering agrees it cannot be ordered."""
    path = tmp_path / "dead.csv"
    path.write_text("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n")
    with pytest.raises(DeadlockError, match=r"^dead.csv: deadlock: device 0 is stuck at 0BW0, waiting for 1BW0 "
                                            r"\(device 1\); device 1 is stuck at 1F1, waiting for 0F1 \(device 0\) "
                                            r"\(zbopt's op names: BW is torch's B\)$"):
        run_torch(path, **SMALL)
    actions = {rank: [_Action.from_str(cell) for cell in row.split(",")]
               for rank, row in enumerate(path.read_text().split())}
    with pytest.raises(AssertionError, match="Malformed compute schedule"):
        _add_send_recv(actions, stage_to_rank=lambda stage: stage, num_stages=2)
    assert not multiprocessing.active_children()


def test_a_split_deadlock_names_the_ops_in_both_vocabularies(tmp_path):
    path = written(tmp_path / "dead.csv", "0F0,0I0,0F1,0I1,0W0,0W1\n1F0,1F1,1I0,1I1,1W0,1W1\n")
    with pytest.raises(DeadlockError, match=r"^dead.csv: deadlock: device 0 is stuck at 0B0, waiting for 1B0 "
                                            r"\(device 1\); .* \(zbopt's op names: B is torch's I\)$"):
        run_torch(path, **SMALL)


@pytest.mark.parametrize(("text", "error", "message"), [
    ("0F0,0X1\n", ScheduleError, r"^bad.csv row 1, column 2: unknown action '0X1' \(expected stage, F/I/W/B, "
                                 r"microbatch, e.g. '3F1'\)$"),
    ("0F0,0F1x,0B0,0B1\n", ScheduleError, r"^bad.csv row 1, column 2: unknown action '0F1x'"),
    ("0F,0B0\n", ScheduleError, r"^bad.csv row 1, column 1: action '0F' has no microbatch$"),
    ("0F0,0F1,0B0,0B1,0SEND_F1\n", ScheduleError, r"^bad.csv row 1, column 5: '0SEND_F1' is a communication or "
                                                  r"sharding action; a compute-only schedule holds only F, I, W, B"),
    ("0F0,0F1,0B0,0B1\n,,\n", ScheduleError, r"^bad.csv: rank 1 has no actions; every rank needs a stage$"),
    ("0F0,0F1,0B0,0B1,0F0\n", ScheduleError, r"^bad.csv row 1, column 5: '0F0' repeats the forward \(F\) of stage 0, "
                                            r"microbatch 0 \(already at bad.csv row 1, column 1: '0F0'\)$"),
    ("0F0,0F2,0B0,0B2\n", ScheduleError, r"^bad.csv: stage 0 misses the forward \(F\) of microbatch 1 "
                                        r"\(and 1 more actions\)$"),
    ("0F0,0F1,0B0,0B1\n2F0,2F1,2B0,2B1\n", ScheduleError, r"^bad.csv: stage 1 has no actions \(stages run up to 2\)$"),
    ("0F0,0B0\n0F1,0B1\n", ScheduleError, r"^bad.csv row 2, column 1: stage 0 appears on ranks 0 and 1$"),
    ("0F0,0F1,0W0,0I0,0I1,0W1\n", ScheduleError, r"^bad.csv: torch rejects the schedule: Rank 0, step 2: Running "
                                                r"Backward Weight for stage 0, microbatch 0 without first running "
                                                r"Backward Input$"),
    ("", ScheduleError, r"^bad.csv: no ranks \(no rows\)$"),
])
def test_a_broken_csv_is_one_line_naming_the_culprit(tmp_path, text, error, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(error, match=message) as caught:
        run_torch(path, **SMALL)
    assert "\n" not in str(caught.value)


def test_missing_file_and_bad_options(tmp_path):
    with pytest.raises(ZboptError, match=r"schedule file '.*nope.csv' not found"):
        run_torch(tmp_path / "nope.csv")
    path = zbopt_csv(tmp_path / "a.csv", "1f1b", num_devices=2, num_microbatches=2)
    with pytest.raises(ZboptError, match="steps = 1: need at least 2"):
        run_torch(path, steps=1)
    with pytest.raises(ZboptError, match="hidden = 0"):
        run_torch(path, hidden=0)
    with pytest.raises(ZboptError, match=r"^atol = -1.0: expected a tolerance >= 0$"):
        run_torch(path, atol=-1.0)


def test_a_failing_rank_is_named_and_the_others_killed(tmp_path, monkeypatch):
    """The CSV vanishes between the parent's check and the ranks' own load: the ranks fail inside torch."""
    path = zbopt_csv(tmp_path / "gone.csv", "1f1b", num_devices=2, num_microbatches=2)

    def read_then_delete(csv_path):
        order = read_torch_csv(csv_path)
        os.remove(csv_path)
        return order

    monkeypatch.setattr(check, "read_torch_csv", read_then_delete)
    with pytest.raises(ZboptError, match=r"rank \d failed: FileNotFoundError: .*gone.csv") as caught:
        run_torch(path, **SMALL)
    assert "\n" not in str(caught.value)
    assert not multiprocessing.active_children()


def test_a_run_past_its_timeout_is_killed_and_named(tmp_path):
    """20 steps of a 4-rank pipeline cannot finish in 50 ms (each step alone waits for 6 p2p hops):
    the ranks are killed and the error names where each one was."""
    path = zbopt_csv(tmp_path / "a.csv", "1f1b", num_devices=4, num_microbatches=8)
    with pytest.raises(ZboptError, match=r"no result within 0.05 s, ranks killed; still running: rank \d") as caught:
        run_torch(path, **{**SMALL, "steps": 20}, timeout_s=0.05)
    assert "\n" not in str(caught.value)
    assert not multiprocessing.active_children()
