"""The pipeline problem: devices, microbatches, chunks, placement, costs, latency and memory.

A `Problem` is immutable and validated on construction; everything else in zbopt (the op DAG,
schedules, bounds, solvers) derives from it. Per-stage quantities are stored as tuples with one
entry per *virtual stage* (S = p·v); per-device quantities with one entry per device.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from zbopt.core.errors import ProblemError
from zbopt.core.kinds import (
    BACKWARD,
    FORWARD,
    FUSED_BACKWARD,
    FUSED_KINDS,
    OFFLOAD,
    RECOMPUTE,
    REGATHER,
    RELOAD,
    SPLIT_KINDS,
    WEIGHT,
)
from zbopt.core.placement import check_placement, device_stage, route_stages, stage_device
from zbopt.core.problem import checks, form, memory_floor, microbatches, slices
from zbopt.core.problem.checks import known_parameters, per_device, per_stage, plain
from zbopt.core.problem.mechanisms import (
    END_INPUTS,
    IterationEnds,
    MicrobatchSizes,
    Offload,
    OverlappedPairs,
    Recomputation,
    ends_record,
    iteration_ends,
    offload,
    overlap,
    recomputation,
    split_backward,
)
from zbopt.core.problem.parameters import PARAMETERS, docstring_section
from zbopt.core.tolerance import check_ranges

__all__ = ["PerStage", "Problem"]

PerStage = float | Sequence[float]
_COST_KEYS = {FORWARD: "forward_times", BACKWARD: "backward_times", WEIGHT: "weight_times",
              FUSED_BACKWARD: "backward_times", RECOMPUTE: "recompute_times", OFFLOAD: "offload_times",
              RELOAD: "reload_times", REGATHER: "unshard_times"}  # where each kind's duration per stage is


_ANNOTATIONS = {"count": int, "switch": bool, "choice": str, "number": float | None, "per stage": PerStage | None,
                "per device": PerStage | None, "per microbatch": Sequence[int | Sequence[int]] | None,
                "pairs": Mapping[str, PerStage] | tuple[tuple[str, tuple[float, ...]], ...] | None,
                "stored": tuple[tuple[str, tuple[tuple[float, ...], ...]], ...] | None}
# the constructor's keywords and the fields, in the table's order, read off the table
_Parameters = dataclasses.make_dataclass(
    "_Parameters", [(entry.name, _ANNOTATIONS[entry.shape]) if entry.required else
                    (entry.name, _ANNOTATIONS[entry.shape], dataclasses.field(default=entry.default))
                    for entry in PARAMETERS], frozen=True)
_Parameters.__module__ = __name__


def _frozen(value: object) -> object:
    """Lists as tuples, all the way down (a mapping stays: `overlap_times` stores its own form)."""
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value


@dataclass(frozen=True)
class Problem(_Parameters):
    """One pipeline-parallel training step (or several, see `iterations`) to be scheduled.

    {parameters}

    Raises
    ------
    ProblemError naming the parameter when a value is invalid.

    Examples
    --------
    >>> problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, weight_times=1)
    >>> problem.num_stages, problem.num_ops, problem.describe()
    (8, 192, 'p=4 devices, m=8 microbatches, v=2 chunks per device (loop placement), split backward (F, B, W)')
    >>> Problem.from_dict(problem.to_dict()) == problem
    True
    """

    def __post_init__(self) -> None:
        """Check every value, the table's own checks first in its order, then what needs several
        values (the stage count, a mechanism's switch), and store the normalised forms."""
        for entry in PARAMETERS:
            value = plain(getattr(self, entry.name))
            object.__setattr__(self, entry.name, value if entry.check is None else entry.check(entry.name, value))
        p, v = self.num_devices, self.chunks_per_device
        checks.check_op_count(self)
        check_placement(self.placement, v, self.iterations, self.num_microbatches)
        slices.check_slices(self.sequence_slices, self.num_microbatches, self.placement == "bidirectional",
                            self.allow_recompute or self.allow_offload)
        stages = p * v
        given, tables = microbatches.take_tables({key: getattr(self, key) for key in microbatches.TABLE_KEYS},
                                                 self.microbatch_tables, stages, self.num_microbatches)
        normalized = {
            "forward_times": per_stage("forward_times", given["forward_times"], stages),
            "backward_times": per_stage("backward_times", given["backward_times"], stages),
            "activation_memory": per_stage("activation_memory", given["activation_memory"], stages, positive=False),
            "microbatch_tables": tables,
        }
        normalized.update(split_backward(given["weight_times"], self.weight_memory, normalized["activation_memory"]))
        normalized.update(recomputation(self.allow_recompute, given["recompute_times"], self.checkpoint_memory,
                                        normalized["forward_times"], normalized["activation_memory"]))
        normalized.update(offload(self.allow_offload, given["offload_times"], given["reload_times"],
                                  self.shared_host_link, stages))
        normalized.update(iteration_ends({key: getattr(self, key) for key in END_INPUTS},
                                         stages, p, self.flush or self.iterations == 1))
        normalized["overlap_times"] = overlap(self.overlap_times, self.weight_times is not None, p)
        normalized.update(microbatches.check_tokens(self.microbatch_tokens, self.attention_share,
                                                    self.reference_tokens, stages, self.num_microbatches, tables,
                                                    self.sequence_slices))
        for key, value in normalized.items():
            object.__setattr__(self, key, value)
        if self.memory_limit is not None:
            object.__setattr__(self, "memory_limit", per_device("memory_limit", self.memory_limit, p, positive=False))
        if self.overlap_times and not self.microbatches_equal:
            raise ProblemError("overlap_times", dict(self.overlap_times),
                               "overlapped pairs need microbatches that cost the same (one pair cost per device)")
        if not self.microbatches_equal:  # first: a row's extreme values, not its mean, are what is out of range
            microbatches.check_spread(self)
        check_ranges(self)
        if self.memory_limit is not None:
            memory_floor.check_memory_limit(self)
        for entry in PARAMETERS:  # a list still as given (a row no mechanism expands) would make it unhashable
            object.__setattr__(self, entry.name, _frozen(getattr(self, entry.name)))

    def overlap_cost(self, pair_kind: str, device: int) -> float | None:
        """Deprecated: `problem.pairs.cost(pair_kind, device)` (None without pairs)."""
        warnings.warn("Problem.overlap_cost is deprecated: use problem.pairs.cost(kind, device)", DeprecationWarning,
                      stacklevel=2)
        return None if self.pairs is None else self.pairs.cost(pair_kind, device)

    # ----------------------------------------------------------------- the optional mechanisms
    @cached_property
    def recomputation(self) -> Recomputation | None:
        """Recomputation's durations and checkpoints, or None where it is not allowed."""
        return Recomputation(self.recompute_times, self.checkpoint_memory) if self.allow_recompute else None

    @cached_property
    def offload(self) -> Offload | None:
        """The copies' durations and host links, or None where offload is not allowed."""
        return Offload(self.offload_times, self.reload_times, self.shared_host_link) if self.allow_offload else None

    @cached_property
    def pairs(self) -> OverlappedPairs | None:
        """The overlapped pairs' costs per device, or None where no pair may run."""
        return None if self.overlap_times is None else OverlappedPairs(self.overlap_times)

    @cached_property
    def iteration_ends(self) -> IterationEnds | None:
        """The iteration's ends (`mechanisms.ends_record`); None where none takes time or memory."""
        return ends_record(self)

    @cached_property
    def microbatch_sizes(self) -> MicrobatchSizes | None:
        """Each microbatch's tokens and the cost rule's values, or None where no tokens are given."""
        given = self.microbatch_tokens is not None
        return MicrobatchSizes(self.microbatch_tokens, self.attention_share, self.reference_tokens) if given else None

    # ----------------------------------------------------------------- derived structure
    @property
    def num_stages(self) -> int:
        """S = p·v, the number of virtual stages."""
        return self.num_devices * self.chunks_per_device

    @property
    def bidirectional(self) -> bool:
        """Microbatches go both ways (placement "bidirectional"): each visits half the stages."""
        return self.placement == "bidirectional"

    @cached_property
    def routes(self) -> tuple[tuple[range, range], ...]:
        """(stages, microbatches) of each way through the pipeline (`placement.route_stages`): one
        route, or with the bidirectional placement the down route (the first half of the stages,
        the first ceil(m/2) microbatches) and the up route (the rest). Consecutive numbers each."""
        ways = route_stages(self.num_devices, self.chunks_per_device, self.placement)
        if not self.bidirectional:
            return ((ways[0], range(self.total_microbatches)),)
        down = (self.num_microbatches + 1) // 2
        return ((ways[0], range(down)), (ways[1], range(down, self.num_microbatches)))

    @property
    def route_length(self) -> int:
        """The stages one microbatch visits: S, or S/2 with the bidirectional placement."""
        return self.num_stages // 2 if self.bidirectional else self.num_stages

    def route_of_stage(self, stage: int) -> int:
        """The number of the route that visits `stage` (0 unless bidirectional)."""
        return int(self.bidirectional and stage >= self.route_length)

    def microbatches_of(self, stage: int) -> range:
        """The microbatches that visit `stage`."""
        return self.routes[self.route_of_stage(stage)][1]

    @property
    def total_microbatches(self) -> int:
        """m · iterations: microbatch ids run from 0 to this minus one."""
        return self.num_microbatches * self.iterations

    @property
    def split_backward(self) -> bool:
        """True when the backward is split into B (input gradient) and W (weight gradient)."""
        return self.weight_times is not None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The op kinds every schedule of this problem runs for each stage and microbatch: F, B, W
        (split) or F, BW (fused); R, O and L (per activation) and G (per stage) are optional."""
        return SPLIT_KINDS if self.split_backward else FUSED_KINDS

    @property
    def input_gradient_kind(self) -> str:
        """The op that sends the gradient upstream and needs the whole activation: B when split, BW when fused."""
        return BACKWARD if self.split_backward else FUSED_BACKWARD

    @property
    def gradient_kind(self) -> str:
        """The op that makes a stage's weight gradient (its reduction follows): W when split, BW when fused."""
        return WEIGHT if self.split_backward else FUSED_BACKWARD

    @property
    def num_activations(self) -> int:
        """Activations of a step, one per microbatch and stage it visits: what can be recomputed."""
        return self.route_length * self.total_microbatches

    @property
    def recomputation_matters(self) -> bool:
        """Recomputation is allowed and a memory limit could make it pay (without one it only adds work)."""
        return self.recomputation is not None and self.memory_limit is not None

    @property
    def offload_matters(self) -> bool:
        """Offload is allowed and a memory limit could make it pay (without one, keeping is as fast)."""
        return self.offload is not None and self.memory_limit is not None

    @property
    def reshard_matters(self) -> bool:
        """Re-gathers are allowed (`allow_reshard`) and a memory limit could make them pay (else a G only waits)."""
        return self.allow_reshard and self.memory_limit is not None and any(self.iteration_ends.unshard_memory)

    @property
    def mechanisms_matter(self) -> bool:
        """Some activation may be recomputed or offloaded under a memory limit (no fact assuming kept ones holds)."""
        return self.recomputation_matters or self.offload_matters

    @property
    def columns_interchangeable(self) -> bool:
        """Whether any schedule can be relabelled so that the ops of each kind and stage run in
        microbatch order (see the CP-SAT module): not once some activation may be recomputed or
        offloaded (microbatches then differ in what they hold), nor with overlapped pairs (a pair's
        B and W must stay one microbatch's), nor with sequence slices (tied to their sequence)."""
        return not (self.mechanisms_matter or self.pairs is not None or self.sequence_slices > 1)

    @property
    def num_ops(self) -> int:
        return len(self.kinds) * self.num_activations

    def device_of(self, stage: int) -> int:
        """Device holding virtual stage `stage`."""
        return stage_device(stage, self.num_devices, self.placement, self.chunks_per_device)

    def host_link(self, device: int) -> int:
        """The host link a device's copies use: its own, or its pair's (2k, 2k+1) when shared."""
        return device // 2 if self.offload is not None and self.offload.shared_host_link else device

    @cached_property
    def stages_of_device(self) -> tuple[tuple[int, ...], ...]:
        """Per device, its virtual stages in increasing order."""
        p, v = self.num_devices, self.chunks_per_device
        return tuple(tuple(device_stage(device, chunk, p, self.placement, v) for chunk in range(v))
                     for device in range(p))

    @cached_property
    def chunk_of(self) -> tuple[int, ...]:
        """Per virtual stage, its chunk: its place among its device's stages in increasing order."""
        return tuple(stage // self.num_devices for stage in range(self.num_stages))

    def _value(self, key: str, stage: int, microbatch: int | None) -> float:
        """`key`'s value on `stage`: the stage's (microbatch None, or a key without rows), or that microbatch's."""
        rows = None if microbatch is None or self.per_microbatch is None else self.per_microbatch.get(key)
        return getattr(self, key)[stage] if rows is None else rows[stage][microbatch % self.num_microbatches]

    def cost(self, kind: str, stage: int, microbatch: int | None = None) -> float:
        """Duration of one op of `kind` on virtual stage `stage`: the stage's value (the mean of
        its microbatches where they differ), or `microbatch`'s own (a re-gather's: its unshard's)."""
        return self._value(_COST_KEYS[kind], stage, microbatch)

    def memory_delta(self, kind: str, stage: int, recomputed: bool = False, microbatch: int | None = None) -> float:
        """Memory change an op causes: + at the start of F (only the checkpoint when the microbatch
        is `recomputed` on this stage), of R (the rest of the activation) and of L (all of it), - at
        the end of O (all of it), B, W or BW. The stage's value, or `microbatch`'s own."""
        activation = self._value("activation_memory", stage, microbatch)
        if kind == RELOAD:
            return activation
        if kind == OFFLOAD:
            return -activation
        if kind == FORWARD:
            return self._value("checkpoint_memory", stage, microbatch) if recomputed else activation
        if kind == RECOMPUTE:
            return activation - self._value("checkpoint_memory", stage, microbatch)
        if kind == FUSED_BACKWARD:
            return -activation
        kept = self._value("weight_memory", stage, microbatch)
        return -(activation - kept) if kind == BACKWARD else -kept

    # ----------------------------------------------------------------- microbatches that differ
    @cached_property
    def per_microbatch(self) -> dict[str, tuple[tuple[float, ...], ...]] | None:
        """Per varying key, per stage, per microbatch of one iteration; None: all cost the same."""
        return microbatches.per_microbatch(self)

    @cached_property
    def microbatch_classes(self) -> tuple[int, ...]:
        """Per microbatch of one iteration, the first that costs as it does: only one class's are interchangeable."""
        return microbatches.classes(self.per_microbatch, self.num_microbatches, self.sequence_slices)

    @cached_property
    def microbatches_equal(self) -> bool:
        """Every microbatch costs the stage's value (today's problems): one class, at the stage values
        (equal tokens off `reference_tokens` cost the same as each other, not the stage's value)."""
        return max(self.microbatch_classes) == 0 and microbatches.at_stage_values(self)

    def uniform_relaxation(self) -> Problem:
        """This problem with every microbatch costing, per key and stage, the least any does.
        Every schedule of this problem, its start times kept, is one of the relaxation (each op no
        longer, each activation no larger, slices unlinked): its optimum is no longer, its bounds hold."""
        if self.microbatches_equal:
            return self
        return microbatches.every_microbatch_at(self, min, sequence_slices=1)

    def releases(self, stage: int, microbatch: int | None = None) -> tuple[tuple[str, float], ...]:
        """(kind, amount > 0) of each op that frees part of one microbatch's activation on `stage`
        (B and W, or BW), the stage's or `microbatch`'s own: what every memory model holds per op."""
        return tuple((kind, -self.memory_delta(kind, stage, microbatch=microbatch)) for kind in self.kinds
                     if self.memory_delta(kind, stage, microbatch=microbatch) < 0)

    @cached_property
    def one_microbatch_memory(self) -> tuple[float, ...]:
        """Per device, the least memory a schedule that keeps every activation needs (`memory_floor`)."""
        return memory_floor.one_microbatch_memory(self)

    @cached_property
    def recomputation_floor(self) -> tuple[float, ...]:
        """Per device, the least memory a schedule that keeps or recomputes needs (`memory_floor`)."""
        return memory_floor.recomputation_floor(self)

    @cached_property
    def min_memory_limit(self) -> tuple[float, ...]:
        """Per device, the least memory any schedule needs, with the mechanisms allowed (`memory_floor`)."""
        return memory_floor.min_memory_limit(self)

    @cached_property
    def memory_caps(self) -> tuple[float, ...]:
        """Per device, its memory limit, or infinity without one (what capped schedules and bounds compare with)."""
        return (math.inf,) * self.num_devices if self.memory_limit is None else tuple(self.memory_limit)

    def replace(self, **changes) -> Problem:
        """A copy with some parameters changed (validated again); a cost key given anew replaces
        its rows per microbatch, as do new tokens. Rows whose microbatches all cost the stage's value
        (equal columns) are the stage values: a copy with another m keeps those, not rows of the old m."""
        if "num_microbatches" in changes and self.microbatch_tables and self.microbatches_equal:
            changes.setdefault("microbatch_tables", None)
        if "microbatch_tables" not in changes and self.microbatch_tables:
            kept = tuple((key, rows) for key, rows in self.microbatch_tables if key not in changes)
            changes["microbatch_tables"] = None if changes.get("microbatch_tokens") else kept or None
        if self.microbatch_tokens is not None and changes.get("microbatch_tables"):
            changes.setdefault("microbatch_tokens", None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The parameters as plain JSON-able values, with scalars where all stages agree and rows
        where microbatches differ (`zbopt.core.problem.form`)."""
        return form.as_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Problem:
        """Inverse of `to_dict`; unknown keys are an error."""
        known_parameters(data, PARAMETERS)
        return cls(**data)

    def describe(self) -> str:
        """One line: p, m, v, placement, backward kind, iterations (`zbopt.core.problem.form`)."""
        return form.describe(self)


Problem.__doc__ = Problem.__doc__.format(parameters=textwrap.indent(docstring_section(), "    ").strip())
