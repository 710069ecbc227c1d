"""A Problem's plain forms: the dict a config or JSON file holds (`Problem.to_dict`, whose inverse
is `Problem.from_dict`) and the one line that describes it (`Problem.describe`)."""

from __future__ import annotations

from zbopt.core.problem.parameters import ALWAYS_WRITTEN, PARAMETERS
from zbopt.core.problem.slices import total_tokens

__all__ = ["as_dict", "describe"]


def _compact(values):
    """A scalar where every stage (or device) agrees, else the list."""
    if values is None or isinstance(values, (int, float, str)):
        return values
    return values[0] if len(set(values)) == 1 else list(values)


def _plain(entry, value):
    """One parameter's value as JSON takes it: per stage or device a scalar where all agree, pairs
    as their mapping, each microbatch's tokens a number or its documents' list."""
    if entry.shape == "pairs":
        return {kind: _compact(costs) for kind, costs in value}
    if entry.shape == "per microbatch":
        return [list(count) if isinstance(count, tuple) else count for count in value]
    return _compact(value)


def as_dict(problem) -> dict:
    """The parameters as plain JSON-able values (`PARAMETERS`' order): every parameter of the
    groups always written, a mechanism's only where it is in use (one of its values is not its
    default), and then its switches and the values set (not None, not the default); a key whose
    microbatches differ as its rows."""
    in_use = {entry.mechanism for entry in PARAMETERS
              if entry.shape != "stored" and getattr(problem, entry.name) != entry.default}
    data = {}
    for entry in PARAMETERS:
        value = getattr(problem, entry.name)
        if entry.mechanism in ALWAYS_WRITTEN or (entry.mechanism in in_use and value is not None
                                                  and (value != entry.default or entry.shape == "switch")):
            data[entry.name] = _plain(entry, value)
    data.pop("microbatch_tables", None)
    for key, rows in problem.microbatch_tables or ():
        data[key] = [list(row) for row in rows]
    return data


def describe(problem) -> str:
    """One line: p, m, v, placement, backward kind, iterations, what is allowed, how microbatches differ."""
    backward = "split backward (F, B, W)" if problem.split_backward else "fused backward (F, BW)"
    text = (
        f"p={problem.num_devices} devices, m={problem.num_microbatches} microbatches, "
        f"v={problem.chunks_per_device} chunk{'s' * (problem.chunks_per_device > 1)} per device "
        f"({problem.placement} placement), {backward}"
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
