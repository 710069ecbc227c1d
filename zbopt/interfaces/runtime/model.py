"""The models a run trains, and their gradients from one process: the reference a pipelined run
must reproduce. A run's model gives its stages' modules, an example of each stage's input and
output (torch's PipelineStage takes static shapes), the steps' inputs and targets, the loss and
the reference: `ToyModel`, zbopt's own MLP, and `CutModel`, a user's model cut at a plan's split."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

from zbopt.core.errors import ZboptError
from zbopt.interfaces.runtime.user_model import UserModel, as_arguments, chained_inputs, load_user_model

__all__ = ["CutModel", "ToyModel", "named_gradients"]


@dataclass(frozen=True)
class ToyModel:
    """The MLP a run trains: `num_stages` stages of `layers_per_stage` (Linear(hidden, hidden), Tanh).

    Weights come from `seed` (torch.manual_seed, then stage by stage), data from a generator seeded
    with `seed`: every rank and the single-process reference build exactly the same model and batches.
    Loss: mean squared error per microbatch; torch's schedule divides the summed microbatch gradients
    by the number of microbatches (scale_grads=True), so the reference uses the mean of the
    microbatch losses. With `replicas` data-parallel replicas, each runs the pipeline on its own
    share of a batch `replicas` times as large, and their gradients are averaged: the reference is
    the mean over every replica's microbatches.
    """

    num_stages: int
    num_microbatches: int
    microbatch_size: int = 8
    hidden: int = 128
    layers_per_stage: int = 2
    seed: int = 0
    replicas: int = 1

    def stage_modules(self) -> list:
        """One torch.nn.Sequential per stage, initialized from `seed` without touching the global RNG."""
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return [
                torch.nn.Sequential(
                    *(
                        layer
                        for _ in range(self.layers_per_stage)
                        for layer in (torch.nn.Linear(self.hidden, self.hidden), torch.nn.Tanh())
                    )
                )
                for _ in range(self.num_stages)
            ]

    def batches(self, steps: int) -> tuple[list[tuple], list]:
        """Per step, the first stage's arguments (one tensor of replicas * num_microbatches *
        microbatch_size rows of `hidden`: replica k runs its k-th share) and the target of the same shape."""
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        shape = (steps, self.replicas * self.num_microbatches * self.microbatch_size, self.hidden)
        inputs, targets = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        return [(step,) for step in inputs], list(targets)

    def stage_examples(self, stage: int) -> tuple[tuple, tuple]:
        """One microbatch's input and output of `stage` (zeros of their shapes): the first stage's
        input takes no gradient."""
        import torch

        shape = (self.microbatch_size, self.hidden)
        return (torch.zeros(shape, requires_grad=stage > 0),), (torch.zeros(shape, requires_grad=True),)

    @property
    def loss_fn(self):
        """Mean squared error of the last stage's output against the target."""
        import torch

        return torch.nn.functional.mse_loss

    def reference_gradients(self, steps: int) -> list[dict]:
        """Per step, every parameter's gradient ("stage{s}.{name}") from one process: the mean of
        the microbatch losses (every replica's), backpropagated through the whole model at once."""
        import torch

        modules = self.stage_modules()
        model = torch.nn.Sequential(*modules)
        inputs, targets = self.batches(steps)
        gradients = []
        for step in range(steps):
            model.zero_grad(set_to_none=True)
            losses = [
                torch.nn.functional.mse_loss(model(x), y)
                for x, y in zip(
                    inputs[step][0].tensor_split(self.replicas * self.num_microbatches),
                    targets[step].tensor_split(self.replicas * self.num_microbatches),
                    strict=True,
                )
            ]
            (sum(losses) / len(losses)).backward()
            gradients.append(named_gradients(modules, range(self.num_stages)))
        return gradients


def named_gradients(modules: list, stages) -> dict:
    """{"stage{s}.{name}": a copy of the gradient} of the parameters of `stages`: the names a
    rank's gradients and the reference's are matched by."""
    return {  # a replicated module's gradient is a DTensor: its full value
        f"stage{stage}.{name}": getattr(parameter.grad, "full_tensor", parameter.grad.detach)().detach().clone()
        for stage in stages
        for name, parameter in modules[stage].named_parameters()
        if parameter.grad is not None  # frozen: no gradient in the run nor in the reference
    }


