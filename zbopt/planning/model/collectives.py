"""The iteration's ends of a split, in ms: each virtual stage's gradient reduction over the
data-parallel group and each device's optimizer step, from the layers' bytes, how the model is
trained (`Training`: the data-parallel size, the distributed optimizer, the dtype) and the
device's interconnect and memory bandwidth (`Device.dp_bandwidth_gbs`, `dp_latency_ms`,
`memory_bandwidth_gbs`), as the Problem's `grad_reduce_times` and `optimizer_step_times` (and the
device's `comm_slowdown`, where they are timed).

Ring collectives over n ranks, B bytes per rank, bus bandwidth β per rank, α per ring step
(Patarasuk and Yuan 2009; nccl-tests' PERFORMANCE.md defines its "bus bandwidth" by these factors):
    all-reduce      2(n-1)/n · B/β + 2(n-1)·α
    reduce-scatter  (n-1)/n · B/β + (n-1)·α, and an all-gather alike.
Plain data parallelism all-reduces the gradients; with the distributed optimizer (ZeRO-1,
`Training.use_distributed_optimizer`) it reduce-scatters them, and after the step all-gathers
the updated weights (in the training dtype), which zbopt counts into the step. With FSDP
(`Training.fsdp`) the gradients are reduce-scattered too, and each stage's weights are gathered
(an all-gather) before its first forward and held until its last gradient op: the Problem's
`unshard_times` and `unshard_memory` (the gathered weights, in the training dtype); its unsharded
gradients are held from its first gradient op until their reduce-scatter ends (`gradient_memory`:
the bytes the reduction moves).
The step: a fused Adam is bound by memory traffic, `Training.step_bytes` per parameter (bf16
mixed precision: 30, over d with the distributed optimizer) at the memory bandwidth.
A layer's parameter count is its gradient bytes over the dtype's gradient bytes per parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbopt.core.errors import ZboptError
from zbopt.planning.model.flops import ELEMENT_BYTES, Training
from zbopt.planning.model.parts import Device, Layer

__all__ = ["describe_ends", "ends_times", "gathered_gb", "gradient_of", "least_ends_ms", "ring_all_reduce_ms",
           "ring_reduce_scatter_ms"]


def ring_all_reduce_ms(gigabytes: float, ranks: int, bandwidth_gbs: float, latency_ms: float) -> float:
    """A ring all-reduce of `gigabytes` per rank over `ranks` (0 for one rank)."""
    return 2 * ring_reduce_scatter_ms(gigabytes, ranks, bandwidth_gbs, latency_ms)


def ring_reduce_scatter_ms(gigabytes: float, ranks: int, bandwidth_gbs: float, latency_ms: float) -> float:
    """A ring reduce-scatter (or all-gather) of `gigabytes` per rank over `ranks` (0 for one rank)."""
    return (ranks - 1) / ranks * gigabytes / bandwidth_gbs * 1e3 + (ranks - 1) * latency_ms


def gradient_of(layer: Layer, training: Training) -> float:
    """The GB a layer's gradient reduction moves: its `gradient_gb`, else its share of
    `parameters_gb` as the training holds it (bf16 mixed-precision Adam: 4 of 18 bytes per
    parameter; with the distributed optimizer over d ranks, 4 of 6 + 12/d)."""
    if layer.gradient_gb is not None:
        return layer.gradient_gb
    return layer.parameters_gb * training.gradient_bytes / training.bytes_per_parameter


def _timed(device: Device, training: Training) -> tuple[bool, bool]:
    """(whether reductions are timed, whether the step is): a group of more than one rank and an
    interconnect bandwidth; a memory bandwidth, or the distributed optimizer's all-gather."""
    reduces = training.data_parallel > 1 and device.dp_bandwidth_gbs is not None
    return reduces, device.memory_bandwidth_gbs is not None or (reduces and training.use_distributed_optimizer)


def ends_times(device: Device, training: Training, stages: Sequence[Sequence[Layer]],
               stages_of_device: Sequence[Sequence[int]]) -> dict:
    """The Problem keys of the iteration's ends for virtual stages holding `stages` (their layers),
    placed on devices as `stages_of_device` says: `grad_reduce_times` and `optimizer_step_times`
    where `_timed` says so; {} where neither (the iteration is then the pipeline)."""
    reduces, steps = _timed(device, training)
    keys = {}
    if reduces:
        keys["grad_reduce_times"] = [_reduce_ms(device, training, layers) for layers in stages]
    if steps:
        keys["optimizer_step_times"] = [sum(_step_ms(device, training, stages[stage], reduces) for stage in own)
                                        for own in stages_of_device]
    if training.fsdp and training.data_parallel > 1:  # the gathered weights and gradients take memory, timed or not
        weights = [gathered_gb(training, layers) for layers in stages]
        keys["unshard_memory"] = weights
        keys["gradient_memory"] = [sum(gradient_of(layer, training) for layer in layers) for layers in stages]
        if reduces:
            keys["unshard_times"] = [ring_reduce_scatter_ms(gathered, training.data_parallel, device.dp_bandwidth_gbs,
                                                            device.dp_latency_ms) for gathered in weights]
    if device.comm_slowdown != 1:
        if not reduces:
            raise ZboptError(f"device.comm_slowdown = {device.comm_slowdown:g}: slows compute while a transfer runs, "
                             "and the plan times none: give device.dp_bandwidth and a data-parallel size above 1")
        keys["comm_slowdown"] = device.comm_slowdown
    return keys


