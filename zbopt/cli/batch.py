"""The microbatch count from a global batch, as a training config states it: m = global_batch_size /
(micro_batch_size · data_parallel), Megatron-LM's rule (its num_microbatches calculator), so a
user need not divide by hand; or the microbatches packed from sequence lengths under a token
budget (`zbopt.packing`), the count and each one's documents."""

from __future__ import annotations

from collections.abc import Callable

from zbopt.errors import ZboptError, shorten

# config key -> its flag; micro_batch_size and data_parallel default to 1
BATCH_FLAGS = {"global_batch_size": "--global-batch", "micro_batch_size": "--micro-batch-size",
               "data_parallel": "--data-parallel"}
COUNT_KEYS = ("num_microbatches", "num_batches")  # the keys that give m directly


def batch_microbatches(values: dict, name: Callable[[str], str]) -> tuple[int, str] | None:
    """(m, "global_batch_size") from the batch keys in `values`, or None when none is given.

    `name(key)` is how a message names a key (its flag, or the key in its file). Raises ZboptError
    naming the keys for a value that is not a positive integer, a batch key without
    global_batch_size, a global batch that micro_batch_size · data_parallel does not divide, and
    a count given both ways.
    """
    given = {key: values[key] for key in BATCH_FLAGS if key in values}
    if not given:
        return None
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ZboptError(f"{name(key)}: {shorten(value)} is not a positive whole number")
    if "global_batch_size" not in given:
        raise ZboptError(f"{' and '.join(map(name, given))}: give the global batch too (global_batch_size, "
                         f"{BATCH_FLAGS['global_batch_size']}), which they divide into microbatches")
    counted = [key for key in COUNT_KEYS if key in values]
    if counted:
        raise ZboptError(f"{name('global_batch_size')} and {name(counted[0])} both give the number of "
                         "microbatches; give one")
    micro, parallel = given.get("micro_batch_size", 1), given.get("data_parallel", 1)
    if given["global_batch_size"] % (micro * parallel):
        factors = [name(key) for key in ("micro_batch_size", "data_parallel") if key in given]
        raise ZboptError(f"{name('global_batch_size')}: {given['global_batch_size']} is not a multiple of "
                         f"micro_batch_size × data_parallel = {micro} × {parallel}"
                         + (f" (from {' and '.join(factors)})" if factors else ""))
    return given["global_batch_size"] // (micro * parallel), "global_batch_size"


# config keys that pack sequences into microbatches (config files only: lists make poor flags)
PACKING_KEYS = ("sequence_lengths", "token_budget", "packing")


def packed_microbatches(values: dict, name: Callable[[str], str]) -> tuple[int, list[list[int]]] | None:
    """(m, each microbatch's document lengths) packed from `values`' sequence_lengths under its
    token_budget by its packing rule (default "loader": the data loader's own way, nothing
    reordered; "balanced" weighs attention by the config's attention_share where it is one
    number), or None when no packing key is given. Raises ZboptError naming the key for a
    packing key without sequence_lengths and token_budget, or microbatches given another way too."""
    from zbopt.packing import pack, packed_tokens

    given = {key: values[key] for key in PACKING_KEYS if key in values}
    if not given:
        return None
    missing = [key for key in ("sequence_lengths", "token_budget") if key not in given]
    if missing:
        raise ZboptError(f"{' and '.join(map(name, given))}: give {' and '.join(missing)} too, which packing needs")
    taken = [key for key in (*COUNT_KEYS, "microbatch_tokens", *BATCH_FLAGS) if key in values]
    if taken:
        raise ZboptError(f"{name('sequence_lengths')} and {name(taken[0])} both give the microbatches; give one")
    lengths = given["sequence_lengths"]
    if not isinstance(lengths, list):
        raise ZboptError(f"{name('sequence_lengths')}: {shorten(lengths)}: expected a list of token counts")
    share = values.get("attention_share", 0.0)
    packing = pack(lengths, given["token_budget"], given.get("packing", "loader"),
                   share if isinstance(share, (int, float)) and not isinstance(share, bool) else 0.0)
    return len(packing), packed_tokens(lengths, packing)
