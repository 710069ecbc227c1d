"""The plan: split rules, the Problem of a split, the bound over every split, and the joint search,
against brute force over every split of small models."""

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from zbopt import ZboptError, generate, load_schedule, simulate, solve
from zbopt.planning.model import Device, Layer, Model
from zbopt.planning.planner import OPTIMAL, Pipeline, plan, split_by_rule, split_problem
from zbopt.planning.planner.certify import SplitFamily, least_memory, split_bound
from zbopt.planning.planner.exports import parse_megatron_layout
from zbopt.planning.planner.rules import layer_time

EMBEDDING = Layer("embedding", 0.25, 0.25, 0.5, 0.5, 2.0)
DECODER = Layer("decoder", 1.0, 1.25, 0.75, 1.0, 1.0)
HEAD = Layer("lm_head", 2.5, 2.5, 2.0, 3.0, 2.0)
SMALL = Model.from_repeats([(EMBEDDING, 1), (DECODER, 5), (HEAD, 1)])


def every_split(layers: int, stages: int):
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        yield tuple(after - before for before, after in itertools.pairwise(bounds))


def optimum(model, device, pipeline, split) -> float:
    """The split's proven optimum (inf when its parameters do not fit or no schedule fits)."""
    try:
        problem = split_problem(model, device, pipeline, split)
    except ZboptError:
        return math.inf
    result = solve(problem, time_limit=20)
    assert result.status in ("optimal", "infeasible"), (split, result.status)
    return result.objective if result.status == "optimal" else math.inf


def test_even_puts_the_ends_on_the_first_and_last_stages_and_the_first_stages_take_one_more():
    model = Model.from_repeats([(EMBEDDING, 1), (DECODER, 30), (HEAD, 1)])
    assert split_by_rule("even", model, Pipeline(4)) == (1 + 8, 8, 7, 7 + 1)
    assert split_by_rule("even", model, Pipeline(3, 2, "v")) == (1 + 5, 5, 5, 5, 5, 5 + 1)


@pytest.mark.parametrize("pipeline", [Pipeline(2, 1), Pipeline(3, 1), Pipeline(2, 2, "v"), Pipeline(2, 2, "loop")])
def test_balanced_rules_reach_the_brute_force_least_longest_stage_and_device(pipeline):
    times = [layer_time(layer) for layer in SMALL.layers]
    splits = list(every_split(len(times), pipeline.num_stages))

    def stages(split):
        return [sum(times[sum(split[:s]):sum(split[:s + 1])]) for s in range(len(split))]

    def devices(split):
        per_stage = stages(split)
        return [sum(per_stage[s] for s in pipeline.stages_on(d)) for d in range(pipeline.num_devices)]

    assert max(stages(split_by_rule("stage-balanced", SMALL, pipeline))) == min(max(stages(s)) for s in splits)
    assert max(devices(split_by_rule("device-balanced", SMALL, pipeline))) == pytest.approx(
        min(max(devices(s)) for s in splits), abs=1e-3)


def test_a_split_sums_its_layers_and_leaves_each_device_its_memory_less_its_parameters():
    problem = split_problem(SMALL, Device(memory_gb=12.0, reserve_gb=0.0, p2p_ms=0.5), Pipeline(2, 1, "loop", 4),
                            (3, 4))
    assert problem.forward_times == (0.25 + 2 * 1.0, 3 * 1.0 + 2.5)
    assert problem.weight_times == (0.5 + 2 * 0.75, 3 * 0.75 + 2.0)
    assert problem.activation_memory == (0.5 + 2 * 1.0, 3 * 1.0 + 3.0)
    assert problem.weight_memory == (0.25 + 2 * 0.5, 3 * 0.5 + 1.5)
    assert problem.memory_limit == (12.0 - (2.0 + 2 * 1.0), 12.0 - (3 * 1.0 + 2.0))
    assert problem.p2p_time == 0.5


