"""A split: the model's layers cut into p·v contiguous virtual stages, and the Problem it makes.

A split is a tuple of layer counts, one per virtual stage in model order (ends such as the
embedding and the LM head count as layers). Virtual stage s runs on device `stage_device(s)`
of the placement (loop: s mod p; V: device 0 holds stages 0 and 2p-1). The Problem of a split
sums its layers per stage: F, B, W times in ms, activation memory M_B and M_W in GB; each
device's activation limit is its memory less the parameters of the layers it holds (weights,
gradients, optimizer state: what stays all step long).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zbopt.core.errors import ProblemError, ZboptError
from zbopt.core.placement import stage_device
from zbopt.core.problem import Problem
from zbopt.planning.model import Device, Model
from zbopt.planning.model.collectives import ends_times

__all__ = ["Pipeline", "Split", "activation_limits", "check_split", "check_stages", "device_parameters",
           "split_problem", "splits_backward", "stage_layers", "stage_names"]

Split = tuple[int, ...]


@dataclass(frozen=True)
class Pipeline:
    """How the model runs: devices, chunks per device, placement and microbatches per step."""

    num_devices: int
    chunks_per_device: int = 1
    placement: str = "loop"
    num_microbatches: int = 8

    def __post_init__(self):
        """Refuse what no Problem could hold, naming the parameter (devices, chunks, placement, m),
        and the bidirectional placement, whose microbatches take half the stages each (a split of
        one model over both directions is not what a plan chooses)."""
        if self.placement not in ("loop", "v"):
            raise ZboptError(f"pipeline placement {self.placement!r}: a plan splits the model over 'loop' or 'v'")
        Problem(num_devices=self.num_devices, num_microbatches=self.num_microbatches,
                chunks_per_device=self.chunks_per_device, placement=self.placement)

    @property
    def num_stages(self) -> int:
        return self.num_devices * self.chunks_per_device

    def device_of(self, stage: int) -> int:
        return stage_device(stage, self.num_devices, self.placement)

    def stages_on(self, device: int) -> list[int]:
        return [stage for stage in range(self.num_stages) if self.device_of(stage) == device]


def check_stages(model: Model, num_devices: int, chunks_per_device: int) -> None:
    """One line where the devices' chunks make more virtual stages than the model has layers (a
    plan's first check: before a pipeline is built, whose defaults could be blamed instead)."""
    if num_devices * chunks_per_device > len(model.layers):
        raise ZboptError(f"plan: {num_devices} devices x {chunks_per_device} chunks make "
                         f"{num_devices * chunks_per_device} virtual stages, more than the model's "
                         f"{len(model.layers)} layers")


def check_split(model: Model, pipeline: Pipeline, split: Sequence[int]) -> Split:
    """`split` as a tuple, refused in one line unless it has one positive count per virtual stage
    and covers the model's layers exactly."""
    split = tuple(split)
    if len(split) != pipeline.num_stages:
        raise ZboptError(f"split {list(split)}: {len(split)} stages, the pipeline has {pipeline.num_stages} "
                         f"({pipeline.num_devices} devices x {pipeline.chunks_per_device} chunks)")
    if any(isinstance(count, bool) or not isinstance(count, int) or count < 1 for count in split):
        raise ZboptError(f"split {list(split)}: every virtual stage needs a whole number of layers, at least 1")
    if sum(split) != len(model.layers):
        raise ZboptError(f"split {list(split)}: covers {sum(split)} layers, the model has {len(model.layers)}")
    return split


def splits_backward(model: Model) -> bool:
    """Whether the model's layers give B and W apart; a ZboptError when some do and some do not
    (one Problem has one backward kind)."""
    fused = {layer.fused for layer in model.layers}
    if len(fused) > 1:
        raise ZboptError("model: some layers give a weight time and some do not; give W for all or for none")
    return not fused.pop()


def stage_layers(split: Split) -> list[range]:
    """The layer indices of each virtual stage."""
    bounds, start = [], 0
    for count in split:
        bounds.append(range(start, start + count))
        start += count
    return bounds


