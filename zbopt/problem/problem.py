"""The pipeline problem: devices, microbatches, chunks, placement, costs, latency and memory.

A `Problem` is immutable and validated on construction; everything else in zbopt (the op DAG,
schedules, bounds, solvers) derives from it. Per-stage quantities are stored as tuples with one
entry per *virtual stage* (S = p·v); per-device quantities with one entry per device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from zbopt import checks, memory_floor, microbatches, problem_form, slices
from zbopt.checks import boolean, is_number, known_parameters, per_device, per_stage, plain, positive_int
from zbopt.errors import ProblemError
from zbopt.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, FUSED_KINDS, OFFLOAD, RECOMPUTE, RELOAD, SPLIT_KINDS, WEIGHT
from zbopt.mechanisms import offload, overlap, recomputation, split_backward
from zbopt.placement import check_placement, device_stage, route_stages, stage_device
from zbopt.tolerance import check_ranges

PerStage = float | Sequence[float]
_COST_KEYS = {FORWARD: "forward_times", BACKWARD: "backward_times", WEIGHT: "weight_times",
              FUSED_BACKWARD: "backward_times", RECOMPUTE: "recompute_times", OFFLOAD: "offload_times",
              RELOAD: "reload_times"}  # where each kind's duration per virtual stage is


@dataclass(frozen=True)
class Problem:
    """One pipeline-parallel training step (or several, see `iterations`) to be scheduled.

    Parameters
    ----------
    num_devices : p, the pipeline devices.
    num_microbatches : m, microbatches per iteration.
    chunks_per_device : v, model chunks each device holds; S = p·v virtual stages.
    placement : "loop", "v" or "bidirectional", see `zbopt.placement.stage_device`. Bidirectional (DeepSeek's
        DualPipe, Chimera; BitPipe with v = 4) needs an even v and one iteration: microbatches
        0..ceil(m/2)-1 go down, through stages 0..S/2-1, the others up, through S/2..S-1 on the
        mirrored devices: stage S/2+s is the up copy of the model's stage s (give it the same costs).
        The second copy of the parameters is outside the memory model (it counts activations), and
        so is the exchange of the two copies' gradients after the step.
    forward_times, backward_times : cost of F and of the backward per virtual stage (scalar = all).
        backward_times is the input-gradient B when weight_times is given, else the fused BW.
    weight_times : cost of the weight-gradient W per virtual stage; None means a fused backward.
    p2p_time : latency added to every dependency between ops on different devices.
    activation_memory : M_B per virtual stage, allocated when F starts (ZB paper, Table 1).
    weight_memory : M_W per virtual stage, the part of M_B that B keeps for W. Only with a split
        backward; default half of M_B. B frees M_B - M_W when it ends, W frees M_W.
    memory_limit : per-device cap on held memory (scalar = all devices), or None for no cap.
    iterations : optimizer steps back to back. Microbatch j belongs to iteration j // m.
    flush : with a flush (default), stage s updates its weights between iterations, so its
        forwards of iteration k+1 wait for all its gradient ops (W or BW) of iteration k. Without
        (PipeDream-2BW's double-buffered weights), iterations need not wait for each other; the
        second weight copy this costs is not in the memory model.
    allow_recompute : a schedule may recompute an activation instead of keeping it (Megatron-LM's
        full recomputation, per stage and microbatch): F then keeps only `checkpoint_memory`, and
        a recompute op R (cost `recompute_times`) re-runs the forward before its backward,
        holding the whole activation again from its start. Off by default.
    recompute_times : cost of R per virtual stage; default the forward's cost. Only with
        allow_recompute.
    checkpoint_memory : what a recomputed microbatch keeps from F to R (its stage input) per
        virtual stage, at most activation_memory; required with allow_recompute (no silent
        default: it depends on the model).
    allow_offload : a schedule may offload an activation to host memory instead of keeping it
        (PipeOffload, Wan et al., ICML 2025): an offload op O copies it out after its F, on the
        device's device-to-host copy lane, freeing it when it ends; a reload op L copies it back on
        the host-to-device lane, holding it again from its start, and ends before its backward.
        Copies run beside compute (PCIe is full duplex: one lane each way), never overlapping on
        a lane. An activation is kept, recomputed or offloaded. Off by default.
    offload_times : duration of O per virtual stage (one activation's bytes over the host link);
        required with allow_offload (no silent default: it depends on the hardware).
    reload_times : duration of L per virtual stage; default offload_times.
    shared_host_link : devices 2k and 2k+1 share one host link (PipeOffload's pairing of ranks,
        its `offloading.py`): one copy at a time each way per pair instead of per device.
        Default false: every device has its own link.
    overlap_times : what an overlapped pair costs, by pair kind (DualPipe's "F&B", a forward
        overlapped with another microbatch's backward on one device): "FB", a forward with an
        input-gradient B (split backward only), and "FBW", a forward with a full backward (B and W,
        or BW when fused); each a number or one per device, e.g. {"FBW": 2.5}. A schedule may then
        run such a pair as one op of that cost, which starts once every member's input is ready
        and ends all of them (`Schedule`). None (default): no pairs; a pair kind not given cannot
        be used.
    microbatch_tokens, attention_share, reference_tokens : microbatches that differ: each one's
        tokens, the share of F's and B's time that grows with the square of the length, and the
        length the per-stage costs are for (default the mean); see `zbopt.microbatches`. Or give
        forward_times, backward_times, weight_times or activation_memory as rows, one per
        virtual stage, of one value per microbatch (kept in `microbatch_tables`).
    sequence_slices : k > 1 splits each sequence into k slices (Seq1F1B), which are the microbatches:
        m counts slices, microbatch_tokens sequences; see `zbopt.slices`. Default 1.

    Raises
    ------
    ProblemError naming the parameter when a value is invalid.
    """

    num_devices: int
    num_microbatches: int
    chunks_per_device: int = 1
    placement: str = "loop"
    forward_times: PerStage = 1.0
    backward_times: PerStage = 2.0
    weight_times: PerStage | None = None
    p2p_time: float = 0.0
    activation_memory: PerStage = 1.0
    weight_memory: PerStage | None = None
    memory_limit: PerStage | None = None
    iterations: int = 1
    flush: bool = True
    allow_recompute: bool = False
    recompute_times: PerStage | None = None
    checkpoint_memory: PerStage | None = None
    allow_offload: bool = False
    offload_times: PerStage | None = None
    reload_times: PerStage | None = None
    shared_host_link: bool = False
    overlap_times: object = None  # a mapping as given; stored as ((pair kind, per-device costs), ...)
    microbatch_tokens: Sequence[int] | None = None
    attention_share: PerStage | None = None
    reference_tokens: float | None = None
    microbatch_tables: object = None  # ((key, rows), ...), from the cost keys given as rows
    sequence_slices: int = 1

    def __post_init__(self) -> None:
        """Check every value, in the order of the fields, and store the normalised forms."""
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, plain(getattr(self, field.name)))
        p = positive_int("num_devices", self.num_devices)
        positive_int("num_microbatches", self.num_microbatches)
        v = positive_int("chunks_per_device", self.chunks_per_device)
        positive_int("iterations", self.iterations)
        boolean("flush", self.flush)
        checks.check_op_count(self)
        check_placement(self.placement, v, self.iterations, self.num_microbatches)
        slices.check_slices(self.sequence_slices, self.num_microbatches, self.placement == "bidirectional",
                            self.allow_recompute is True or self.allow_offload is True)
        stages = p * v
        given, tables = microbatches.take_tables({key: getattr(self, key) for key in microbatches.TABLE_KEYS},
                                                 self.microbatch_tables, stages, self.num_microbatches)
        normalized = {
            "forward_times": per_stage("forward_times", given["forward_times"], stages),
            "backward_times": per_stage("backward_times", given["backward_times"], stages),
            "activation_memory": per_stage("activation_memory", given["activation_memory"], stages, positive=False),
            "microbatch_tables": tables,
        }
        if not is_number(self.p2p_time) or self.p2p_time < 0:
            raise ProblemError("p2p_time", self.p2p_time, "expected a number >= 0")
        normalized["p2p_time"] = float(self.p2p_time)
        normalized.update(split_backward(given["weight_times"], self.weight_memory, normalized["activation_memory"]))
        normalized.update(recomputation(self.allow_recompute, given["recompute_times"], self.checkpoint_memory,
                                        normalized["forward_times"], normalized["activation_memory"]))
        normalized.update(offload(self.allow_offload, given["offload_times"], given["reload_times"],
                                  self.shared_host_link, stages))
        normalized["overlap_times"] = overlap(self.overlap_times, self.weight_times is not None, p)
        normalized.update(microbatches.check_tokens(self.microbatch_tokens, self.attention_share,
                                                    self.reference_tokens, stages, self.num_microbatches, tables,
                                                    self.sequence_slices))
        for key, value in normalized.items():
            object.__setattr__(self, key, value)
        if self.memory_limit is not None:
            object.__setattr__(self, "memory_limit", per_device("memory_limit", self.memory_limit, p, positive=False))
        if self.overlap_times and not self.microbatches_equal:
            raise ProblemError("overlap_times", dict(self.overlap_times), "overlapped pairs need microbatches "
                                                                          "that cost the same (a pair's cost is one "
                                                                          "per device)")
        check_ranges(self)
        if not self.microbatches_equal:
            check_ranges(microbatches.every_microbatch_at(self, max, sequence_slices=1, memory_limit=None))
        if self.memory_limit is not None:
            memory_floor.check_memory_limit(self)

    def overlap_cost(self, pair_kind: str, device: int) -> float | None:
        """What a pair of `pair_kind` costs on `device`, or None when no such pair may run."""
        for kind, costs in self.overlap_times or ():
            if kind == pair_kind:
                return costs[device]
        return None

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
        (split) or F, BW (fused). A recompute R, or an offload O and reload L, are optional (per
        recomputed or offloaded activation)."""
        return SPLIT_KINDS if self.split_backward else FUSED_KINDS

    @property
    def input_gradient_kind(self) -> str:
        """The op that sends the gradient upstream and needs the whole activation: B when split, BW
        when fused (a recompute precedes it)."""
        return BACKWARD if self.split_backward else FUSED_BACKWARD

    @property
    def num_activations(self) -> int:
        """Activations of a step, one per microbatch and stage it visits: what can be recomputed."""
        return self.route_length * self.total_microbatches

    @property
    def recomputation_matters(self) -> bool:
        """Recomputation is allowed and a memory limit could make it pay: without a limit a
        recompute only adds work, and every fact about kept activations still holds."""
        return self.allow_recompute and self.memory_limit is not None

    @property
    def offload_matters(self) -> bool:
        """Offload is allowed and a memory limit could make it pay (without one, keeping is as fast)."""
        return self.allow_offload and self.memory_limit is not None

    @property
    def mechanisms_matter(self) -> bool:
        """Some activation may be recomputed or offloaded under a memory limit: microbatches then
        differ in what they hold, and no fact that assumes kept activations holds."""
        return self.recomputation_matters or self.offload_matters

    @property
    def columns_interchangeable(self) -> bool:
        """Whether any schedule can be relabelled so that the ops of each kind and stage run in
        microbatch order (see the CP-SAT module): not once some activation may be recomputed or
        offloaded (microbatches then differ in what they hold), nor with overlapped pairs (a pair's
        B and W must stay one microbatch's), nor with sequence slices (tied to their sequence)."""
        return not (self.mechanisms_matter or self.overlap_times or self.sequence_slices > 1)

    @property
    def num_ops(self) -> int:
        return len(self.kinds) * self.num_activations

    def device_of(self, stage: int) -> int:
        """Device holding virtual stage `stage`."""
        return stage_device(stage, self.num_devices, self.placement, self.chunks_per_device)

    def host_link(self, device: int) -> int:
        """The host link a device's copies use: its own, or its pair's (2k, 2k+1) when shared."""
        return device // 2 if self.shared_host_link else device

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
        """`key`'s value on `stage`: the stage's (microbatch None), or that microbatch's."""
        if microbatch is None or self.per_microbatch is None:
            return getattr(self, key)[stage]
        return self.per_microbatch[key][stage][microbatch % self.num_microbatches]

    def cost(self, kind: str, stage: int, microbatch: int | None = None) -> float:
        """Duration of one op of `kind` on virtual stage `stage`: the stage's value (the mean of
        its microbatches where they differ), or `microbatch`'s own."""
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
        """Per device, its memory limit, or infinity without one (what a capped list schedule or a
        per-device bound compares against)."""
        return (math.inf,) * self.num_devices if self.memory_limit is None else tuple(self.memory_limit)

    def replace(self, **changes) -> Problem:
        """A copy with some parameters changed (validated again); a cost key given anew replaces
        its rows per microbatch, as do new tokens."""
        if "microbatch_tables" not in changes and self.microbatch_tables:
            kept = tuple((key, rows) for key, rows in self.microbatch_tables if key not in changes)
            changes["microbatch_tables"] = None if changes.get("microbatch_tokens") else kept or None
        if self.microbatch_tokens is not None and changes.get("microbatch_tables"):
            changes.setdefault("microbatch_tokens", None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The parameters as plain JSON-able values, with scalars where all stages agree and rows
        where microbatches differ (`zbopt.problem_form`)."""
        return problem_form.as_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Problem:
        """Inverse of `to_dict`; unknown keys are an error."""
        known_parameters(data, dataclasses.fields(cls))
        return cls(**data)

    def describe(self) -> str:
        """One line: p, m, v, placement, backward kind, iterations (`zbopt.problem_form`)."""
        return problem_form.describe(self)