@pytest.mark.parametrize(("split", "message"), [
    ((3, 3), r"^split \[3, 3\]: covers 6 layers, the model has 7$"),
    ((7,), r"^split \[7\]: 1 stages, the pipeline has 2 \(2 devices x 1 chunks\)$"),
    ((0, 7), r"^split \[0, 7\]: every virtual stage needs a whole number of layers, at least 1$"),
    ((6, 1), r"^split \[6, 1\]: device 0 holds 7 GB of parameters, gradients and optimizer state, not less than "
             r"its memory 6 GB$"),
    ((3, 4), r"^split \[3, 4\]: 2 GB left for activations after the parameters; device 0 must hold one "
             r"microbatch's activations on its stages \(2.5\); no schedule fits below that \(GB\)$"),
])
def test_a_split_that_cannot_run_is_refused_in_one_line(split, message):
    with pytest.raises(ZboptError, match=message):
        split_problem(SMALL, Device(memory_gb=6.0, reserve_gb=0.0), Pipeline(2, 1, "loop", 4), split)


def test_a_stage_without_time_is_refused_naming_its_layers():
    model = Model.from_repeats([(Layer("embedding", 0.1, 0.0, 0.2, 0.1, 1.0), 1), (DECODER, 3)])
    with pytest.raises(ZboptError, match=r"^split \[1, 3\]: virtual stage 0 \(embedding\) has no backward time; "):
        split_problem(model, Device(), Pipeline(2, 1, "loop", 4), (1, 3))


CASES = [  # (pipeline, device memory): loose, and tight enough that the most balanced split is not the best
    (Pipeline(2, 1, "loop", 4), None),
    (Pipeline(2, 1, "loop", 4), 11.0),
    (Pipeline(2, 2, "v", 4), None),
]


@pytest.mark.parametrize(("pipeline", "memory"), CASES)
def test_the_joint_search_finds_the_brute_force_best_split_and_bounds_every_split(pipeline, memory):
    device = Device(memory_gb=memory, reserve_gb=0.0)
    optima = {split: optimum(SMALL, device, pipeline, split) for split in every_split(7, pipeline.num_stages)}
    for split, value in optima.items():  # the closed-form bound of each split is a bound
        assert split_bound(SMALL, device, pipeline, split) <= value + 1e-9
    answer = plan(SMALL, device, pipeline, schedules=[OPTIMAL], time_limit=60)
    assert answer.makespan == pytest.approx(min(optima.values()))
    assert answer.lower_bound <= min(optima.values()) + 1e-9
    assert answer.pipelines[0].pruned and answer.gap == 0


def test_at_tight_memory_the_most_time_balanced_split_is_not_the_best():
    """At 11 GB the stage-balanced split (4, 3) leaves device 0 room for one microbatch's 3.5 GB
    of activations (6 GB after 5 GB of parameters), (3, 4) for two of its 2.5 GB: the joint answer
    takes the less balanced split, shorter by what brute force finds."""
    pipeline, device = Pipeline(2, 1, "loop", 4), Device(memory_gb=11.0, reserve_gb=0.0)
    balanced = split_by_rule("stage-balanced", SMALL, pipeline)
    answer = plan(SMALL, device, pipeline, schedules=[OPTIMAL], time_limit=60)
    assert balanced == (4, 3) and answer.best.best.split == (3, 4)
    assert answer.makespan < optimum(SMALL, device, pipeline, balanced) - 1e-6


def test_the_family_bound_is_the_least_split_bound_rounded_down():
    pipeline, device = Pipeline(2, 2, "v", 4), Device(memory_gb=None, p2p_ms=0.125)
    least = min(split_bound(SMALL, device, pipeline, split) for split in every_split(7, 4))
    split, bound = SplitFamily(SMALL, device, pipeline).next_split(seconds=10)
    assert least - 7 * 4 * 4 * 1e-3 <= bound <= least  # each layer's time rounded down to 1 us, 4 sums of m = 4
    assert split_bound(SMALL, device, pipeline, split) == pytest.approx(least)


