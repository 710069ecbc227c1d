"""The toy model a run trains, and its gradients from one process: the reference a pipelined
run must reproduce."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ToyModel", "named_gradients"]


@dataclass(frozen=True)
class ToyModel:
    """The MLP a run trains: `num_stages` stages of `layers_per_stage` (Linear(hidden, hidden), Tanh).

    Weights come from `seed` (torch.manual_seed, then stage by stage), data from a generator seeded
    with `seed`: every rank and the single-process reference build exactly the same model and batches.
    Loss: mean squared error per microbatch; torch's schedule divides the summed microbatch gradients
    by the number of microbatches (scale_grads=True), so the reference uses the mean of the
    microbatch losses.
    """

    num_stages: int
    num_microbatches: int
    microbatch_size: int = 8
    hidden: int = 128
    layers_per_stage: int = 2
    seed: int = 0

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

    def batches(self, steps: int) -> tuple:
        """Inputs and targets, each of shape (steps, num_microbatches * microbatch_size, hidden)."""
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        shape = (steps, self.num_microbatches * self.microbatch_size, self.hidden)
        return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)

    def reference_gradients(self, steps: int) -> list[dict]:
        """Per step, every parameter's gradient ("stage{s}.{name}") from one process: the mean of
        the microbatch losses, backpropagated through the whole model at once."""
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
                    inputs[step].tensor_split(self.num_microbatches),
                    targets[step].tensor_split(self.num_microbatches),
                    strict=True,
                )
            ]
            (sum(losses) / self.num_microbatches).backward()
            gradients.append(named_gradients(modules, range(self.num_stages)))
        return gradients


def named_gradients(modules: list, stages) -> dict:
    """{"stage{s}.{name}": a copy of the gradient} of the parameters of `stages`: the names a
    rank's gradients and the reference's are matched by."""
    return {
        f"stage{stage}.{name}": parameter.grad.detach().clone()
        for stage in stages
        for name, parameter in modules[stage].named_parameters()
    }
