"""A Problem's optional parts checked and expanded: the split backward's weight memory,
recomputation, offload, overlapped pairs and the iteration's ends (see `Problem` for what each means); and each optional
mechanism as one frozen record, so that code asks `problem.offload is not None` and reads
`problem.offload.reload_times` rather than four flat fields.

Each check takes the values as given and returns the normalised ones by key (per virtual stage,
or per device for overlap costs), or raises a ProblemError naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zbopt.core.errors import ProblemError, shorten
from zbopt.core.kinds import PAIR_KINDS
from zbopt.core.problem.checks import per_device, per_stage, unused_without

__all__ = [
    "DEFAULT_WEIGHT_MEMORY_FRACTION",
    "END_INPUTS",
    "ITERATION_END_KEYS",
    "IterationEnds",
    "MicrobatchSizes",
    "Offload",
    "OverlappedPairs",
    "Recomputation",
    "compute_slowed",
    "ends_record",
    "iteration_ends",
    "offload",
    "overlap",
    "recomputation",
    "split_backward",
    "unshard_windows",
    "unshards_done",
]

DEFAULT_WEIGHT_MEMORY_FRACTION = 0.5


@dataclass(frozen=True)
class Recomputation:
    """Activations may be dropped after F and recomputed (R) before their B (`allow_recompute`).

    times : R's duration per virtual stage (`recompute_times`).
    checkpoint_memory : what a recomputed activation keeps from F to R, per virtual stage.
    """

    times: tuple[float, ...]
    checkpoint_memory: tuple[float, ...]


@dataclass(frozen=True)
class Offload:
    """Activations may be copied to host memory (O) after F and back (L) before B (`allow_offload`).

    offload_times, reload_times : each copy's duration per virtual stage.
    shared_host_link : devices 2k and 2k+1 share one host link (their copies queue on it).
    """

    offload_times: tuple[float, ...]
    reload_times: tuple[float, ...]
    shared_host_link: bool


@dataclass(frozen=True)
class OverlappedPairs:
    """A forward may run together with another microbatch's backward as one op (`overlap_times`).

    costs : per pair kind present (in PAIR_KINDS order), the pair's duration per device.
    """

    costs: tuple[tuple[str, tuple[float, ...]], ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The pair kinds that may run (FB, FBW)."""
        return tuple(kind for kind, _ in self.costs)

    def cost(self, kind: str, device: int) -> float | None:
        """What a pair of `kind` costs on `device`, or None when no such pair may run."""
        return next((costs[device] for given, costs in self.costs if given == kind), None)


@dataclass(frozen=True)
class MicrobatchSizes:
    """Microbatches of different token counts, costed by a rule (`microbatch_tokens`).

    tokens : each microbatch's tokens (or each sequence's, with sequence slices).
    attention_share : per virtual stage, the part of F and B that grows with the square of tokens.
    reference_tokens : the token count the per-stage costs are for (None: the mean).
    """

    tokens: tuple[int, ...]
    attention_share: tuple[float, ...]
    reference_tokens: float | None


@dataclass(frozen=True)
class IterationEnds:
    """What a training step does besides the pipeline (`grad_reduce_times` and the keys after it),
    each 0 where not given.

    reduce_times : per virtual stage, its gradient reduction on its device's communication stream.
    step_times : per device, its optimizer step after its compute and reductions.
    unshard_times, unshard_memory : per virtual stage, FSDP's all-gather before its first forward
        and the memory its gathered parameters hold until its last gradient op ends.
    gradient_memory : per virtual stage, its unsharded gradients, held from its first gradient op's
        start until its reduction ends.
    comm_slowdown : how many times slower a device's compute runs while it communicates.
    """

    reduce_times: tuple[float, ...]
    step_times: tuple[float, ...]
    unshard_times: tuple[float, ...]
    unshard_memory: tuple[float, ...]
    gradient_memory: tuple[float, ...]
    comm_slowdown: float = 1.0

    @property
    def time(self) -> float:
        """All they take in one iteration, one after another: what a horizon allows for them."""
        return sum(self.reduce_times) + sum(self.step_times) + sum(self.unshard_times)


ITERATION_END_KEYS = ("grad_reduce_times", "optimizer_step_times", "unshard_times", "unshard_memory",
                      "gradient_memory")