def test_no_split_that_fits_says_so_with_the_least_memory_that_would():
    pipeline = Pipeline(2, 1, "loop", 4)
    need = min(max(sum(layer.parameters_gb + layer.activation_gb for layer in SMALL.layers[s:e])
                   for s, e in ((0, split[0]), (split[0], 7))) for split in every_split(7, 2))
    assert least_memory(SMALL, pipeline) == pytest.approx(need)
    with pytest.raises(ZboptError, match=rf"^plan: no split of the model runs in 4 GB per device; every split needs "
                                         rf"at least {need:.4g} GB on its fullest device \(parameters and one "
                                         r"microbatch's activations\)$"):
        plan(SMALL, Device(memory_gb=4.0, reserve_gb=0.0), pipeline, schedules=[OPTIMAL], time_limit=10)


def test_the_plan_command_prints_the_best_split_its_bound_and_its_exports(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  layers:\n"
                    "    - {name: embedding, forward: 0.25 ms, backward: 0.25 ms, weight: 0.5 ms, activation: 0.5 GB, "
                    "parameters: 2 GB}\n"
                    "    - {name: decoder, repeat: 5, forward: 1 ms, backward: 1.25 ms, weight: 0.75 ms, "
                    "activation: 1 GB, parameters: 1 GB}\n"
                    "    - {name: lm_head, forward: 2.5 ms, backward: 2.5 ms, weight: 2 ms, activation: 3 GB, "
                    "parameters: 2 GB}\n"
                    "device: {memory: 11 GB, reserve: 0 GB}\n")
    run = subprocess.run([sys.executable, "-m", "zbopt", "plan", str(path), "--devices", "2", "--microbatches", "4",
                          "--schedule", "1f1b", "--schedule", "optimal", "--time-limit", "60", "--json",
                          "--export", str(tmp_path / "best.json")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    exported = json.loads((tmp_path / "best.json").read_text())  # the schedule, with its split recorded
    assert exported["split"]["split"] == answer["best"]["split"]
    schedule, problem = load_schedule(tmp_path / "best.json")
    assert simulate(problem, schedule).makespan == pytest.approx(answer["best"]["makespan_ms"])
    direct = plan(SMALL, Device(memory_gb=11.0, reserve_gb=0.0), Pipeline(2, 1, "loop", 4), schedules=[OPTIMAL],
                  time_limit=60)
    assert answer["best"]["makespan_ms"] == pytest.approx(direct.makespan)
    assert answer["best"]["split"] == list(direct.best.best.split) and answer["best"]["gap"] == 0
    head = answer["best"]["split"][0]  # the embedding and head - 1 decoders; the rest and the LM head
    assert parse_megatron_layout(answer["best"]["exports"]["megatron_layout"]) == ["E" + "t" * (head - 1),
                                                                                  "t" * (6 - head) + "L"]
    assert {(row["rule"], row["schedule"]) for row in answer["rows"]} == {
        (rule, schedule) for rule in ("even", "first-last", "stage-balanced", "device-balanced")
        for schedule in ("1f1b", "optimal")}


@pytest.mark.parametrize(("flags", "message"), [
    (["--chunks", "1,x"], "zbopt: --chunks 1,x: expected whole numbers separated by commas, e.g. 1,2\n"),
    (["--microbatches", "0"], "zbopt: --microbatches 0: expected a whole number, at least 1\n"),
    (["--device-memory", "80"], "zbopt: --device-memory = '80': write the unit, e.g. '80 GB'\n"),
    (["--schedule", "1f1c"], "zbopt: unknown schedule '1f1c'; did you mean '1f1b'? (known: "),
    (["--global-batch", "50", "--micro-batch-size", "2", "--data-parallel", "4"],
     "zbopt: --global-batch: 50 is not a multiple of micro_batch_size × data_parallel = 2 × 4 (from "
     "--micro-batch-size and --data-parallel)\n"),
    (["--export", "x.txt"], "zbopt: 'x.txt': cannot tell the export format from '.txt' (.trace.json a trace, .csv "
                            "torch CSV, .json zbopt JSON)\n"),  # plan has no --format to offer
])
def test_bad_plan_flags_are_one_line_and_exit_2(tmp_path, flags, message):
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  layers:\n    - {name: decoder, repeat: 4, forward: 1 ms, backward: 1 ms, weight: 1 ms, "
                    "activation: 1 GB, parameters: 1 GB}\n")
    run = subprocess.run([sys.executable, "-m", "zbopt", "plan", str(path), "--devices", "2", *flags],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith(message) and run.stderr.count("\n") == 1


def test_splits_solved_two_at_a_time_on_an_executor_reach_the_same_optimum():
    """The search with `parallel` splits at a time on an executor (a dask cluster's, or here a
    thread pool) certifies the same best split as brute force."""
    from concurrent.futures import ThreadPoolExecutor

    pipeline, device = Pipeline(2, 1, "loop", 4), Device(memory_gb=11.0, reserve_gb=0.0)
    best = min(optimum(SMALL, device, pipeline, split) for split in every_split(7, 2))
    with ThreadPoolExecutor(max_workers=2) as executor:
        answer = plan(SMALL, device, pipeline, schedules=[OPTIMAL], time_limit=60, workers=1, executor=executor,
                      parallel=2)
    assert answer.makespan == pytest.approx(best) and answer.gap == 0


def test_more_virtual_stages_than_layers_is_refused_naming_the_counts():
    with pytest.raises(ZboptError, match=r"^plan: 4 devices x 2 chunks make 8 virtual stages, more than the "
                                         r"model's 7 layers$"):
        plan(SMALL, Device(), Pipeline(4, 2, "v", 8), time_limit=5)


def test_a_long_latency_still_bounds_every_split():
    """300 ms between devices: the bound over every split counts it on both paths and stays below
    the brute-force best (a family whose objective could not hold the latency once read as "no
    split left" and certified a longer schedule)."""
    heavy, light = Layer("decoder", 1, 1, 1, 0.001, 0.001), Layer("decoder", 0.01, 0.01, 0.01, 0.001, 0.001)
    model, device, pipeline = Model((heavy,) * 4 + (light,) * 4), Device(p2p_ms=300.0), Pipeline(2, 1, "loop", 4)
    best = min(optimum(model, device, pipeline, split) for split in every_split(8, 2))
    answer = plan(model, device, pipeline, schedules=[OPTIMAL], rules=("even",), time_limit=30)
    assert answer.lower_bound <= best + 1e-6 and answer.makespan == pytest.approx(best)


def test_the_answer_is_never_longer_than_a_row_and_a_rows_peak_counts_the_parameters():
    """The plan's answer is the shortest of everything it ran, the rows' heuristics included; a
    row's peak is its device's parameters plus its activations' peak."""
    pipeline, device = Pipeline(2, 1, "loop", 4), Device(memory_gb=20.0, reserve_gb=0.0)
    answer = plan(SMALL, device, pipeline, schedules=["1f1b"], time_limit=20)
    rows = [row for row in answer.pipelines[0].rows if row.simulation is not None]
    assert rows and answer.iteration_time <= min(row.iteration_time for row in rows) + 1e-9
    row = next(row for row in answer.to_dict()["rows"] if row["peak_gb"] is not None)
    problem = split_problem(SMALL, device, pipeline, tuple(row["split"]))
    own = [sum(layer.parameters_gb for layer in SMALL.layers[:row["split"][0]]),
           sum(layer.parameters_gb for layer in SMALL.layers[row["split"][0]:])]
    peaks = simulate(problem, generate("1f1b", problem)).peak_memory
    assert row["peak_gb"] == pytest.approx([own[d] + peaks[d] for d in range(2)])


def test_megatrons_first_and_last_counts_are_per_device_with_chunks():
    """With two chunks per device (loop), the first and last devices' counts are split over their
    chunks, as Megatron-LM lays them out: the rule's split is one its flags can say."""
    from zbopt.planning.planner.exports import megatron_first_last

    model = Model.from_repeats([(EMBEDDING, 1), (DECODER, 30), (HEAD, 1)])
    pipeline = Pipeline(4, 2, "loop", 8)
    split = split_by_rule("first-last", model, pipeline)
    counts = megatron_first_last(model, list(split), 4, 2, "loop")
    assert counts is not None
    first, last = counts["decoder_first_pipeline_num_layers"], counts["decoder_last_pipeline_num_layers"]
    assert split[0] - 1 == split[4] == first // 2 and split[3] == split[7] - 1 == last // 2


def test_rules_keep_a_layer_with_time_on_every_stage_and_split_a_profile_of_distinct_names():
    """device-balanced never leaves the embedding (no B time) alone on a stage; even splits a
    model whose layers all have their own names (a per-layer profile) in equal parts."""
    timeless = Layer("embedding", 0.01, 0.0, 0.02, 0.1, 1.0)
    model = Model.from_repeats([(timeless, 1), (DECODER, 6), (HEAD, 1)])
    split = split_by_rule("device-balanced", model, Pipeline(2, 2, "v", 4))
    split_problem(model, Device(), Pipeline(2, 2, "v", 4), split)  # every stage has F, B and W time
    distinct = Model(tuple(Layer(f"layer{i}", 1, 1, 1, 1, 1) for i in range(8)))
    assert split_by_rule("even", distinct, Pipeline(4)) == (2, 2, 2, 2)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Pipeline(2, 2, "bidirectional", 4), r"^pipeline placement 'bidirectional': a plan splits the model "
                                                 r"over 'loop' or 'v'$"),
    (lambda: plan(Model.from_repeats([(DECODER, 3), (Layer("lm_head", 1, 2, None, 1, 1), 1)]), Device(),
                  Pipeline(2), time_limit=5),
     r"^model: some layers give a weight time and some do not; give W for all or for none$"),
    (lambda: plan(SMALL, Device(), Pipeline(2), time_limit=math.inf),
     r"^plan: time_limit = inf: expected a number of seconds above 0$"),
])
def test_a_plan_that_cannot_be_made_is_refused_in_one_line(make, message):
    with pytest.raises(ZboptError, match=message):
        make()


