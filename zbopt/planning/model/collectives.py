"""The iteration's ends of a split, in ms: each virtual stage's gradient reduction over the
data-parallel group and each device's optimizer step, from the layers' bytes and the device's
interconnect and memory bandwidth (`Device.dp_bandwidth_gbs`, `dp_latency_ms`,
`memory_bandwidth_gbs`), as the Problem's `grad_reduce_times` and `optimizer_step_times`.

Ring collectives over n ranks, B bytes per rank, bus bandwidth β per rank, α per ring step
(Patarasuk and Yuan 2009; NCCL's performance notes define its "bus bandwidth" by the same factors):
    all-reduce      2(n-1)/n · B/β + 2(n-1)·α
    reduce-scatter  (n-1)/n · B/β + (n-1)·α, and an all-gather alike.
Plain data parallelism all-reduces the gradients; with the distributed optimizer (ZeRO-1,
`Training.use_distributed_optimizer`) it reduce-scatters them, and after the step all-gathers
the updated weights (in the training dtype), which zbopt counts into the step.
The step: a fused Adam is bound by memory traffic; it reads every byte a layer holds for it
(weights, gradient, optimizer state: `parameters_gb`) and writes most of them back, so zbopt
takes 2 · parameters_gb / memory bandwidth (bf16 mixed precision: 36 bytes per parameter against
the 32 an exact count of reads and writes gives).
"""

from __future__ import annotations

from collections.abc import Sequence

from zbopt.planning.model.flops import ELEMENT_BYTES, Training
from zbopt.planning.model.parts import Device, Layer

__all__ = ["describe_ends", "ends_times", "ring_all_reduce_ms", "ring_reduce_scatter_ms"]

STEP_TRAFFIC = 2.0  # bytes moved per byte held by the optimizer step: read, then written back


def ring_all_reduce_ms(gigabytes: float, ranks: int, bandwidth_gbs: float, latency_ms: float) -> float:
    """A ring all-reduce of `gigabytes` per rank over `ranks` (0 for one rank)."""
    return 2 * ring_reduce_scatter_ms(gigabytes, ranks, bandwidth_gbs, latency_ms)


def ring_reduce_scatter_ms(gigabytes: float, ranks: int, bandwidth_gbs: float, latency_ms: float) -> float:
    """A ring reduce-scatter (or all-gather) of `gigabytes` per rank over `ranks` (0 for one rank)."""
    return (ranks - 1) / ranks * gigabytes / bandwidth_gbs * 1e3 + (ranks - 1) * latency_ms


def ends_times(device: Device, training: Training, stages: Sequence[Sequence[Layer]],
               stages_of_device: Sequence[Sequence[int]]) -> dict:
    """The Problem keys of the iteration's ends for virtual stages holding `stages` (their layers),
    placed on devices as `stages_of_device` says: `grad_reduce_times` where the device has a
    data-parallel bandwidth and the group more than one rank, `optimizer_step_times` where it has a
    memory bandwidth; {} where neither (the iteration is then the pipeline)."""
    ranks, keys = training.data_parallel, {}
    reduces = ranks > 1 and device.dp_bandwidth_gbs is not None
    if reduces:
        collective = ring_reduce_scatter_ms if training.use_distributed_optimizer else ring_all_reduce_ms
        keys["grad_reduce_times"] = [collective(sum(layer.gradient_gb for layer in layers), ranks,
                                                device.dp_bandwidth_gbs, device.dp_latency_ms) for layers in stages]
    if device.memory_bandwidth_gbs is not None or (reduces and training.use_distributed_optimizer):
        keys["optimizer_step_times"] = [sum(_step_ms(device, training, stages[stage], reduces)
                                            for stage in device_stages) for device_stages in stages_of_device]
    return keys


def _step_ms(device: Device, training: Training, layers: Sequence[Layer], reduces: bool) -> float:
    """One stage's share of its device's step: the update at the memory bandwidth, then with the
    distributed optimizer the all-gather of its updated weights."""
    held = sum(layer.parameters_gb for layer in layers)
    update = 0.0 if device.memory_bandwidth_gbs is None else STEP_TRAFFIC * held / device.memory_bandwidth_gbs * 1e3
    if not (reduces and training.use_distributed_optimizer):
        return update
    weights = sum(layer.gradient_gb for layer in layers) * ELEMENT_BYTES[training.dtype] / training.gradient_bytes
    return update + ring_reduce_scatter_ms(weights, training.data_parallel, device.dp_bandwidth_gbs,
                                           device.dp_latency_ms)


def describe_ends(device: Device, training: Training) -> str | None:
    """What `ends_times` times, in one line for a plan's output; None where it times nothing (and
    says so where data parallelism is asked for without an interconnect to time it)."""
    ranks, parts = training.data_parallel, []
    if ranks > 1 and device.dp_bandwidth_gbs is not None:
        kind = "reduce-scattered (distributed optimizer)" if training.use_distributed_optimizer else "all-reduced"
        parts.append(f"gradients {kind} over {ranks} data-parallel ranks (ring, {device.dp_bandwidth_gbs:g} GB/s, "
                     f"{device.dp_latency_ms:g} ms per step)")
    elif ranks > 1:
        parts.append(f"gradient reduction over {ranks} ranks not timed (give device.dp_bandwidth)")
    if device.memory_bandwidth_gbs is not None:
        parts.append(f"optimizer step at {device.memory_bandwidth_gbs:g} GB/s of memory bandwidth")
    if ranks > 1 and device.dp_bandwidth_gbs is not None and training.use_distributed_optimizer:
        parts.append("the updated weights all-gathered after it")
    return None if not parts else "iteration ends: " + "; ".join(parts)
