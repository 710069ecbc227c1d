"""A model: its layers in order, each with its costs per microbatch, repeats expanded.

Layers are what a split puts on stages: a split of a Model assigns contiguous runs of `layers`
to virtual stages and sums their costs. `groups` keeps the spelling the user gave ("decoder × 32")
for output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from zbopt.core.errors import ZboptError, shorten
from zbopt.io.read import read_data
from zbopt.planning.model.architecture import Architecture
from zbopt.planning.model.config import model_layers, model_training, profile_path
from zbopt.planning.model.flops import DEFAULT_TRAINING, Training, architecture_layers
from zbopt.planning.model.parts import Device, Layer
from zbopt.planning.model.profile import read_profile

__all__ = ["FILE_KEYS", "Model", "load_model", "model_files"]

FILE_KEYS = ("model", "device")


@dataclass(frozen=True)
class Model:
    """Ordered layers (a repeated layer appears once per repeat) and the groups they were written
    in: (name, repeat) pairs, consecutive equal layers by default; how it is trained (`training`:
    the data-parallel group its gradients are reduced over, the distributed optimizer)."""

    layers: tuple[Layer, ...]
    groups: tuple[tuple[str, int], ...] = ()
    training: Training = DEFAULT_TRAINING

    def __post_init__(self):
        layers = tuple(self.layers)
        if not layers or not all(isinstance(layer, Layer) for layer in layers):
            raise ZboptError(f"model layers = {shorten(self.layers)}: expected a non-empty sequence of Layer")
        groups = tuple((name, count) for name, count in self.groups) or tuple(
            (key.name, len(list(run))) for key, run in groupby(layers))
        start = 0
        for name, count in groups:
            if count < 1 or any(layer.name != name for layer in layers[start:start + count]):
                raise ZboptError(f"model groups: ({name!r}, {count}) does not match layers "
                                 f"{start}..{start + count - 1}")
            start += count
        if start != len(layers):
            raise ZboptError(f"model groups cover {start} layers, the model has {len(layers)}")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "groups", groups)

    @classmethod
    def from_repeats(cls, pairs: Iterable[tuple[Layer, int]], training: Training = DEFAULT_TRAINING) -> Model:
        """A model from (layer, repeat) pairs in order: each layer repeated in place."""
        pairs = list(pairs)
        return cls(tuple(layer for layer, repeat in pairs for _ in range(repeat)),
                   tuple((layer.name, repeat) for layer, repeat in pairs), training)

    @classmethod
    def from_config(cls, section: object, device: Device | None = None, base: str | Path | None = None) -> Model:
        """The `model:` section of a config (units written out: "1.7 ms", "0.8 GB"). `device` gives
        the FLOP/s that costs from an architecture need; `base`, the folder of a relative profile."""
        return cls.from_repeats(model_layers(section, device, base=base), model_training(section))

    @classmethod
    def from_architecture(cls, architecture: Architecture | Mapping, device: Device, dtype: str = "bf16",
                          data_parallel: int = 1, use_distributed_optimizer: bool = False,
                          fsdp: bool = False) -> Model:
        """Embedding, decoder × num_layers and lm_head, their costs counted from the shape (Megatron-LM
        argument names) at `device.flops`; see `zbopt.planning.model.flops` for each formula."""
        if not isinstance(architecture, Architecture):
            architecture = Architecture.from_config(dict(architecture))
        training = Training(dtype, data_parallel, use_distributed_optimizer, fsdp)
        return cls.from_repeats(architecture_layers(architecture, device, training), training)

    @classmethod
    def from_profile(cls, path: str | Path) -> Model:
        """Measured layers from a CSV, YAML or JSON profile (`zbopt.planning.model.profile`)."""
        return cls.from_repeats(read_profile(path))

    @property
    def labels(self) -> tuple[str, ...]:
        """Each layer's name, numbered from 0 where the name occurs more than once: ("embedding",
        "decoder 0", ..., "decoder 31", "lm_head")."""
        counts = Counter(layer.name for layer in self.layers)
        seen: Counter = Counter()
        labels = []
        for layer in self.layers:
            labels.append(f"{layer.name} {seen[layer.name]}" if counts[layer.name] > 1 else layer.name)
            seen[layer.name] += 1
        return tuple(labels)

    def group_rows(self) -> list[dict]:
        """One dict per group, as written: the layer's values (`Layer.to_dict`) and its repeat."""
        rows, start = [], 0
        for _, count in self.groups:
            rows.append({**self.layers[start].to_dict(), "repeat": count})
            start += count
        return rows


def load_model(path: str | Path, data_parallel: int | None = None) -> tuple[Model, Device]:
    """A model file: {model: ..., device: ...} in YAML or JSON, read through `zbopt.io.read`'s
    limits; a relative profile path is taken from the file's folder. `data_parallel` (a caller's
    flag) is the model's data-parallel size where the file gives none; a file that gives another
    is refused.

    Parameters
    ----------
    path : the model file (`examples/model_*.yaml`; see docs/planning.md for its keys).

    Returns
    -------
    (Model, Device) : the layers in order (repeats expanded, times in ms, memory in GB), and the
        device they run on.

    Raises
    ------
    ZboptError : naming the file and the key for every mistake.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.yaml"
    >>> _ = path.write_text("{model: {layers: [{name: decoder, forward: 1.5 ms, backward: 3 ms, activation: 2 GB, "
    ...                     "parameters: 1 GB, repeat: 4}]}, device: {memory: 80 GB}}")
    >>> model, device = load_model(path)
    >>> model.labels, device.memory_gb
    (('decoder 0', 'decoder 1', 'decoder 2', 'decoder 3'), 80.0)
    """
    data = read_data(path, "model file")
    where = f"model file '{path}'"
    if not isinstance(data, dict):
        raise ZboptError(f"{where}: expected a mapping with keys model and device")
    unknown = [key for key in data if key not in FILE_KEYS]
    if unknown:
        raise ZboptError(f"{where}: unknown key {shorten(unknown[0])} (known: {', '.join(FILE_KEYS)})")
    if "model" not in data:
        raise ZboptError(f"{where}: missing key model")
    section = data["model"]
    if data_parallel is not None and isinstance(section, dict):
        given = section.get("data_parallel", data_parallel)
        if isinstance(given, bool) or given != data_parallel:
            raise ZboptError(f"{path}: model.data_parallel = {shorten(given)}, but {data_parallel} asked for: "
                             "give one")
        section = {**section, "data_parallel": data_parallel}
    try:
        device = Device.from_config(data.get("device"))
        return Model.from_config(section, device, base=Path(path).parent), device
    except ZboptError as error:
        raise ZboptError(f"{path}: {error}") from None


def model_files(path: str | Path) -> dict[str, str]:
    """The files reading the model file `path` reads (what they are -> path): the file itself and
    the profile it names, if any; a command's outputs must be none of them. Call after
    `load_model` has accepted the file."""
    files = {"the model file": str(path)}
    section = read_data(path, "model file").get("model")
    if isinstance(section, dict) and "profile" in section:
        files["the profile the model file names"] = str(profile_path(section["profile"], "model.profile",
                                                                     Path(path).parent))
    return files