END_INPUTS = (*ITERATION_END_KEYS, "allow_reshard", "comm_slowdown", "shared_host_link")  # what `iteration_ends` checks


def iteration_ends(given: dict, stages: int, devices: int, flush: bool) -> dict:
    """The iteration's ends per virtual stage (per device for the step), >= 0, None where not
    given. With several iterations each device's step is a flush (its next forwards wait for it),
    so they need `flush`."""
    normalized = {}
    for key in ITERATION_END_KEYS:  # the switches of END_INPUTS are checked below
        per_item, count = (per_device, devices) if key == "optimizer_step_times" else (per_stage, stages)
        normalized[key] = None if given[key] is None else per_item(key, given[key], count, positive=False)
    if given["allow_reshard"] and not (normalized["unshard_times"] and any(normalized["unshard_times"])):
        raise ProblemError("allow_reshard", True, "needs unshard_times (FSDP's all-gather of a stage's parameters, "
                                                  "which a re-gather repeats)")
    transfers = any(normalized[key] and any(normalized[key]) for key in ("grad_reduce_times", "unshard_times"))
    if given["comm_slowdown"] != 1 and given["shared_host_link"]:
        raise ProblemError("comm_slowdown", given["comm_slowdown"],
                           "with shared_host_link: which copy of a device pair goes first is in a schedule's start "
                           "times, which a slowdown moves, and zbopt does not time that; leave one out")
    if given["comm_slowdown"] != 1 and not transfers:
        raise ProblemError("comm_slowdown", given["comm_slowdown"],
                           "slows compute while a transfer runs, and none takes time: give grad_reduce_times or "
                           "unshard_times")
    if not flush:
        key = next((key for key in ITERATION_END_KEYS if normalized[key] and any(normalized[key])), None)
        if key is not None:
            raise ProblemError(key, given[key], "the optimizer step between iterations is a flush: "
                                                "give flush = true (or leave out the iteration's ends)")
    return normalized


def ends_record(problem) -> IterationEnds | None:
    """A problem's `IterationEnds` (0 where a key is not given), or None where none takes time or memory."""
    values = [getattr(problem, key) for key in ITERATION_END_KEYS]
    if not any(value and any(value) for value in values):
        return None
    counts = {key: problem.num_devices if key == "optimizer_step_times" else problem.num_stages
              for key in ITERATION_END_KEYS}
    given = (value or (0.0,) * counts[key] for key, value in zip(ITERATION_END_KEYS, values, strict=True))
    return IterationEnds(*given, comm_slowdown=problem.comm_slowdown)


def compute_slowed(problem) -> bool:
    """Whether a device's compute slows while it communicates (`comm_slowdown` above 1): the
    solvers' models leave that out, so their answers are simulated with it and bounded without."""
    return problem.iteration_ends is not None and problem.iteration_ends.comm_slowdown != 1


def unshard_windows(problem, begin: tuple[float, ...] | None = None) -> tuple[tuple[float, float], ...]:
    """Per virtual stage, its unshard's (start, end): back to back on its device's stream from
    `begin[device]` (0 for the first iteration; a later one's from its device's step), in chunk
    order (the order of the stages' first forwards on every schedule)."""
    windows = [(0.0, 0.0)] * problem.num_stages
    times = problem.iteration_ends.unshard_times
    for device, stages in enumerate(problem.stages_of_device):
        free = 0.0 if begin is None else begin[device]
        for stage in stages:
            windows[stage] = (free, free + times[stage])
            free += times[stage]
    return tuple(windows)


def unshards_done(problem, begin: tuple[float, ...] | None = None) -> tuple[float, ...]:
    """Per device, when all its unshards have ended, started at `begin` (0 without unshards, or
    `begin`): a plan that times its own ops may start a device's compute there and meet every
    forward's unshard, and a re-gather may start on the device's all-gather lane."""
    if problem.iteration_ends is None:
        return begin or (0.0,) * problem.num_devices
    windows = unshard_windows(problem, begin)
    return tuple(windows[stages[-1]][1] for stages in problem.stages_of_device)


