"""Seq1F1B (Sun et al., NAACL 2025, arXiv 2406.03488): 1F1B over the slices of each sequence.

The paper's Fig. 1 and §3: each sequence is split into k slices (`zbopt.core.problem.slices`), and 1F1B runs
over slices instead of microbatches, with two changes. Warm-up: device s runs p - s - 1 + k - 1
forwards before its first backward (p - s + k - 2 in the authors' Megatron code,
megatron/core/pipeline_parallel/schedules.py, rank s of p), so the last device has all k slices
of the first sequence before it starts its backward. Backward order: sequence by sequence as
they entered, the slices of one sequence last first (the paper's "partially ordered queue",
sequence_split.py there), since slice i-1's backward needs the key and value gradients of slice
i's. Forwards run in entry order: sequence by sequence, slice 0 first.
"""

from __future__ import annotations

from zbopt.core.kinds import FORWARD
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.classic import warmup_then_alternate
from zbopt.schedules.common import iteration_microbatches
from zbopt.schedules.registry import register, require

__all__ = ["seq1f1b"]


def _backward_order(microbatches: range, slices: int) -> list[int]:
    """The slices of each sequence in reverse, sequence by sequence."""
    ids = list(microbatches)
    return [j for first in range(0, len(ids), slices) for j in reversed(ids[first:first + slices])]


def _peak_slices(problem: Problem) -> list[float]:
    """Peak memory: device s holds at most p - s + k - 1 slices (its warm-up and one more, within
    an iteration), each at most the largest slice's activation on its stage."""
    p, k = problem.num_devices, problem.sequence_slices
    held = [min(p - s - 1 + k, problem.num_microbatches) for s in range(p)]
    largest = [max(problem.memory_delta(FORWARD, s, microbatch=j) for j in range(problem.num_microbatches))
               for s in range(p)]
    return [count * size for count, size in zip(held, largest, strict=True)]


@register("seq1f1b", "Seq1F1B (Sun et al., NAACL 2025): 1F1B over sequence slices, a sequence's backwards in reverse",
          _peak_slices, sliced=True)
def seq1f1b(problem: Problem) -> Schedule:
    """Seq1F1B: device s runs min(p - s - 1 + k - 1, m) warm-up forwards of slices in entry order,
    then alternates a forward and a backward, the backwards sequence by sequence with each
    sequence's slices last first, then drains. With a split backward W runs right after its B.
    Needs v = 1 and sequence_slices k > 1 (with k = 1 it is 1f1b)."""
    k = problem.sequence_slices
    require(k > 1, "seq1f1b", "sequence_slices > 1 (with one slice per sequence it is 1f1b)")
    return warmup_then_alternate(problem, "seq1f1b", lambda stage, p: p - stage - 1 + k - 1,
                                 iteration_microbatches(problem), lambda stream: _backward_order(stream, k))
