"""A run's settings (a config file's keys, flag values) -> a validated Problem plus run options.

Keys follow the 1F1B visualizer's names so its configs run unchanged; aliases map onto the
Problem's parameter names. Every mistake is one ZboptError line naming the key (as the user
wrote it, or the flag it was given as) and its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from zbopt.cli.batch import BATCH_FLAGS, PACKING_KEYS, batch_microbatches, packed_microbatches
from zbopt.errors import ProblemError, ZboptError, clip, shorten
from zbopt.io.config import read_config_file
from zbopt.problem import Problem

# config key -> Problem parameter; the first key listed for a parameter is its documented name.
PROBLEM_KEYS = {
    "num_stages": "num_devices",
    "num_devices": "num_devices",
    "num_microbatches": "num_microbatches",
    "num_batches": "num_microbatches",
    "chunks_per_device": "chunks_per_device",
    "placement": "placement",
    "forward_times": "forward_times",
    "backward_times": "backward_times",
    "weight_times": "weight_times",
    "p2p_time": "p2p_time",
    "activation_memory": "activation_memory",
    "weight_memory": "weight_memory",
    "memory_limit": "memory_limit",
    "iterations": "iterations",
    "flush": "flush",
    "allow_recompute": "allow_recompute",
    "recompute_times": "recompute_times",
    "checkpoint_memory": "checkpoint_memory",
    "allow_offload": "allow_offload",
    "offload_times": "offload_times",
    "reload_times": "reload_times",
    "shared_host_link": "shared_host_link",
    "overlap_times": "overlap_times",
    "microbatch_tokens": "microbatch_tokens",
    "attention_share": "attention_share",
    "reference_tokens": "reference_tokens",
    "sequence_slices": "sequence_slices",
}
OPTION_KEYS = ("output_file",)
# What a run uses when neither the config nor a flag says otherwise (the visualizer's example).
DEFAULTS = {"num_devices": 4, "num_microbatches": 8}
FLAG = "flag"  # the source of a value given as the command-line flag --KEY-WITH-DASHES


@dataclass(frozen=True)
class RunConfig:
    """A problem and the options that came with it."""

    problem: Problem
    output_file: str | None = None


def build_run_config(values: dict, source: str = "config", sources: Mapping[str, str] | None = None) -> RunConfig:
    """Validate `values` (config keys, aliases allowed) into a RunConfig.

    Raises ZboptError for an unknown key, a parameter given twice under two aliases, or an
    invalid value. The message names the key where its value came from: `sources[key]` if given
    there (FLAG: the flag, "--memory-limit 0.5: ..."; else a file name), else `source`
    ("a.yaml: memory_limit = 0.5: ...").
    """
    parameters: dict = {}
    written_as: dict[str, str] = {}
    options: dict = {}
    def name(key: str) -> str:
        return _key_name(key, (sources or {}).get(key, source))

    if counted := batch_microbatches(values, name):
        parameters["num_microbatches"], written_as["num_microbatches"] = counted
    if packed := packed_microbatches(values, name):
        parameters["num_microbatches"], parameters["microbatch_tokens"] = packed
        written_as["num_microbatches"] = written_as["microbatch_tokens"] = "sequence_lengths"
        if "reference_tokens" not in values:  # costs at the budget: every packing holds the same work
            parameters["reference_tokens"], written_as["reference_tokens"] = values["token_budget"], "token_budget"
    for key, value in values.items():
        if key in BATCH_FLAGS or key in PACKING_KEYS:
            continue
        if key in OPTION_KEYS:
            if value is not None and not isinstance(value, str):
                raise ZboptError(f"{source}: {shorten(key)} = {shorten(value)}: expected a file name")
            options[key] = value
            continue
        parameter = PROBLEM_KEYS.get(key)
        if parameter is None:
            known = ", ".join([*PROBLEM_KEYS, *BATCH_FLAGS, *PACKING_KEYS, *OPTION_KEYS])
            raise ZboptError(f"{source}: unknown key {shorten(key)} (known keys: {known})")
        if parameter in written_as:
            raise ZboptError(f"{source}: '{key}' and '{written_as[parameter]}' both set {parameter}; give one")
        parameters[parameter] = value
        written_as[parameter] = key
    for parameter, default in DEFAULTS.items():
        parameters.setdefault(parameter, default)
    try:
        problem = Problem(**parameters)
    except ProblemError as error:
        key = written_as.get(error.key, error.key)
        origin = (sources or {}).get(key, source)
        if origin == FLAG:
            raise ZboptError(f"{_key_name(key, FLAG)} {clip(_flag_text(values[key]))}: {error.reason}") from None
        raise ZboptError(f"{origin}: {key} = {shorten(error.value)}: {error.reason}") from None
    return RunConfig(problem, options.get("output_file"))


def _key_name(key: str, origin: str) -> str:
    """A key as the user gave it: its flag ("--global-batch"), or the key and its file."""
    if origin == FLAG:
        return BATCH_FLAGS.get(key, f"--{key.replace('_', '-')}")
    return f"{key} ({origin})"


def _flag_text(value: object) -> str:
    """A flag's value as it was typed: numbers without a trailing .0, a list space-separated."""
    if isinstance(value, list):
        return " ".join(_flag_text(item) for item in value)
    return repr(value).removesuffix(".0") if isinstance(value, float) else str(value)


def load_config(path: str | Path) -> RunConfig:
    """Read a config file into a RunConfig."""
    return build_run_config(read_config_file(path), source=str(path))
