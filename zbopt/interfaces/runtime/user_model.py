"""A user's own torch model, as zbopt's torch commands take it: its layers in order, each with the
name torch knows it by (its fully qualified name, FQN), one microbatch's input and the loss.

From the command line a model is `PACKAGE.MODULE:FACTORY`, a function of no arguments (imported
with the working folder on the path, as `python -m` would) returning `(layers, sample)` or
`(layers, sample, loss)`:
- `layers`: an `nn.Sequential` (its children, named as it names them), a list or `nn.ModuleList`
  of modules (named "0", "1", ...), or a mapping FQN -> module in order (e.g. a model's
  `{"tok_embeddings": m.tok_embeddings, "layers.0": m.layers[0], ..., "output": m.output}`);
- `sample`: one microbatch's input to the first layer (a tensor, or a tuple of arguments); each
  layer's output is the next one's input (a tuple is passed as several arguments);
- `loss`: a function of the last layer's output returning a scalar (default: none; the backward
  then starts from a random gradient of the output's shape).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from zbopt.core.errors import ZboptError, described

__all__ = ["UserModel", "as_arguments", "chained_inputs", "load_user_model", "user_model"]


@dataclass(frozen=True)
class UserModel:
    """The layers in order with their FQNs, one microbatch's input (as arguments), the loss, and
    the file of the module that made them (a command writes no output over it)."""

    names: tuple[str, ...]
    layers: tuple  # torch.nn.Module each
    sample: tuple
    loss: Callable | None = None
    source: str | None = None


def as_arguments(value) -> tuple:
    """A layer's output (or a sample) as the next layer's arguments: a tuple as is, else one."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def user_model(layers, sample, loss: Callable | None = None, *, fqns: Sequence[str] | None = None,
               where: str = "profile_model") -> UserModel:
    """The `UserModel` of the module docstring's forms; with `fqns`, `layers` is the whole model and
    the layers are its submodules of those names, in that order. Raises ZboptError naming `where`."""
    import torch

    if fqns is not None:
        if not isinstance(layers, torch.nn.Module):
            raise ZboptError(f"{where}: with fqns, layers must be the model (an nn.Module), "
                             f"got {type(layers).__name__}")
        pairs = []
        for name in fqns:
            try:
                pairs.append((name, layers.get_submodule(name)))
            except AttributeError as error:
                raise ZboptError(f"{where}: fqns: {name!r} is not a submodule of the model ({error})") from None
    elif isinstance(layers, torch.nn.Sequential):
        pairs = list(layers.named_children())
    elif isinstance(layers, Mapping):
        pairs = list(layers.items())
    elif isinstance(layers, (list, tuple, torch.nn.ModuleList)):
        pairs = [(str(index), layer) for index, layer in enumerate(layers)]
    else:
        raise ZboptError(f"{where}: layers: expected an nn.Sequential, a list of modules or a mapping "
                         f"FQN -> module, got {type(layers).__name__}")
    if not pairs:
        raise ZboptError(f"{where}: no layers (the model has nothing to profile or split)")
    for name, layer in pairs:
        if not isinstance(layer, torch.nn.Module):
            raise ZboptError(f"{where}: layer {name!r} is a {type(layer).__name__}, not an nn.Module")
    if loss is not None and not callable(loss):
        raise ZboptError(f"{where}: loss: expected a function of the last layer's output, got {type(loss).__name__}")
    return UserModel(tuple(str(name) for name, _ in pairs), tuple(layer for _, layer in pairs),
                     as_arguments(sample), loss)


def load_user_model(spec: str, folder: str | None = None) -> UserModel:
    """The model `PACKAGE.MODULE:FACTORY` names (module docstring), its module looked for first in
    `folder` (default: the working folder, as `python -m` does; a run's ranks start elsewhere).
    Raises ZboptError, one line naming `spec`, for a module that does not import, a missing
    factory, or what it returns."""
    module_name, _, factory_name = spec.partition(":")
    if not module_name or not factory_name:
        raise ZboptError(f"model {spec!r}: expected PACKAGE.MODULE:FACTORY (a function returning the layers "
                         "and one microbatch's input)")
    folder = os.path.abspath(folder if folder is not None else os.getcwd())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's code: any error is theirs to see, in one line
        raise ZboptError(f"model {spec!r}: cannot import {module_name}: {described(error)}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ZboptError(f"model {spec!r}: {module_name} has no function {factory_name!r}")
    try:
        made = factory()
    except Exception as error:
        raise ZboptError(f"model {spec!r}: {factory_name}() failed: {described(error)}") from None
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise ZboptError(f"model {spec!r}: {factory_name}() must return (layers, sample) or (layers, sample, loss), "
                         f"got {type(made).__name__}")
    made = user_model(*made, where=f"model {spec!r}")
    return UserModel(made.names, made.layers, made.sample, made.loss, getattr(module, "__file__", None))


def chained_inputs(model: UserModel, where: str) -> list[tuple]:
    """Each layer's input arguments for the model's sample (detached: each layer is timed from its
    own leaf), from one forward without gradients. Raises ZboptError naming the layer whose input
    does not fit (the layers' shapes do not chain)."""
    import torch

    inputs, current = [], model.sample
    with torch.no_grad():
        for name, layer in zip(model.names, model.layers, strict=True):
            inputs.append(tuple(value.detach() if isinstance(value, torch.Tensor) else value for value in current))
            try:
                current = as_arguments(layer(*current))
            except Exception as error:
                raise ZboptError(f"{where}: layer {name!r} does not take its input ({_shapes(current)}): "
                                 f"{described(error)}") from None
    if model.loss is not None:
        try:
            value = model.loss(*current)
        except Exception as error:
            raise ZboptError(f"{where}: the loss does not take the last layer's output ({_shapes(current)}): "
                             f"{described(error)}") from None
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ZboptError(f"{where}: the loss must return a scalar tensor, got {_shapes((value,))}")
    return inputs


def _shapes(arguments: tuple) -> str:
    """The arguments' shapes as "tensor (8, 64), int" for a message."""
    return ", ".join(f"tensor {tuple(value.shape)}" if hasattr(value, "shape") else type(value).__name__
                     for value in arguments)
