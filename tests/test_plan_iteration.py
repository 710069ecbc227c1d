"""The plan's iteration: gradient reductions over the data-parallel group and the optimizer step
timed from the layers' bytes and the device's bandwidths (`planning.model.collectives`), and the
plan optimising the iteration time against brute force over every split."""

import json
import math
import subprocess
import sys

import pytest

from zbopt import ZboptError, solve
from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op
from zbopt.planning.model import Device, Layer, Model
from zbopt.planning.model.architecture import Architecture
from zbopt.planning.model.collectives import gradient_of, least_ends_ms, ring_all_reduce_ms, ring_reduce_scatter_ms
from zbopt.planning.model.flops import Training, architecture_layers, decoder_parameters
from zbopt.planning.planner import OPTIMAL, Pipeline, plan, split_problem
from zbopt.planning.planner.certify import least_memory, split_bound

# gradients of 2 GB per decoder: at 500 GB/s over 2 ranks an all-reduce of 4 ms per layer, more
# than its compute; its 0.5 G parameters: a step of 8 ms at 1875 GB/s (30 bytes each)
EMBEDDING = Layer("embedding", 0.25, 0.25, 0.5, 0.5, 2.0, gradient_gb=0.25)
DECODER = Layer("decoder", 1.0, 1.25, 0.75, 1.0, 1.0, gradient_gb=2.0)
HEAD = Layer("lm_head", 2.5, 2.5, 2.0, 3.0, 2.0, gradient_gb=1.0)
TRAINING = Training(data_parallel=2)
MODEL = Model.from_repeats([(EMBEDDING, 1), (DECODER, 5), (HEAD, 1)], TRAINING)
DEVICE = Device(memory_gb=30.0, reserve_gb=0.0, dp_bandwidth_gbs=500.0, dp_latency_ms=0.05,
                memory_bandwidth_gbs=1875.0)


def test_ring_collectives_move_their_textbook_share_of_the_bytes():
    """Ring all-reduce 2(n-1)/n B/bw + 2(n-1)a; reduce-scatter half of it (nccl-tests' bus bandwidth)."""
    assert ring_all_reduce_ms(1.0, 8, 50.0, 0.01) == pytest.approx(2 * 7 / 8 * 1 / 50 * 1e3 + 2 * 7 * 0.01)
    assert ring_reduce_scatter_ms(1.0, 8, 50.0, 0.01) == pytest.approx(7 / 8 * 1 / 50 * 1e3 + 7 * 0.01)
    assert ring_all_reduce_ms(3.0, 1, 50.0, 0.01) == 0.0


def test_a_split_times_each_stages_reduction_and_each_devices_step():
    problem = split_problem(MODEL, DEVICE, Pipeline(2, 1, "loop", 4), (3, 4))
    gradients = (0.25 + 2 * 2.0, 3 * 2.0 + 1.0)
    assert problem.grad_reduce_times == pytest.approx(
        tuple(2 * (1 / 2) * g / 500 * 1e3 + 2 * 0.05 for g in gradients))
    # Adam moves 30 bytes per parameter in bf16; the parameters: the gradient's bytes over 4
    assert problem.optimizer_step_times == pytest.approx(tuple(g / 4 * 30 / 1875 * 1e3 for g in gradients))
    plain = split_problem(Model(MODEL.layers, MODEL.groups), DEVICE, Pipeline(2, 1, "loop", 4), (3, 4))
    assert plain.grad_reduce_times is None  # one rank: nothing to reduce


def test_the_distributed_optimizer_reduce_scatters_and_all_gathers_the_weights_after_the_step():
    sharded = Model(MODEL.layers, MODEL.groups, Training(data_parallel=4, use_distributed_optimizer=True))
    device = Device(dp_bandwidth_gbs=100.0)  # no memory bandwidth: the step is the all-gather alone
    problem = split_problem(sharded, device, Pipeline(2, 1, "loop", 4), (3, 4))
    gradients = (0.25 + 2 * 2.0, 3 * 2.0 + 1.0)
    assert problem.grad_reduce_times == pytest.approx(tuple(3 / 4 * g / 100 * 1e3 for g in gradients))
    # bf16 weights are half the bytes of the fp32 gradients
    assert problem.optimizer_step_times == pytest.approx(tuple(3 / 4 * g / 2 / 100 * 1e3 for g in gradients))


