"""The `model:` section of a config, read into (Layer, repeat) pairs: units converted here, once.

Three ways to give the layers, exactly one per model:

    model: {layers: [{name: decoder, repeat: 32, forward: 1.7 ms, ...}, ...]}
    model: {profile: layers.csv}                  # measured, units in the column names
    model: {architecture: {num_layers: 32, ...}}  # or {preset: llama-3-8b}, with a device's flops
"""

from __future__ import annotations

from pathlib import Path

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.units import parse_memory, parse_time
from zbopt.planning.model.architecture import Architecture
from zbopt.planning.model.flops import Training, architecture_layers
from zbopt.planning.model.parts import Device, Layer, check_repeat
from zbopt.planning.model.presets import preset
from zbopt.planning.model.profile import read_profile

__all__ = ["LAYER_KEYS", "MODEL_KEYS", "REQUIRED_LAYER_KEYS", "SOURCES", "TRAINING_KEYS", "model_layers",
           "model_training", "profile_path", "spelled_layers"]

SOURCES = ("layers", "profile", "architecture", "preset")
TRAINING_KEYS = ("dtype", "data_parallel", "use_distributed_optimizer", "fsdp")
MODEL_KEYS = SOURCES + TRAINING_KEYS
LAYER_KEYS = ("name", "repeat", "forward", "backward", "weight", "activation", "weight_activation", "parameters",
              "gradient")
REQUIRED_LAYER_KEYS = ("name", "forward", "backward", "activation", "parameters")


def model_layers(section: object, device: Device | None = None, where: str = "model",
                 base: str | Path | None = None) -> list[tuple[Layer, int]]:
    """The (layer, repeat) pairs a `model:` section describes, in model order. `base` is the
    folder a relative profile path is read from (the config file's)."""
    if not isinstance(section, dict):
        raise ZboptError(f"{where} = {shorten(section)}: expected a mapping with one of {', '.join(SOURCES)}")
    unknown = [key for key in section if key not in MODEL_KEYS]
    if unknown:
        raise ZboptError(f"{where}: unknown key {shorten(unknown[0])} (known: {', '.join(MODEL_KEYS)})")
    given = [key for key in SOURCES if key in section]
    if "preset" in given and "architecture" in given:
        given.remove("architecture")  # the preset's arguments, overridden by the architecture's
    if len(given) != 1:
        raise ZboptError(f"{where}: give exactly one of layers, profile, architecture (or preset), "
                         f"not {' and '.join(given) or 'none'}")
    if given[0] in ("layers", "profile") and "dtype" in section:
        raise ZboptError(f"{where}.dtype: applies to costs from an architecture only, not to {given[0]}")
    if given[0] == "layers":
        return spelled_layers(section["layers"], f"{where}.layers")
    if given[0] == "profile":
        return read_profile(profile_path(section["profile"], f"{where}.profile", base))
    return _architecture_layers(section, device or Device(), where)


def profile_path(value: object, key: str, base: str | Path | None) -> Path:
    """The profile a model section names, relative to `base` (the model file's folder) unless absolute."""
    if not isinstance(value, str) or not value.strip():
        raise ZboptError(f"{key} = {shorten(value)}: expected a file name (.csv, .yaml or .json)")
    path = Path(value)
    return path if path.is_absolute() or base is None else Path(base) / path


def model_training(section: dict, where: str = "model") -> Training:
    """How the model section says it is trained (`TRAINING_KEYS`; each a default where not given):
    the data-parallel group and the distributed optimizer for every source, the dtype for an
    architecture's costs. Call after `model_layers` has accepted the section."""
    try:
        return Training(**{key: section[key] for key in TRAINING_KEYS if key in section})
    except ZboptError as error:
        raise ZboptError(f"{where}.{error}") from None


def _architecture_layers(section: dict, device: Device, where: str) -> list[tuple[Layer, int]]:
    """An architecture (or preset, overridden by `architecture:`) at the device's FLOP/s."""
    base = preset(section["preset"], f"{where}.preset") if "preset" in section else None
    arch = Architecture.from_config(section.get("architecture", {}), f"{where}.architecture", base)
    return architecture_layers(arch, device, model_training(section, where))


def spelled_layers(entries: object, where: str) -> list[tuple[Layer, int]]:
    """`layers:` as written: a list of {name, repeat, forward, backward, weight, activation,
    weight_activation, parameters}, each quantity with its unit."""
    if not isinstance(entries, list) or not entries:
        raise ZboptError(f"{where} = {shorten(entries)}: expected a non-empty list of layers")
    return [_spelled_layer(entry, f"{where}[{index}]") for index, entry in enumerate(entries)]


def _spelled_layer(entry: object, where: str) -> tuple[Layer, int]:
    if not isinstance(entry, dict):
        raise ZboptError(f"{where} = {shorten(entry)}: expected a mapping with keys {', '.join(LAYER_KEYS)}")
    if isinstance(entry.get("name"), str):
        where = f"{where} ({shorten(entry['name'])[1:-1]})"
    unknown = [key for key in entry if key not in LAYER_KEYS]
    if unknown:
        raise ZboptError(f"{where}: unknown key {shorten(unknown[0])} (known: {', '.join(LAYER_KEYS)})")
    missing = [key for key in REQUIRED_LAYER_KEYS if key not in entry]
    if missing:
        raise ZboptError(f"{where}: missing key {missing[0]}")
    repeat = check_repeat(entry.get("repeat", 1), f"{where}.repeat")
    weight = entry.get("weight")
    kept = entry.get("weight_activation")
    if weight is None and kept is not None:
        raise ZboptError(f"{where}.weight_activation = {shorten(kept)}: a fused backward (no weight) keeps nothing "
                         "for W")
    try:
        layer = Layer(name=entry["name"], forward_ms=parse_time(entry["forward"], f"{where}.forward"),
                      backward_ms=parse_time(entry["backward"], f"{where}.backward"),
                      weight_ms=None if weight is None else parse_time(weight, f"{where}.weight"),
                      activation_gb=parse_memory(entry["activation"], f"{where}.activation"),
                      weight_activation_gb=None if kept is None else parse_memory(kept, f"{where}.weight_activation"),
                      parameters_gb=parse_memory(entry["parameters"], f"{where}.parameters"),
                      gradient_gb=None if entry.get("gradient") is None else parse_memory(entry["gradient"],
                                                                                          f"{where}.gradient"))
    except ZboptError as error:
        message = str(error)
        raise ZboptError(message if message.startswith(where) else f"{where}: {message}") from None
    return layer, repeat