def test_ctrl_c_outside_a_deadline_leaves_generators_alone():
    """`interrupt.check` raises only inside a deadline scope: a frontier's heuristic points run
    outside one and stop on Ctrl-C by their own means."""
    from zbopt.core import interrupt

    interrupt.requested.set()
    try:
        interrupt.check()  # no exception
        with pytest.raises(interrupt.TimeUp), interrupt.deadline_scope(math.inf):
            interrupt.check()
    finally:
        interrupt.requested.clear()


@pytest.mark.parametrize(("pipeline", "memory"), [(Pipeline(2, 1, "loop", 6), 11.0), (Pipeline(2, 1, "loop", 6), 14.0),
                                                  (Pipeline(2, 2, "v", 3), 12.0), (Pipeline(3, 1, "loop", 6), 8.0)])
def test_the_family_bound_of_each_split_alone_never_exceeds_its_optimum(pipeline, memory):
    """The family's bound with its boundaries fixed to one split (the time terms and the memory
    ones: each stage's activations held a round trip, as many as fit) is at most that split's
    brute-force optimum, at memories where some splits do not fit and others are tight."""
    device = Device(memory_gb=memory, reserve_gb=0.0)
    checked, raised = 0, 0
    for split in every_split(7, pipeline.num_stages):
        best = optimum(SMALL, device, pipeline, split)
        family = SplitFamily(SMALL, device, pipeline)
        for stage, start in enumerate(itertools.accumulate(split[:-1]), start=1):
            family.boundaries.model.Add(family.boundaries.boundaries[stage] == start)
        _, bound = family.next_split(seconds=10)
        assert bound <= best + 1e-9, (split, bound, best)
        checked += best < math.inf
        raised += math.inf > bound > split_bound(SMALL, device, pipeline, split) + 1e-6  # the memory terms bind
    assert checked >= 2 and raised >= 1


