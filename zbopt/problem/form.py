"""A Problem's plain forms: the dict a config or JSON file holds (`Problem.to_dict`, whose inverse
is `Problem.from_dict`) and the one line that describes it (`Problem.describe`)."""

from __future__ import annotations

import dataclasses

from zbopt.slices import total_tokens

MECHANISM_KEYS = {"allow_recompute": ("recompute_times", "checkpoint_memory"),
                  "allow_offload": ("offload_times", "reload_times", "shared_host_link")}
TOKEN_KEYS = ("microbatch_tokens", "attention_share", "reference_tokens")


def _compact(values):
    """A scalar where every stage (or device) agrees, else the list."""
    if values is None or isinstance(values, (int, float, str)):
        return values
    return values[0] if len(set(values)) == 1 else list(values)


def as_dict(problem) -> dict:
    """The parameters as plain JSON-able values, with scalars where all stages agree; a key whose
    microbatches differ as its rows, the tokens as given; what is not in use left out."""
    data = {field.name: _compact(getattr(problem, field.name)) for field in dataclasses.fields(problem)}
    if problem.overlap_times is None:
        del data["overlap_times"]
    else:
        data["overlap_times"] = {kind: _compact(costs) for kind, costs in problem.overlap_times}
    # the keys of mechanisms not allowed stay out, as in the configs that predate them
    for switch, keys in MECHANISM_KEYS.items():
        if not data[switch]:
            for key in (switch, *keys):
                del data[key]
    for key, rows in problem.microbatch_tables or ():
        data[key] = [list(row) for row in rows]
    del data["microbatch_tables"]
    if problem.sequence_slices == 1:
        del data["sequence_slices"]
    if problem.microbatch_tokens is None:
        for key in TOKEN_KEYS:
            if key != "attention_share" or problem.sequence_slices == 1:
                del data[key]
    else:
        data["microbatch_tokens"] = [list(count) if isinstance(count, tuple) else count
                                     for count in problem.microbatch_tokens]
        if problem.reference_tokens is None:  # the default (the mean) stays the default
            del data["reference_tokens"]
    return data


def describe(problem) -> str:
    """One line: p, m, v, placement, backward kind, iterations, what is allowed, how microbatches differ."""
    backward = "split backward (F, B, W)" if problem.split_backward else "fused backward (F, BW)"
    text = (
        f"p={problem.num_devices} devices, m={problem.num_microbatches} microbatches, "
        f"v={problem.chunks_per_device} chunk(s) ({problem.placement} placement), {backward}"
    )
    if problem.bidirectional:
        (_, down), (_, up) = problem.routes
        text += f", {len(down)} down and {len(up)} up"
    if problem.iterations > 1:
        text += f", {problem.iterations} iterations" + ("" if problem.flush else " without flush")
    if problem.allow_recompute:
        text += ", recomputation allowed"
    if problem.allow_offload:
        text += ", offload allowed" + (" (host link shared by device pairs)" if problem.shared_host_link else "")
    if problem.overlap_times:
        text += ", overlapped pairs " + " and ".join(kind for kind, _ in problem.overlap_times)
    if problem.microbatch_tokens is not None:
        tokens = [total_tokens(count) for count in problem.microbatch_tokens]
        what = "sequences" if problem.sequence_slices > 1 else "microbatches"
        text += f", {what} of {min(tokens)} to {max(tokens)} tokens"
    elif problem.microbatch_tables:
        text += ", costs per microbatch (" + ", ".join(key for key, _ in problem.microbatch_tables) + ")"
    if problem.sequence_slices > 1:
        text += f", {problem.num_microbatches // problem.sequence_slices} sequences of {problem.sequence_slices} slices"
    return text
