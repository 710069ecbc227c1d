"""Measure a user's model layer by layer: the per-layer costs `plan` reads (a profile CSV).

Each layer runs alone from its own input (the sample through the layers before it), as the first
layer of a pipeline stage would, with torch.distributed.pipelining's own backward functions, so
that what is timed is what its runtime runs:
- F: the layer's forward (the last layer's includes the loss, which torch computes right after it);
- B: `stage_backward_input`, the input gradient (with what W needs kept aside);
- W: `stage_backward_weight`, the weight gradient from what B kept. A layer whose input takes no
  gradient (an embedding's token ids) runs its whole backward in W and B is 0, as torch does on a
  pipeline's first stage;
- activation memory (M_B): the bytes of the tensors autograd saves in the forward, parameters
  aside (`torch.autograd.graph.saved_tensors_hooks`), each storage once. A tensor two adjacent
  layers both save (a Tanh's output, the next Linear's input) is counted for each: the profile errs
  high, so a plan within the device memory stays within it. M_W is left to zbopt's rule (half);
- parameters: weights, their gradients and the optimizer's state, the state counted from one step
  of the optimizer on a copy of the layer (default Adam: two tensors per weight);
- a FLOP count of the forward (`torch.utils.flop_counter.FlopCounterMode`), to cross-check the times.
Times are medians over `repeats` after `warmup` untimed rounds, with the spread (interquartile range
over the median); on CUDA they are CUDA events, on CPU the wall clock with torch's threads as set
(`zbopt run-torch`'s CPU ranks run one thread each: set `torch.set_num_threads(1)` to profile alike).
torch runs a whole first stage's backward in W (its input takes no gradient): the profile shows
that only for a first layer whose input takes none, so a first stage of several layers is
predicted with its other layers' B apart.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zbopt.core.errors import ZboptError, described
from zbopt.interfaces.runtime.user_model import UserModel, as_arguments, chained_inputs, user_model
from zbopt.presentation.tables import aligned

__all__ = ["KINDS", "LayerCost", "ModelProfile", "format_profile", "profile_model", "profile_user_model"]

KINDS = ("forward", "backward", "weight")
GB = 1e9


@dataclass(frozen=True)
class LayerCost:
    """One layer's measured costs: times in ms (medians), memory in GB (10^9 bytes), `spread` per
    kind the interquartile range over the median, `forward_flops` the FLOPs torch counts."""

    name: str
    forward_ms: float
    backward_ms: float
    weight_ms: float
    activation_gb: float
    parameters_gb: float
    forward_flops: int
    spread: dict
    gradient_gb: float  # what a data-parallel reduction of the layer's gradients moves

    def profile_row(self) -> dict:
        """The row of the profile CSV `plan` reads (zbopt.planning.model.profile's columns)."""
        from zbopt.planning.model.profile import COLUMNS

        return {column: getattr(self, column) for column in (*COLUMNS, "gradient_gb")}


@dataclass(frozen=True)
class ModelProfile:
    """Every layer's costs in order, and how they were measured."""

    layers: tuple[LayerCost, ...]
    device: str
    repeats: int
    warmup: int
    optimizer: str


def profile_model(layers, sample, loss: Callable | None = None, *, fqns: Sequence[str] | None = None,
                  repeats: int = 10, warmup: int = 3, optimizer: Callable | str | None = "adam",
                  device=None) -> ModelProfile:
    """Measure every layer of a user's model (module docstring).

    Parameters
    ----------
    layers : an nn.Sequential, a list of modules, a mapping FQN -> module, or (with `fqns`) the model.
    sample : one microbatch's input to the first layer (a tensor or a tuple of arguments).
    loss : a function of the last layer's output returning a scalar; None: a random output gradient.
    fqns : the FQNs of the model's layers, in order, when `layers` is the whole model.
    repeats, warmup : timed and untimed rounds per layer.
    optimizer : "adam" (torch.optim.Adam), "sgd" (no state), or a function params -> optimizer.
    device : where to run (default: where the layers' parameters are; CPU without any).

    Returns
    -------
    ModelProfile : `.layers` in order; `profile_text([c.profile_row() for c in profile.layers])`
        (zbopt.planning.model.profile) is the CSV `plan` reads.

    Raises
    ------
    ZboptError : layers of the wrong kind, none, or whose shapes do not chain; repeats below 1.
    """
    return profile_user_model(user_model(layers, sample, loss, fqns=fqns), repeats=repeats, warmup=warmup,
                              optimizer=optimizer, device=device)


def profile_user_model(model: UserModel, *, repeats: int = 10, warmup: int = 3,
                       optimizer: Callable | str | None = "adam", device=None,
                       where: str = "profile_model") -> ModelProfile:
    """`profile_model` on a `UserModel` (what the command line's factory gives)."""

    if not (isinstance(repeats, int) and repeats >= 1 and isinstance(warmup, int) and warmup >= 0):
        raise ZboptError(f"{where}: repeats = {repeats!r}, warmup = {warmup!r}: expected whole numbers, repeats >= 1")
    make_optimizer, optimizer_name = _optimizer(optimizer, where)
    device = _device(device, where) if device is not None else _device_of(model)
    model = UserModel(model.names, tuple(layer.to(device) for layer in model.layers),
                      tuple(_to(value, device) for value in model.sample), model.loss, model.source)
    inputs = chained_inputs(model, where)
    costs = []
    last = len(model.layers) - 1
    for index, (name, layer, arguments) in enumerate(zip(model.names, model.layers, inputs, strict=True)):
        loss = model.loss if index == last else None
        try:
            samples = _timed_rounds(layer, arguments, loss, repeats, warmup, device)
            activation, flops = _forward_memory_and_flops(layer, arguments, loss)
        except Exception as error:  # the user's layer: its failure in one line, naming it
            raise ZboptError(f"{where}: layer {name!r} failed while profiled: {described(error)}") from None
        spread = {kind: _spread(samples[kind]) for kind in KINDS}
        held, gradients = _parameter_bytes(layer, make_optimizer)
        costs.append(LayerCost(name, *(statistics.median(samples[kind]) for kind in KINDS), activation / GB,
                               held / GB, flops, spread, gradients / GB))
    return ModelProfile(tuple(costs), str(device), repeats, warmup, optimizer_name)


def _optimizer(optimizer, where: str) -> tuple[Callable | None, str]:
    """(a function params -> torch optimizer, or None for no state, its name)."""
    import torch

    if optimizer == "adam":
        return torch.optim.Adam, "Adam"
    if optimizer == "sgd":
        return None, "SGD (no state)"
    if callable(optimizer):
        return optimizer, getattr(optimizer, "__name__", type(optimizer).__name__)
    raise ZboptError(f"{where}: optimizer = {optimizer!r}: expected 'adam', 'sgd' or a function params -> optimizer")


def _device(name, where: str):
    """torch's device of that name, where this torch can run on it."""
    import torch

    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:  # an unknown name; CUDA on a CPU-only torch
        raise ZboptError(f"{where}: device {name!r}: {described(error)}") from None
    return device


def _device_of(model: UserModel):
    import torch

    for layer in model.layers:
        for parameter in layer.parameters():
            return parameter.device
    return torch.device("cpu")


def _to(value, device):
    return value.to(device) if hasattr(value, "to") else value


def _leaves(arguments: tuple) -> tuple:
    """The layer's arguments as fresh leaves: floating tensors take a gradient (B computes it)."""
    return tuple(value.detach().requires_grad_(value.is_floating_point()) if hasattr(value, "detach") else value
                 for value in arguments)


def _outputs(output, loss) -> list:
    """What the backward starts from: the loss, or every output tensor that takes a gradient."""
    if loss is not None:
        return [loss(*as_arguments(output))]
    return [value for value in as_arguments(output) if hasattr(value, "requires_grad") and value.requires_grad]


def _gradients(outputs: list, loss) -> list | None:
    """The outputs' gradients: none for a loss, else random ones of their shapes."""
    return None if loss is not None else [value.detach().clone().normal_() for value in outputs]


def _timed_rounds(layer, arguments: tuple, loss, repeats: int, warmup: int, device) -> dict[str, list[float]]:
    """Per kind (F, B, W), the milliseconds of each timed round."""
    from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

    clock = _Clock(device)
    samples = {kind: [] for kind in KINDS}
    for round_number in range(warmup + repeats):
        layer.zero_grad(set_to_none=True)
        leaves = _leaves(arguments)
        tensors = [value for value in leaves if hasattr(value, "requires_grad") and value.requires_grad]
        clock.start()
        outputs = _outputs(layer(*leaves), loss)
        times = {"forward": clock.stop()}
        gradients = _gradients(outputs, loss)
        if not outputs:  # nothing takes a gradient: no backward
            times.update(backward=0.0, weight=0.0)
        elif tensors:
            clock.start()
            _, groups = stage_backward_input(outputs, gradients, list(leaves), layer.parameters())
            times["backward"] = clock.stop()
            clock.start()
            stage_backward_weight(layer.parameters(), groups)
            times["weight"] = clock.stop()
        else:  # torch's first stage: its W is the whole backward
            clock.start()
            stage_backward(outputs, gradients, list(leaves))
            times.update(backward=0.0, weight=clock.stop())
        if round_number >= warmup:
            for kind in KINDS:
                samples[kind].append(times[kind])
    layer.zero_grad(set_to_none=True)
    return samples


def _forward_memory_and_flops(layer, arguments: tuple, loss) -> tuple[int, int]:
    """(bytes autograd saves in one forward, each storage once and parameters aside; its FLOPs)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    parameters = {parameter.untyped_storage().data_ptr() for parameter in layer.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    counter = FlopCounterMode(display=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), counter:
        outputs = _outputs(layer(*_leaves(arguments)), loss)
    del outputs
    return sum(saved.values()), counter.get_total_flops()


def _parameter_bytes(layer, make_optimizer) -> tuple[int, int]:
    """(the layer's weights, their gradients and its optimizer's state after one step (on a copy),
    the gradients alone)."""
    import torch

    trained = [parameter for parameter in layer.parameters() if parameter.requires_grad]
    weights = sum(parameter.numel() * parameter.element_size() for parameter in layer.parameters())
    gradients = sum(parameter.numel() * parameter.element_size() for parameter in trained)
    if make_optimizer is None or not trained:
        return weights + gradients, gradients
    copied = [parameter for parameter in copy.deepcopy(layer).parameters() if parameter.requires_grad]
    for parameter in copied:
        parameter.grad = torch.zeros_like(parameter)
    stepped = make_optimizer(copied)
    stepped.step()
    state = sum(value.numel() * value.element_size() for entry in stepped.state.values()
                for value in entry.values() if isinstance(value, torch.Tensor) and value.dim() > 0)
    return weights + gradients + state, gradients


def _spread(values: list[float]) -> float:
    """The interquartile range over the median (0 with fewer than two values or a zero median)."""
    middle = statistics.median(values)
    if len(values) < 2 or middle <= 0:
        return 0.0
    low, _, high = statistics.quantiles(values, n=4)
    return (high - low) / middle


def format_profile(profile: ModelProfile) -> str:
    """One line per layer: F, B, W (ms, median, with their spread), M_B and parameters (MB), the
    forward's GFLOP and the rate it ran at; then how it was measured."""
    header = ("layer", "F (ms)", "B (ms)", "W (ms)", "M_B (MB)", "parameters (MB)", "F GFLOP", "F GFLOP/s")
    rows = [header]
    for cost in profile.layers:
        times = [f"{getattr(cost, kind + '_ms'):.4g} ±{cost.spread[kind]:.0%}" for kind in KINDS]
        rate = cost.forward_flops / 1e9 / (cost.forward_ms / 1e3) if cost.forward_ms > 0 else 0.0
        rows.append((cost.name, *times, f"{cost.activation_gb * 1e3:.4g}", f"{cost.parameters_gb * 1e3:.4g}",
                     f"{cost.forward_flops / 1e9:.4g}", f"{rate:.4g}"))
    lines = aligned(rows)
    lines.append(f"(per microbatch, on {profile.device}: medians of {profile.repeats} rounds after {profile.warmup} "
                 f"untimed, ± the interquartile range over the median; parameters with gradients and "
                 f"{profile.optimizer}'s state; MB = 10^6 bytes)")
    return "\n".join(lines)


class _Clock:
    """Milliseconds between `start` and `stop`: CUDA events on a CUDA device (the work is queued,
    not done, when the call returns), the wall clock on CPU."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch
        self.began = 0.0

    def start(self) -> None:
        if self.cuda:
            self.began = self.torch.cuda.Event(enable_timing=True)
            self.began.record()
        else:
            self.began = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            ended = self.torch.cuda.Event(enable_timing=True)
            ended.record()
            ended.synchronize()
            return self.began.elapsed_time(ended)
        return (time.perf_counter() - self.began) * 1e3