def test_the_report_draws_every_split_and_the_best_schedule_in_ms_and_gb(tmp_path):
    """The HTML report: one split panel per distinct rule split and the joint one, the best
    schedule's section with its makespan, and the viewer told the units."""
    import base64
    import gzip
    import re

    from zbopt.presentation.plan_report import write_plan_report

    answer = plan(SMALL, Device(memory_gb=11.0, reserve_gb=0.0), Pipeline(2, 1, "loop", 4), schedules=[OPTIMAL],
                  time_limit=20)
    page = write_plan_report(tmp_path / "plan.html", answer).read_text()
    rules = {row.split for row in answer.pipelines[0].rows if row.split is not None}
    assert page.count("layers per virtual stage") == len(rules) + 1
    assert f"makespan {answer.makespan:.5g} ms" in page
    packed = re.search(r'class="schedule-data" data-encoding="gzip\+base64">([^<]+)<', page).group(1)
    data = json.loads(gzip.decompress(base64.b64decode(packed)))
    assert data["units"] == {"time": "ms", "memory": "GB"} and data["makespan"] == pytest.approx(answer.makespan)


def test_the_microbatches_of_a_plan_can_come_from_a_global_batch(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  layers:\n    - {name: decoder, repeat: 4, forward: 1 ms, backward: 1 ms, weight: 1 ms, "
                    "activation: 1 GB, parameters: 1 GB}\n")
    run = subprocess.run([sys.executable, "-m", "zbopt", "plan", str(path), "--devices", "2", "--global-batch", "48",
                          "--micro-batch-size", "2", "--data-parallel", "4", "--schedule", "1f1b", "--time-limit", "5",
                          "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["pipelines"][0]["microbatches"] == 48 // (2 * 4)


def test_ctrl_c_prints_the_plan_so_far_and_exits_130():
    """The first Ctrl-C stops the plan (the split family's CP-SAT leaves SIGINT to zbopt): the
    best plan found so far is printed, then one line, exit status 130."""
    import signal
    import time

    process = subprocess.Popen([sys.executable, "-m", "zbopt", "plan", "examples/model_layers.yaml", "--devices", "4",
                                "--chunks", "2", "--time-limit", "60", "--schedule", "zb-v", "--schedule", "optimal"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               cwd=Path(__file__).resolve().parent.parent)
    time.sleep(5)  # past start-up and the rules' heuristics, inside the optimizer's solves
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert (process.returncode, err) == (130, "zbopt: interrupted\n")
    assert any(line.startswith("best: 2 chunks (v)") for line in out.splitlines())


@pytest.mark.parametrize(("pipeline", "device"), [
    (Pipeline(2, 1, "loop", 3), Device(memory_gb=None, p2p_ms=0.0)),
    (Pipeline(2, 1, "loop", 3), Device(memory_gb=11.0, reserve_gb=0.0, p2p_ms=0.5)),
])
def test_the_joint_model_is_bounded_by_and_bounds_the_best_split(pipeline, device):
    """The one CP-SAT model of split and schedule (issue 31's alternative to the plan's search):
    its answer is a real schedule no shorter than the brute-force best split's optimum, its bound
    no longer, and an answer it proves optimal is that optimum."""
    from zbopt.planning.planner.joint_model import joint_search

    best = min(optimum(SMALL, device, pipeline, split) for split in every_split(len(SMALL.layers), 2))
    split = (3, 4)  # a split that fits both devices, with its 1F1B as the hint: an answer in any time
    problem = split_problem(SMALL, device, pipeline, split)
    answer = joint_search(SMALL, device, pipeline, 2.0, hint=(split, simulate(problem, generate("1f1b", problem))))
    assert answer.simulation.valid and answer.simulation.makespan >= best - 1e-9
    assert answer.lower_bound_ms <= best + 1e-9
    if answer.proven:  # without a memory limit in about 1 s on a quiet machine
        assert answer.simulation.makespan == pytest.approx(best)


def test_the_optimal_row_on_a_split_is_never_behind_that_splits_best_row():
    """Issue 41: the optimizer on a rule's split starts from the split's best heuristic row, so its
    row is never longer than any row of that split, even with a time limit too short to search
    (two chunks per device, the V placement, tight memory)."""
    pipeline, device = Pipeline(2, 2, "v", 8), Device(memory_gb=14.0, reserve_gb=0.0)
    answer = plan(Model.from_repeats([(EMBEDDING, 1), (DECODER, 9), (HEAD, 1)]), device, pipeline,
                  time_limit=4)
    by_split: dict = {}
    for row in answer.pipelines[0].rows:
        if row.simulation is not None:
            by_split.setdefault(row.split, []).append(row)
    optimal = [(split, row) for split, rows in by_split.items() for row in rows if row.schedule == OPTIMAL]
    assert optimal
    for split, row in optimal:
        assert row.iteration_time <= min(other.iteration_time for other in by_split[split]) + 1e-9


def test_the_plan_text_puts_the_answer_first_and_folds_rows_over_the_limit(capsys):
    """Issue 40: the best plan comes right after the model line; a schedule over the memory limit on
    a rule's split is one line naming it with its rule, not a table row (gpipe holds every
    microbatch's activations: 8 of them on 80 GB devices do not fit the example's first stage)."""
    from zbopt.interfaces.cli import main

    status = main(["plan", "examples/model_layers.yaml", "--devices", "4", "--microbatches", "8", "--time-limit", "4",
                   "--schedule", "gpipe", "--schedule", "1f1b"])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0 and lines[2].startswith("best: 1 chunk (loop), schedule ")
    folded = [line for line in lines if line.startswith("over the memory limit: ")]
    assert folded and "gpipe (even)" in folded[0]
    assert not [line for line in lines if line.startswith("even") and line.rstrip().endswith("over the memory limit")]


def test_the_reserve_is_memory_the_plan_never_uses():
    """A device of M GB with a reserve of R plans as one of M - R with none (the same best split and
    makespan, the same certificate); by default the reserve is a tenth of the memory; a reserve not
    below the memory is one line naming it."""
    from zbopt.planning.model.parts import DEFAULT_RESERVE_SHARE

    pipeline = Pipeline(2, 1, "loop", 4)
    reserved = plan(SMALL, Device(memory_gb=14.0, reserve_gb=3.0), pipeline, schedules=[OPTIMAL], time_limit=20)
    bare = plan(SMALL, Device(memory_gb=11.0, reserve_gb=0.0), pipeline, schedules=[OPTIMAL], time_limit=20)
    assert reserved.best.best.split == bare.best.best.split
    assert reserved.makespan == pytest.approx(bare.makespan) and reserved.lower_bound == pytest.approx(bare.lower_bound)
    assert max(reserved.to_dict()["best"]["peak_gb"]) <= 11.0 + 1e-9
    assert reserved.to_dict()["best"]["reserve_gb"] == 3.0 and reserved.to_dict()["best"]["usable_gb"] == 11.0
    assert Device(memory_gb=80.0).reserve == DEFAULT_RESERVE_SHARE * 80.0 and Device(memory_gb=80.0).usable_gb == 72.0
    with pytest.raises(ZboptError, match=r"^device reserve = 14 GB: must be less than the device's memory \(14 GB\)"):
        Device(memory_gb=14.0, reserve_gb=14.0)
    with pytest.raises(ZboptError, match=r"^plan: a reserve of 3 GB but no device memory to keep it from"):
        plan(SMALL, Device(reserve_gb=3.0), pipeline, time_limit=5)
    with pytest.raises(ZboptError, match=r"^plan: no split of the model runs in 4 GB per device \(8 GB less a "
                                         r"reserve of 4 GB\); every split needs at least"):
        plan(SMALL, Device(memory_gb=8.0, reserve_gb=4.0), pipeline, time_limit=5)