def split_backward(weight_times, weight_memory, activation_memory: tuple[float, ...]) -> dict:
    """weight_times and weight_memory (default half of each stage's activation), or nothing with
    a fused backward."""
    if weight_times is None:
        if weight_memory is not None:
            raise ProblemError("weight_memory", weight_memory,
                               "needs weight_times (it only applies to a split backward)")
        return {}
    stages = len(activation_memory)
    times = per_stage("weight_times", weight_times, stages)
    if weight_memory is None:
        kept = tuple(DEFAULT_WEIGHT_MEMORY_FRACTION * a for a in activation_memory)
    else:
        kept = per_stage("weight_memory", weight_memory, stages, positive=False)
    _within_activation("weight_memory", weight_memory, kept, activation_memory)
    return {"weight_times": times, "weight_memory": kept}


def recomputation(allow_recompute, recompute_times, checkpoint_memory, forward_times: tuple[float, ...],
                  activation_memory: tuple[float, ...]) -> dict:
    """checkpoint_memory and recompute_times (default the forward's), or nothing when not allowed."""
    if not allow_recompute:
        unused_without("allow_recompute", {"recompute_times": recompute_times, "checkpoint_memory": checkpoint_memory})
        return {}
    if checkpoint_memory is None:
        raise ProblemError("allow_recompute", True, "needs checkpoint_memory (what a recomputed microbatch "
                                                    "keeps between F and R, e.g. its stage input)")
    stages = len(activation_memory)
    checkpoint = per_stage("checkpoint_memory", checkpoint_memory, stages, positive=False)
    _within_activation("checkpoint_memory", checkpoint_memory, checkpoint, activation_memory)
    recompute = forward_times if recompute_times is None else per_stage("recompute_times", recompute_times, stages)
    return {"checkpoint_memory": checkpoint, "recompute_times": recompute}


def offload(allow_offload, offload_times, reload_times, shared_host_link, stages: int) -> dict:
    """offload_times and reload_times (default the offload's), or nothing when not allowed."""
    if not allow_offload:
        unused_without("allow_offload", {"offload_times": offload_times, "reload_times": reload_times,
                                         "shared_host_link": shared_host_link})
        return {}
    if offload_times is None:
        raise ProblemError("allow_offload", True, "needs offload_times (how long one activation takes to "
                                                  "copy to the host, e.g. its bytes over the link bandwidth)")
    copy_out = per_stage("offload_times", offload_times, stages)
    copy_in = copy_out if reload_times is None else per_stage("reload_times", reload_times, stages)
    return {"offload_times": copy_out, "reload_times": copy_in}


def overlap(given, split_backward: bool, devices: int) -> tuple[tuple[str, tuple[float, ...]], ...] | None:
    """The overlap costs per device, in PAIR_KINDS order; a hashable form, so that a Problem stays
    a cache key. `given` is a mapping, or the stored form (from `Problem.replace`)."""
    if given is None:
        return None
    if isinstance(given, tuple) and all(isinstance(item, tuple) and len(item) == 2 for item in given):
        given = dict(given)
    if not isinstance(given, Mapping) or not given:
        raise ProblemError("overlap_times", given, "expected a mapping from pair kind (FB, FBW) to its cost, "
                                                   "e.g. {FBW: 2.5}")
    for kind in given:
        if kind not in PAIR_KINDS:
            raise ProblemError("overlap_times", given, f"unknown pair kind {shorten(kind)} (known: FB, a forward with "
                                                       "an input-gradient B; FBW, a forward with a full backward)")
    if "FB" in given and not split_backward:
        raise ProblemError("overlap_times", given, "FB pairs a forward with an input-gradient B, which needs a "
                                                   "split backward (weight_times); with a fused one give FBW")
    return tuple((kind, per_device(f"overlap_times.{kind}", given[kind], devices))
                 for kind in PAIR_KINDS if kind in given)


def _within_activation(key: str, given, kept: tuple[float, ...], activation_memory: tuple[float, ...]) -> None:
    """What a stage keeps of an activation (`kept`, from `given`) is at most the activation."""
    for stage, (part, whole) in enumerate(zip(kept, activation_memory, strict=True)):
        if part > whole:
            raise ProblemError(key, given, f"exceeds activation_memory on virtual stage {stage} ({part:g} > {whole:g})")