def _parameters(training: Training, layers: Sequence[Layer]) -> float:
    """The layers' parameter count in 10^9: their gradient bytes over the gradient's bytes per parameter."""
    return sum(gradient_of(layer, training) for layer in layers) / training.gradient_bytes


def _weights_gb(training: Training, layers: Sequence[Layer]) -> float:
    """The layers' weights in the training dtype (GB)."""
    return _parameters(training, layers) * ELEMENT_BYTES[training.dtype]


def gathered_gb(training: Training, layers: Sequence[Layer]) -> float:
    """What FSDP's all-gather holds of the layers while their stage runs (GB): their weights in the
    training dtype; 0 without FSDP (each rank then holds its whole weights among `parameters`)."""
    return _weights_gb(training, layers) if training.fsdp and training.data_parallel > 1 else 0.0


def least_ends_ms(device: Device, training: Training, layers: Sequence[Layer]) -> float:
    """The least the ends add to any split's makespan: the stage whose last gradient op ends the
    pipeline still reduces at least one layer's gradients, and its device steps at least one
    layer's parameters (a bound for the plan's splits not solved)."""
    reduces, steps = _timed(device, training)
    reduce = min(_reduce_ms(device, training, [layer]) for layer in layers) if reduces else 0.0
    step = min(_step_ms(device, training, [layer], reduces) for layer in layers) if steps else 0.0
    return reduce + step


def _reduce_ms(device: Device, training: Training, layers: Sequence[Layer]) -> float:
    """One stage's reduction: all-reduce, or reduce-scatter with the distributed optimizer."""
    collective = ring_reduce_scatter_ms if training.sharded else ring_all_reduce_ms
    return collective(sum(gradient_of(layer, training) for layer in layers), training.data_parallel,
                      device.dp_bandwidth_gbs, device.dp_latency_ms)


def _step_ms(device: Device, training: Training, layers: Sequence[Layer], reduces: bool) -> float:
    """One stage's share of its device's step: the update at the memory bandwidth, then with the
    distributed optimizer the all-gather of its updated weights."""
    update = 0.0 if device.memory_bandwidth_gbs is None else \
        _parameters(training, layers) * training.step_bytes / device.memory_bandwidth_gbs * 1e3
    if not (reduces and training.use_distributed_optimizer):  # FSDP gathers at the next forward instead
        return update
    return update + ring_reduce_scatter_ms(_weights_gb(training, layers), training.data_parallel,
                                           device.dp_bandwidth_gbs, device.dp_latency_ms)


def describe_ends(device: Device, training: Training) -> str | None:
    """What `ends_times` times, in one line for a plan's output; None where it times nothing (and
    says so where data parallelism is asked for without an interconnect to time it)."""
    reduces, steps = _timed(device, training)
    ranks, parts = training.data_parallel, []
    if reduces:
        kind = ("reduce-scattered (FSDP)" if training.fsdp else "reduce-scattered (distributed optimizer)"
                if training.use_distributed_optimizer else "all-reduced")
        parts.append(f"gradients {kind} over {ranks} data-parallel ranks (ring, {device.dp_bandwidth_gbs:g} GB/s, "
                     f"{device.dp_latency_ms:g} ms per step)")
    elif ranks > 1:
        parts.append(f"gradient reduction over {ranks} ranks not timed (give device.dp_bandwidth)")
    if device.memory_bandwidth_gbs is not None:
        parts.append(f"optimizer step at {device.memory_bandwidth_gbs:g} GB/s of memory bandwidth")
    if steps and reduces and training.use_distributed_optimizer:
        parts.append("the updated weights all-gathered after the step")
    if reduces and device.comm_slowdown != 1:
        parts.append(f"compute {device.comm_slowdown:g} times slower while a transfer runs")
    if training.fsdp and ranks > 1:
        parts.append("each stage's weights gathered before its first forward and held until its last gradient op, "
                     "its gradients held from its first until their reduce-scatter"
                     + ("" if reduces else " (their memory counted, their all-gather not timed)"))
    return None if not parts else "iteration ends: " + "; ".join(parts)