def device_parameters(model: Model, pipeline: Pipeline, split: Split) -> list[float]:
    """Per device, the GB its layers hold all step long (parameters, gradients, optimizer state)."""
    held = [0.0] * pipeline.num_devices
    for stage, layers in enumerate(stage_layers(split)):
        held[pipeline.device_of(stage)] += sum(model.layers[index].parameters_gb for index in layers)
    return held


def split_problem(model: Model, device: Device, pipeline: Pipeline, split: Sequence[int]) -> Problem:
    """The Problem of `split`: per-stage sums of the layers' times (ms) and activations (GB); each
    device's memory limit is `device.usable_gb` less its parameters (no limit without a device
    memory); the iteration's ends where the device and the training time them (`collectives`).
    A ZboptError in one line names the device whose parameters alone do not fit, or a stage whose
    layers take no time (zbopt's Problem needs every F, B and W time above 0)."""
    split = check_split(model, pipeline, split)
    split_backward = splits_backward(model)
    sums = {key: [] for key in ("forward", "backward", "weight", "activation", "kept")}
    for stage, layers in enumerate(stage_layers(split)):
        chosen = [model.layers[index] for index in layers]
        for key, field in (("forward", "forward_ms"), ("backward", "backward_ms"), ("weight", "weight_ms"),
                           ("activation", "activation_gb"), ("kept", "weight_activation_gb")):
            if key in ("weight", "kept") and not split_backward:
                continue
            sums[key].append(sum(getattr(layer, field) for layer in chosen))
        for key in ("forward", "backward", "weight") if split_backward else ("forward", "backward"):
            if sums[key][-1] <= 0:
                raise ZboptError(f"split {list(split)}: virtual stage {stage} ({_names(model, layers)}) has no "
                                 f"{key} time; give it another layer")
    limits = activation_limits(model, device, pipeline, split)
    ends = ends_times(device, model.training,
                      [[model.layers[index] for index in layers] for layers in stage_layers(split)],
                      [pipeline.stages_on(each) for each in range(pipeline.num_devices)])
    try:
        return Problem(num_devices=pipeline.num_devices, num_microbatches=pipeline.num_microbatches,
                       chunks_per_device=pipeline.chunks_per_device, placement=pipeline.placement,
                       forward_times=sums["forward"], backward_times=sums["backward"],
                       weight_times=sums["weight"] if split_backward else None, p2p_time=device.p2p_ms,
                       activation_memory=sums["activation"], weight_memory=sums["kept"] if split_backward else None,
                       memory_limit=limits, **ends)
    except ProblemError as error:
        if error.key != "memory_limit":
            raise
        raise ZboptError(f"split {list(split)}: {error.value:.3g} GB left for activations after the parameters; "
                         f"{error.reason} (GB)") from None


def activation_limits(model: Model, device: Device, pipeline: Pipeline, split: Split) -> list[float] | None:
    """Per device, the GB left for activations: the device's usable memory (less the reserve) less
    its parameters; a ZboptError naming the first device whose parameters alone fill it."""
    usable = device.usable_gb
    if usable is None:
        return None
    limits = []
    for index, held in enumerate(device_parameters(model, pipeline, split)):
        if held >= usable:
            memory = f"{device.memory_gb:.3g} GB" + (f" less a reserve of {device.reserve:.3g} GB = {usable:.3g} GB"
                                                     if device.reserve else "")
            raise ZboptError(f"split {list(split)}: device {index} holds {held:.3g} GB of parameters, gradients "
                             f"and optimizer state, not less than its memory {memory}")
        limits.append(usable - held)
    return limits


def stage_names(model: Model, split: Split) -> list[str]:
    """Each virtual stage's layers as the model names them: "embedding, decoder 0-7"."""
    return [_names(model, layers) for layers in stage_layers(split)]


def _names(model: Model, layers: range) -> str:
    """The layers' labels, runs of one repeated layer shortened: "decoder 0-7"."""
    every = model.labels  # a property that counts the names: once, not once per layer
    labels = [every[index] for index in layers]
    parts: list[list[str]] = []
    for label in labels:
        base = label.rsplit(" ", 1)[0] if label[-1:].isdigit() and " " in label else None
        if parts and base is not None and parts[-1][0].rsplit(" ", 1)[0] == base:
            parts[-1].append(label)
        else:
            parts.append([label])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1].rsplit(' ', 1)[1]}" for run in parts)
