"""Sequence slices (Seq1F1B: Sun et al., NAACL 2025, arXiv 2406.03488): each sequence of a batch
split into k slices that the pipeline schedules like microbatches.

With `sequence_slices` k, the Problem's microbatches are the slices: microbatches q·k .. q·k+k-1
of an iteration are slices 0..k-1 of its sequence q (`num_microbatches` counts slices and is a
multiple of k; `microbatch_tokens`, where given, has one count per sequence). Causal attention
makes slice i of a sequence read the keys and values of slices 0..i-1, so on one stage (§3.1,
Fig. 1 of the paper):
    F(s, slice i) after F(s, slice i-1);   B(s, slice i-1) after B(s, slice i)  (BW when fused)
the backward running in reverse because slice i's backward sends the gradients of the keys and
values it read back to the earlier slices. These are same-device inputs of the op table
(`OpTable.same_device_inputs`), beside its restores, so the simulator, the op DAG, the CP-SAT
model and the MILP all hold them.

Costs (the slices of a sequence split its tokens evenly, the paper's "average" split; §3.3's
computation-wise split is not modelled): slice i covers tokens b_i..b_{i+1} of its sequence; its
linear part costs by its tokens, b_{i+1} - b_i, and its attention by the query-key pairs it
computes under the causal mask, b_{i+1}² - b_i² (twice the triangle up to b_{i+1} minus the one
up to b_i), so later slices cost more and a sequence's slices add up to the sequence unsliced.
A slice's activation is linear in its tokens; the keys and values a later slice reads are part of
the earlier slice's activation, which its backward (after the later slice's) frees: no extra term.
"""

from __future__ import annotations

from zbopt.core.errors import ProblemError

__all__ = ["Span", "check_sequence_tokens", "check_slices", "neighbour", "slice_bounds", "span_factor", "spans",
           "total_tokens"]

Span = tuple[float, float]  # a slice's first and last token boundary, in reference lengths


def check_slices(slices: object, microbatches: int, bidirectional: bool, mechanisms: bool = False) -> int:
    """sequence_slices: a positive integer dividing num_microbatches (slices of one sequence stay
    together, within one route of the bidirectional placement); not with recomputation or offload
    (`mechanisms`): a slice's recompute and backward read the keys and values of the slices before
    it, which a recomputed or offloaded earlier slice would not hold, and that is not modelled."""
    if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
        raise ProblemError("sequence_slices", slices, "expected a positive integer (slices per sequence)")
    if microbatches % slices:
        raise ProblemError("sequence_slices", slices, f"num_microbatches ({microbatches}) counts the slices: "
                                                      "expected a multiple of sequence_slices")
    if slices > 1 and mechanisms:
        raise ProblemError("sequence_slices", slices, "not with allow_recompute or allow_offload (a slice's "
                                                      "backward reads the earlier slices' keys and values: not "
                                                      "modelled)")
    if slices > 1 and bidirectional and ((microbatches + 1) // 2) % slices:
        raise ProblemError("sequence_slices", slices, "with the bidirectional placement each route's "
                                                      "microbatches must hold whole sequences")
    return slices


def check_sequence_tokens(tokens, slices: int) -> None:
    """Every sequence has at least one token per slice, and is one sequence (not packed documents)."""
    for sequence, count in enumerate(tokens):
        if slices > 1 and not isinstance(count, int):
            raise ProblemError("sequence_slices", slices, f"not with packed documents (sequence {sequence}: "
                                                          f"{list(count)}): a slice is part of one sequence")
        if slices > 1 and count < slices:
            raise ProblemError("sequence_slices", slices, f"above the tokens of sequence {sequence} ({count}): "
                                                          "a slice needs at least one token")


def spans(problem) -> tuple[tuple[Span, ...], ...] | None:
    """Per microbatch of one iteration, the parts of sequences it covers, in reference lengths:
    its slice of its sequence where sliced, else (0, tokens / reference_tokens), or one such part
    per packed document (each attends to itself); None without tokens or slices. Without tokens
    each sequence is one reference length."""
    k, tokens = problem.sequence_slices, problem.microbatch_tokens
    if tokens is None and k == 1:
        return None
    if tokens is None:  # every sequence one reference length: k tokens, one per slice
        tokens, reference = (k,) * (problem.num_microbatches // k), float(k)
    else:  # the length the costs are for: as given, else the mean microbatch's
        reference = problem.reference_tokens or sum(map(total_tokens, tokens)) / len(tokens)
    if k == 1:
        return tuple(((0.0, count / reference),) if isinstance(count, int) else
                     tuple((0.0, length / reference) for length in count) for count in tokens)
    result = []
    for length in tokens:
        bounds = slice_bounds(length, k)
        result += [((bounds[i] / reference, bounds[i + 1] / reference),) for i in range(k)]
    return tuple(result)


def slice_bounds(tokens: int, k: int) -> list[int]:
    """Where a sequence of `tokens` tokens is cut into `k` slices: whole tokens, as even as they go."""
    return [i * tokens // k for i in range(k + 1)]


def span_factor(span: Span, attention_share: float) -> float:
    """What a slice costs relative to a whole sequence of reference length: its linear part by its
    tokens, its attention part by the causal pairs it computes (module docstring)."""
    start, end = span
    return (1 - attention_share) * (end - start) + attention_share * (end * end - start * start)


def neighbour(problem, forward: bool, microbatch: int) -> int | None:
    """The slice a forward (`forward`) or an input gradient of `microbatch` also waits for on its
    stage: the slice before it, or after it; None at the sequence's end or unsliced."""
    k = problem.sequence_slices
    place = microbatch % k
    if forward:
        return microbatch - 1 if place > 0 else None
    return microbatch + 1 if place < k - 1 else None


def total_tokens(tokens: int | tuple[int, ...]) -> int:
    """A microbatch's tokens: its count, or its packed documents' together."""
    return tokens if isinstance(tokens, int) else sum(tokens)