def test_an_architectures_gradients_are_its_parameters_in_the_reduced_precision():
    assert (Training("bf16").gradient_bytes, Training("fp16").gradient_bytes, Training("fp32").gradient_bytes) == \
        (4, 2, 4)
    arch = Architecture(num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=128, vocab_size=1000)
    decoder = architecture_layers(arch, Device(flops=1e14), Training("bf16"))[1][0]
    assert decoder.gradient_gb == pytest.approx(decoder_parameters(arch) * 4 / 1e9)
    given = Layer("given", 1, 1, 1, 1, parameters_gb=1.8)  # no gradient given: its share of the parameters
    assert gradient_of(given, Training()) == pytest.approx(1.8 * 4 / 18)  # bf16 Adam: 4 of 18 bytes
    assert gradient_of(given, Training(data_parallel=8, use_distributed_optimizer=True)) == \
        pytest.approx(1.8 * 4 / (6 + 12 / 8))
    assert (Training().step_bytes, Training(data_parallel=8, use_distributed_optimizer=True).step_bytes) == \
        (4 + 2 * 12 + 2, (4 + 2 * 12 + 2) / 8)


def test_the_plan_finds_the_brute_force_least_iteration_over_every_split_not_the_least_makespan():
    """The first stage's reduction comes last (its W end the pipeline): the split with the least
    makespan (5 layers on it) is not the one with the least iteration (4)."""
    pipeline = Pipeline(2, 1, "loop", 3)
    iterations, makespans = {}, {}
    for first in range(1, 7):
        problem = split_problem(MODEL, DEVICE, pipeline, (first, 7 - first))
        result = solve(problem, time_limit=20)
        assert result.status == "optimal" and result.objective == result.simulation.iteration_time
        iterations[first] = result.objective
        makespans[first] = solve(split_problem(Model(MODEL.layers, MODEL.groups), Device(memory_gb=30.0,
                                 reserve_gb=0.0), pipeline, (first, 7 - first)), time_limit=20).objective
        # the plan's bound on splits it does not solve
        floor = split_bound(MODEL, DEVICE, pipeline, (first, 7 - first)) + least_ends_ms(DEVICE, TRAINING, MODEL.layers)
        assert floor <= iterations[first] + 1e-9
    answer = plan(MODEL, DEVICE, pipeline, schedules=[OPTIMAL], time_limit=60)
    assert answer.iteration_time == pytest.approx(min(iterations.values()))
    assert answer.lower_bound <= min(iterations.values()) + 1e-9
    assert answer.best.best.split[0] == min(iterations, key=iterations.get) != min(makespans, key=makespans.get)