@dataclass(frozen=True)
class CutModel:
    """A user's model (`spec`, `PACKAGE.MODULE:FACTORY`: see `user_model`) cut into virtual stages
    of consecutive layers, `split[s]` in stage s, for a run of `num_microbatches`.

    Every process (each rank, the reference) calls the factory after `torch.manual_seed(seed)`, so a
    factory whose weights come from torch's generator builds the same model in each. The batch is
    the factory's sample made different per microbatch and step (each floating tensor plus noise of
    its own scale, each integer tensor rolled along its last dimension), every argument split along
    its first dimension, as torch's schedule splits a batch. Loss: the factory's, of the last
    layer's output (torch's target is a placeholder); without one the mean square of each floating
    output, summed.
    Layers run in training mode: a layer drawing random numbers (dropout) cannot match the reference.
    """

    spec: str
    split: tuple[int, ...]
    num_microbatches: int
    seed: int = 0
    folder: str | None = None  # where the factory's module is found (default: the working folder)

    @property
    def num_stages(self) -> int:
        return len(self.split)

    def user(self) -> UserModel:
        """The factory's model, built from `seed` (the same object each call: copy before training)."""
        model = _built(self.spec, self.seed, self.folder)
        if sum(self.split) != len(model.layers) or min(self.split) < 1:
            raise ZboptError(f"model {self.spec!r} has {len(model.layers)} layers; the plan's split "
                             f"{list(self.split)} is for {sum(self.split)} (layers per stage, each at least 1)")
        return model

    def _bounds(self) -> list[tuple[int, int]]:
        ends = [sum(self.split[:stage + 1]) for stage in range(self.num_stages)]
        return [(end - count, end) for end, count in zip(ends, self.split, strict=True)]

    def stage_modules(self) -> list:
        """One module per stage running its layers in order (copies: each call trains its own)."""
        layers = copy.deepcopy(self.user().layers)
        return [_chain(layers[start:end]) for start, end in self._bounds()]

    def check(self) -> None:
        """Before any rank starts: the factory builds, the split fits its layers, the shapes chain."""
        self.user()
        _flows(self.spec, self.seed, self.folder)

    def stage_examples(self, stage: int) -> tuple[tuple, tuple]:
        """One microbatch's input and output of `stage`: the sample through the layers before it
        (floating tensors take a gradient, except the first stage's input)."""
        self.user()
        flows = _flows(self.spec, self.seed, self.folder)
        start, end = self._bounds()[stage]
        return _examples(flows[start], stage > 0), _examples(flows[end], True)

    def _microbatches(self, step: int) -> list[tuple]:
        """Step `step`'s microbatches: the sample, each made different (class docstring)."""
        import torch

        sample = self.user().sample
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        made = []
        for microbatch in range(self.num_microbatches):
            shift = step * self.num_microbatches + microbatch
            made.append(tuple(_varied(value, shift, generator) for value in sample))
        return made

    def batches(self, steps: int) -> tuple[list[tuple], list]:
        """Per step, the first stage's arguments (the microbatches joined along the first dimension)
        and a placeholder target (one zero per microbatch)."""
        import torch

        inputs = []
        for step in range(steps):
            microbatches = self._microbatches(step)
            inputs.append(tuple(torch.cat(parts) for parts in zip(*microbatches, strict=True)))
        return inputs, [torch.zeros(self.num_microbatches) for _ in range(steps)]

    @property
    def loss_fn(self):
        """torch's loss_fn(output, target): the factory's loss of the output, or its mean square."""
        loss = self.user().loss
        if loss is None:
            return lambda output, _target: sum(value.float().pow(2).mean() for value in as_arguments(output)
                                               if getattr(value, "is_floating_point", lambda: False)())
        return lambda output, _target: loss(*as_arguments(output))

    def reference_gradients(self, steps: int) -> list[dict]:
        """Per step, every parameter's gradient ("stage{s}.{name}") from one process: the mean of the
        microbatch losses over the whole model."""
        modules = self.stage_modules()
        whole = _chain(modules)
        loss = self.loss_fn
        gradients = []
        for step in range(steps):
            whole.zero_grad(set_to_none=True)
            losses = [loss(whole(*arguments), None) for arguments in self._microbatches(step)]
            (sum(losses) / self.num_microbatches).backward()
            gradients.append(named_gradients(modules, range(self.num_stages)))
        return gradients


@functools.lru_cache(maxsize=2)
def _flows(spec: str, seed: int, folder: str | None) -> list[tuple]:
    """The arguments flowing into each layer for the factory's sample, and out of the last: every
    stage's example is cut from them, one forward per process."""
    import torch

    model = _built(spec, seed, folder)
    flows = chained_inputs(model, f"model {spec!r}")
    with torch.no_grad():
        flows.append(as_arguments(model.layers[-1](*flows[-1])))
    return flows


def _examples(arguments: tuple, gradient: bool) -> tuple:
    """Zeros shaped as `arguments`, floating ones taking a gradient where `gradient`."""
    import torch

    return tuple(torch.zeros_like(value).requires_grad_(gradient and value.is_floating_point())
                 if isinstance(value, torch.Tensor) else value for value in arguments)


def _varied(value, shift: int, generator):
    """One argument of a microbatch: a floating tensor plus noise of its own scale, an integer one
    rolled by `shift` along its last dimension (ids stay valid), anything else as is."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point():
        scale = value.abs().mean().item() or 1.0
        return value + scale * torch.randn(value.shape, generator=generator).to(value.dtype)
    return torch.roll(value, shifts=shift, dims=-1) if value.dim() else value


@functools.cache
def _chain_class():
    """Layers run in order, each output the next one's arguments (a torch class, made on first use:
    torch is imported only where a run needs it)."""
    import torch

    class Chain(torch.nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = torch.nn.ModuleList(layers)

        def forward(self, *arguments):
            for layer in self.layers:
                arguments = as_arguments(layer(*arguments))
            return arguments[0] if len(arguments) == 1 else arguments

    return Chain


def _chain(layers):
    return _chain_class()(layers)


@functools.lru_cache(maxsize=2)
def _built(spec: str, seed: int, folder: str | None) -> UserModel:
    """The factory's model built from `seed`, once per process (a run asks for its parts many
    times); callers that train its layers take copies."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return load_user_model(spec, folder)
