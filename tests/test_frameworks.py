"""What each framework runs of a plan (`zbopt.planning.planner.frameworks`): Megatron-LM's best is
its own fused schedule simulated on the plan's splits (checked against a simulation built here and
against every split by brute force), torchtitan's config lines name the placement's schedule class
and the split's modules, and a model named by its modules' FQNs keeps its names."""

import itertools

import pytest

from zbopt import generate, simulate
from zbopt.planning.model import Device, Layer, Model
from zbopt.planning.planner import Pipeline
from zbopt.planning.planner.exports import torchtitan_counts, torchtitan_modules
from zbopt.planning.planner.frameworks import framework_support, fused_model, megatron_best, torchtitan_config
from zbopt.planning.planner.split import split_problem


def _layer(name, forward, weight=1.0):
    return Layer(name, forward_ms=forward, backward_ms=forward, weight_ms=weight, activation_gb=1.0,
                 parameters_gb=0.5)


MODEL = Model((_layer("embedding", 1.0), *(_layer("decoder", 2.0 + index % 3) for index in range(6)),
               _layer("lm_head", 3.0)))
DEVICE = Device(memory_gb=40.0)


def _every_split(layers: int, stages: int):
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        yield tuple(bounds[index + 1] - bounds[index] for index in range(stages))


def test_a_fused_model_adds_w_to_b_and_drops_what_b_keeps_for_w():
    fused = fused_model(MODEL)
    for layer, original in zip(fused.layers, MODEL.layers, strict=True):
        assert layer.weight_ms is None and layer.weight_activation_gb is None
        assert layer.backward_ms == original.backward_ms + original.weight_ms


@pytest.mark.parametrize(("pipeline", "schedule"), [(Pipeline(4, 1, "loop", 8), "1f1b"),
                                                    (Pipeline(2, 2, "loop", 4), "interleaved-1f1b")])
def test_megatrons_best_is_its_fused_schedule_on_the_best_split_given(pipeline, schedule):
    """Over every split (brute force), the answer is the least makespan of Megatron's schedule with
    the backward fused, simulated here independently."""
    splits = list(_every_split(len(MODEL.layers), pipeline.num_stages))
    found = megatron_best(MODEL, DEVICE, pipeline, splits)
    fused = fused_model(MODEL)
    expected = min(simulate(problem, generate(schedule, problem)).makespan
                   for problem in (split_problem(fused, DEVICE, pipeline, split) for split in splits))
    assert found["schedule"] == schedule and found["makespan_ms"] == pytest.approx(expected)
    problem = split_problem(fused, DEVICE, pipeline, found["split"])
    assert simulate(problem, generate(schedule, problem)).makespan == pytest.approx(expected)
    assert found["flags"][0] == f"--pipeline-model-parallel-size {pipeline.num_devices}"


def test_megatron_has_no_schedule_for_v_and_none_that_fits_a_small_memory():
    assert "loop order only" in megatron_best(MODEL, DEVICE, Pipeline(2, 2, "v", 4), [(2, 2, 2, 2)])
    tight = Device(memory_gb=3.0)  # parameters 1 to 2 GB a stage, 1F1B holds p activations of 1 GB on device 0
    assert "fits the device memory on none" in megatron_best(MODEL, tight, Pipeline(4, 1, "loop", 8), [(2, 2, 2, 2)])


def test_a_split_backward_plan_is_not_megatrons_as_printed_and_a_fused_1f1b_is():
    pipeline, split = Pipeline(4, 1, "loop", 8), (2, 2, 2, 2)
    problem = split_problem(MODEL, DEVICE, pipeline, split)
    zb = framework_support(MODEL, DEVICE, pipeline, split, simulate(problem, generate("zb-h1", problem)), "zb-h1")
    assert not zb["megatron"]["as_printed"] and "splits the backward" in zb["megatron"]["why_not"]
    fused = fused_model(MODEL)
    plain = split_problem(fused, DEVICE, pipeline, split)
    own = framework_support(fused, DEVICE, pipeline, split, simulate(plain, generate("1f1b", plain)), "1f1b")
    assert own["megatron"]["as_printed"] and own["megatron"]["why_not"] is None
    assert own["megatron"]["best"]["makespan_ms"] == simulate(plain, generate("1f1b", plain)).makespan


@pytest.mark.parametrize(("pipeline", "split", "schedule"), [
    (Pipeline(4, 1, "loop", 8), (2, 2, 2, 2), "PipelineScheduleSingle"),
    (Pipeline(2, 2, "loop", 4), (2, 2, 2, 2), "PipelineScheduleMulti"),
    (Pipeline(2, 2, "v", 4), (2, 2, 2, 2), "ZBVZeroBubble"),
])
def test_torchtitans_lines_name_the_placements_schedule_and_the_splits_modules(pipeline, split, schedule):
    """The lines are TOML (tomllib reads them) whose [parallelism] holds the degree, the schedule
    class that places the stages, the CSV and the split's module lists."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    config = tomllib.loads("\n".join(torchtitan_config(MODEL, pipeline, split, csv="my.csv")))["parallelism"]
    modules = torchtitan_modules(MODEL, list(split), pipeline.num_devices, pipeline.chunks_per_device,
                                 pipeline.placement)
    assert config == {"pipeline_parallel_degree": pipeline.num_devices, "pipeline_parallel_schedule": schedule,
                      "pipeline_parallel_schedule_csv": "my.csv", "module_fqns_per_model_part": modules}


def test_torchtitan_cannot_take_a_v_of_four_chunks():
    assert "loop order" in torchtitan_config(MODEL, Pipeline(1, 4, "v", 4), (2, 2, 2, 2))


def test_a_model_named_by_fqns_keeps_them_in_torchtitans_lists_and_reads_back():
    """profile-model names layers by FQN ("tok_embeddings", "layers.0", "0"): the lists are those
    names; a model of known kinds keeps torchtitan's Llama names."""
    own = Model(tuple(_layer(name, 1.0) for name in ("tok_embeddings", "layers.0", "layers.1", "norm", "output")))
    modules = torchtitan_modules(own, [2, 3], 2)
    assert modules == [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]
    assert torchtitan_counts(own, modules) == [2, 3]
    numbered = Model(tuple(_layer(str(index), 1.0) for index in range(4)))
    assert torchtitan_modules(numbered, [1, 3], 2) == [["0"], ["1", "2", "3"]]
    assert torchtitan_modules(MODEL, [4, 4], 2)[0][:2] == ["tok_embeddings", "layers.0"]