def test_the_plan_command_shows_the_iteration_and_refuses_a_second_data_parallel_size(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  data_parallel: 2\n  layers:\n"
                    "    - {name: decoder, repeat: 6, forward: 1 ms, backward: 1 ms, weight: 1 ms, activation: 1 GB,"
                    " parameters: 1 GB, gradient: 0.5 GB}\n"
                    "device: {memory: 40 GB, dp_bandwidth: 500 GB/s, dp_latency: 0.05 ms}\n")
    run = subprocess.run([sys.executable, "-m", "zbopt", "plan", str(path), "--devices", "2", "--microbatches", "4",
                          "--time-limit", "10", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    rows = [row for row in answer["rows"] if row["iteration_ms"] is not None]
    assert all(row["iteration_ms"] > row["makespan_ms"] for row in rows)
    assert answer["best"]["iteration_ms"] <= min(row["iteration_ms"] for row in rows) + 1e-9
    assert answer["best"]["lower_bound_ms"] <= answer["best"]["iteration_ms"]
    run = subprocess.run([sys.executable, "-m", "zbopt", "plan", str(path), "--devices", "2", "--data-parallel", "4"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "model.data_parallel = 2, but 4 asked for: give one" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("device", "message"), [
    ({"dp_bandwidth": "50"}, "device.dp_bandwidth = '50': write the unit, e.g. '50 GB/s'"),
    ({"dp_bandwidth": "0 GB/s"}, "must be more than 0"),
    ({"memory_bandwidth": "2 TB"}, "unknown unit 'TB'"),
    ({"dp_latency": "-1 ms"}, "cannot be negative"),
])
def test_a_bad_interconnect_is_named_in_one_line(device, message):
    with pytest.raises(ZboptError, match=message.replace("(", r"\(").replace(".", r"\.")):
        Device.from_config(device)


def test_an_iteration_is_never_shorter_than_its_pipeline():
    problem = split_problem(MODEL, DEVICE, Pipeline(2, 1, "loop", 3), (3, 4))
    result = solve(problem, time_limit=10)
    assert result.simulation.iteration_time >= result.simulation.makespan + min(problem.optimizer_step_times)
    assert not math.isinf(result.lower_bound)


def test_ends_beyond_zbopts_range_are_refused_in_one_line():
    slow = Device(memory_gb=30.0, reserve_gb=0.0, dp_bandwidth_gbs=1e-12)
    with pytest.raises(ZboptError, match=r"^plan: the iteration's ends .* beyond zbopt's range"):
        plan(MODEL, slow, Pipeline(2, 1, "loop", 3), time_limit=5)


def test_fsdp_shards_everything_and_gathers_each_stages_weights_before_its_first_forward():
    training = Training(data_parallel=4, fsdp=True)
    assert training.bytes_per_parameter == 18 / 4 and training.step_bytes == 30 / 4
    with pytest.raises(ZboptError, match="fsdp = true: it shards the optimizer's state as well"):
        Training(data_parallel=4, fsdp=True, use_distributed_optimizer=True)
    sharded = Model(MODEL.layers, MODEL.groups, training)
    problem = split_problem(sharded, DEVICE, Pipeline(2, 1, "loop", 3), (3, 4))
    gradients = (0.25 + 2 * 2.0, 3 * 2.0 + 1.0)
    weights = tuple(g / 4 * 2 for g in gradients)  # bf16 weights of g / 4 G parameters
    assert problem.unshard_memory == pytest.approx(weights)
    assert problem.gradient_memory == pytest.approx(gradients)  # unsharded until their reduce-scatter
    assert problem.unshard_times == pytest.approx(tuple(3 / 4 * w / 500 * 1e3 + 3 * 0.05 for w in weights))
    assert problem.grad_reduce_times == pytest.approx(tuple(3 / 4 * g / 500 * 1e3 + 3 * 0.05 for g in gradients))
    assert problem.optimizer_step_times == pytest.approx(tuple(g / 4 * 30 / 4 / 1875 * 1e3 for g in gradients))
    answer = plan(sharded, DEVICE, Pipeline(2, 1, "loop", 3), schedules=[OPTIMAL], time_limit=10)
    simulation = answer.best.best.simulation
    for device, stages in enumerate(simulation.problem.stages_of_device):  # gathered from time 0
        assert simulation.peak_memory[device] >= sum(simulation.problem.unshard_memory[s] for s in stages)
    first = simulation.start[simulation.table.index(Op(FORWARD, 0, 0))]
    assert first >= simulation.ends.unshard[0][0][1] > 0  # the first forward waits for its stage's gather


def test_the_least_memory_any_split_needs_counts_fsdps_gathered_weights():
    """FSDP over 4: each layer's gathered weights (bf16: gradient / 4 G parameters · 2 bytes) come on
    top of its sharded parameters and one microbatch's activations, on the fullest device."""
    sharded = Model(MODEL.layers, MODEL.groups, Training(data_parallel=4, fsdp=True))
    pipeline = Pipeline(2, 1, "loop", 3)

    def need(layer: Layer) -> float:
        return layer.parameters_gb + layer.activation_gb + layer.gradient_gb / 4 * 2

    least = min(max(sum(need(layer) for layer in sharded.layers[s:e]) for s, e in ((0, cut), (cut, 7)))
                for cut in range(1, 7))
    assert least_memory(sharded, pipeline) == pytest.approx(least, abs=1e-5)
    with pytest.raises(ZboptError, match=r"every split needs at least .* \(parameters, FSDP's gathered weights and "
                                         r"one microbatch's activations\)$"):
        plan(sharded, Device(memory_gb=least * 0.99, reserve_gb=0.0), pipeline, schedules=[OPTIMAL], time_limit=10)
