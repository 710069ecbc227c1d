"""A config's keys and values -> a validated Problem: library code, the same for a file
(`zbopt.load_problem`), the command line's flags and a notebook's dict.

Keys are the parameter table's (`zbopt.core.problem.parameters`: the 1F1B visualizer's names and their
aliases), and the batch's (`zbopt.core.problem.batch`: a global batch, or sequences packed under a token
budget). Every mistake is one ProblemError line naming the key as the user wrote it, and where.
"""

from __future__ import annotations

from collections.abc import Mapping

from zbopt.core.errors import ProblemError, ZboptError, clip, shorten
from zbopt.core.problem.batch import BATCH_FLAGS, PACKING_KEYS, batch_microbatches, packed_microbatches
from zbopt.core.problem.parameters import config_keys
from zbopt.core.problem.problem import Problem

__all__ = ["DEFAULTS", "FLAG", "KEYS", "flag_text", "key_name", "problem_from_config", "same_parameter"]

KEYS = config_keys()  # config key (aliases included) -> parameter name
# What a run uses when neither the config nor a flag says otherwise (the 1F1B visualizer's example).
DEFAULTS = {"num_devices": 4, "num_microbatches": 8}
FLAG = "flag"  # the source of a value given as the command-line flag --KEY-WITH-DASHES


def problem_from_config(values: Mapping, source: str = "config", sources: Mapping[str, str] | None = None,
                        ignored: tuple[str, ...] = ()) -> Problem:
    """The Problem `values` (config keys, aliases allowed; the batch keys; `ignored` keys are the
    caller's) describe, with DEFAULTS for what they leave out.

    Raises ZboptError for an unknown key, a parameter given twice under two aliases, or an
    invalid value. The message names the key where its value came from: `sources[key]` if given
    there (FLAG: the flag, "--memory-limit 0.5: ..."; else a file name), else `source`
    ("a.yaml: memory_limit = 0.5: ...").

    >>> problem_from_config({"num_stages": 2, "global_batch_size": 8, "micro_batch_size": 2}).num_microbatches
    4
    """
    parameters, written_as = _batch(values, lambda key: key_name(key, (sources or {}).get(key, source)))
    for key, value in values.items():
        if key in BATCH_FLAGS or key in PACKING_KEYS or key in ignored:
            continue
        parameter = KEYS.get(key)
        if parameter is None:
            known = ", ".join([*KEYS, *BATCH_FLAGS, *PACKING_KEYS, *ignored])
            raise ZboptError(f"{source}: unknown key {shorten(key)} (known keys: {known})")
        if parameter in written_as:
            raise ZboptError(f"{source}: '{key}' and '{written_as[parameter]}' both set {parameter}; give one")
        parameters[parameter] = value
        written_as[parameter] = key
    for parameter, default in DEFAULTS.items():
        parameters.setdefault(parameter, default)
    try:
        return Problem(**parameters)
    except ProblemError as error:
        key = written_as.get(error.key, error.key)
        origin = (sources or {}).get(key, source)
        if origin == FLAG:
            raise ZboptError(f"{key_name(key, FLAG)} {clip(flag_text(values[key]))}: {error.reason}") from None
        raise ZboptError(f"{origin}: {key} = {shorten(error.value)}: {error.reason}") from None


def _batch(values: Mapping, name) -> tuple[dict, dict[str, str]]:
    """(parameters, the key each was written as) that the batch keys give: the count from a
    global batch, or the microbatches packed from sequence lengths (costs at the token budget
    unless reference_tokens is given: every packing then holds the same work)."""
    parameters: dict = {}
    written_as: dict[str, str] = {}
    if counted := batch_microbatches(values, name):
        parameters["num_microbatches"], written_as["num_microbatches"] = counted
    if packed := packed_microbatches(values, name):
        sequences, parameters["microbatch_tokens"] = packed
        slices = values.get("sequence_slices", 1)  # each sequence is that many microbatches (then refused by name)
        parameters["num_microbatches"] = sequences * slices if isinstance(slices, int) and slices > 1 else sequences
        written_as["num_microbatches"] = written_as["microbatch_tokens"] = "sequence_lengths"
        if "reference_tokens" not in values:
            parameters["reference_tokens"], written_as["reference_tokens"] = values["token_budget"], "token_budget"
    return parameters, written_as


def same_parameter(key: str) -> str:
    """The parameter a config key sets (a batch key sets the microbatch count); other keys stand for themselves."""
    return "num_microbatches" if key in BATCH_FLAGS else KEYS.get(key, key)


def key_name(key: str, origin: str) -> str:
    """A key as the user gave it: its flag ("--global-batch"), or the key and its file."""
    if origin == FLAG:
        return BATCH_FLAGS.get(key, f"--{key.replace('_', '-')}")
    return f"{key} ({origin})"


def flag_text(value: object) -> str:
    """A flag's value as it was typed: numbers without a trailing .0, a list space-separated."""
    if isinstance(value, list):
        return " ".join(flag_text(item) for item in value)
    return repr(value).removesuffix(".0") if isinstance(value, float) else str(value)
