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

from zbopt import memory_floor
from zbopt.checks import boolean, is_number, known_parameters, per_device, per_stage, plain, positive_int
from zbopt.errors import ProblemError, clip
from zbopt.kinds import (
    BACKWARD,
    FORWARD,
    FUSED_BACKWARD,
    FUSED_KINDS,
    OFFLOAD,
    RECOMPUTE,
    RELOAD,
    SPLIT_KINDS,
    WEIGHT,
)
from zbopt.mechanisms import offload, overlap, recomputation, split_backward
from zbopt.placement import check_placement, device_stage, stage_device
from zbopt.tolerance import check_ranges

# The most ops a problem may have. A simulated op costs about 400 bytes (generator's Op, the
# simulator's arrays: measured on zb-h1, p = 32, m = 4096), so 20M ops fill some 8 GB; larger ones
# would end in a MemoryError (or an OverflowError) instead of a message. The largest documented
# workload (the benchmarks' p = 64, m = 4096, v = 2, split backward: ~1.6M ops) is 12x below it.
MAX_OPS = 20_000_000

PerStage = float | Sequence[float]
_COST_KEYS = {FORWARD: "forward_times", BACKWARD: "backward_times", WEIGHT: "weight_times",
              FUSED_BACKWARD: "backward_times", RECOMPUTE: "recompute_times", OFFLOAD: "offload_times",
              RELOAD: "reload_times"}  # where each kind's duration per virtual stage is
_MECHANISM_KEYS = {"allow_recompute": ("recompute_times", "checkpoint_memory"),
                   "allow_offload": ("offload_times", "reload_times", "shared_host_link")}


def _check_op_count(problem: Problem) -> None:
    """Refuse a problem of more than MAX_OPS ops before anything is allocated for its stages,
    naming its largest count (the likeliest typo)."""
    if problem.num_ops > MAX_OPS:
        counts = {"num_devices": problem.num_devices, "chunks_per_device": problem.chunks_per_device,
                  "num_microbatches": problem.num_microbatches, "iterations": problem.iterations}
        key = max(counts, key=counts.__getitem__)
        ops = clip(f"{problem.num_ops:,}")
        raise ProblemError(key, counts[key], f"the problem has {ops} ops, more than zbopt holds "
                                             f"(MAX_OPS = {MAX_OPS:,})")


@dataclass(frozen=True)
class Problem:
    """One pipeline-parallel training step (or several, see `iterations`) to be scheduled.

    Parameters
    ----------
    num_devices : p, the pipeline devices.
    num_microbatches : m, microbatches per iteration.
    chunks_per_device : v, model chunks each device holds; S = p·v virtual stages.
    placement : "loop", "v" or "bidirectional", see `zbopt.placement.stage_device`. Bidirectional (DeepSeek's
        DualPipe) needs chunks_per_device = 2 and one iteration: microbatches 0..ceil(m/2)-1 go down
        the pipeline, through virtual stages 0..p-1 on devices 0..p-1; the others go up, through
        virtual stages p..2p-1 on devices p-1..0, so stage p+s is the up copy of the model's stage
        s (give it the same costs) and each microbatch visits p of the 2p stage copies, one per
        device. The second copy of the parameters is outside the memory model (it counts
        activations), and so is the exchange of the two copies' gradients after the step.
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

    def __post_init__(self) -> None:
        """Check every value, in the order of the fields, and store the normalised forms."""
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, plain(getattr(self, field.name)))
        p = positive_int("num_devices", self.num_devices)
        positive_int("num_microbatches", self.num_microbatches)
        v = positive_int("chunks_per_device", self.chunks_per_device)
        positive_int("iterations", self.iterations)
        boolean("flush", self.flush)
        _check_op_count(self)
        check_placement(self.placement, v, self.iterations, self.num_microbatches)
        stages = p * v
        normalized = {
            "forward_times": per_stage("forward_times", self.forward_times, stages),
            "backward_times": per_stage("backward_times", self.backward_times, stages),
            "activation_memory": per_stage("activation_memory", self.activation_memory, stages, positive=False),
        }
        if not is_number(self.p2p_time) or self.p2p_time < 0:
            raise ProblemError("p2p_time", self.p2p_time, "expected a number >= 0")
        normalized["p2p_time"] = float(self.p2p_time)
        normalized.update(split_backward(self.weight_times, self.weight_memory, normalized["activation_memory"]))
        normalized.update(recomputation(self.allow_recompute, self.recompute_times, self.checkpoint_memory,
                                        normalized["forward_times"], normalized["activation_memory"]))
        normalized.update(offload(self.allow_offload, self.offload_times, self.reload_times, self.shared_host_link,
                                  stages))
        normalized["overlap_times"] = overlap(self.overlap_times, self.weight_times is not None, p)
        for key, value in normalized.items():
            object.__setattr__(self, key, value)
        if self.memory_limit is not None:
            object.__setattr__(self, "memory_limit", per_device("memory_limit", self.memory_limit, p, positive=False))
        check_ranges(self)
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
        """Microbatches go both ways (placement "bidirectional"): each visits p of the 2p stages."""
        return self.placement == "bidirectional"

    @cached_property
    def routes(self) -> tuple[tuple[range, range], ...]:
        """(stages, microbatches) of each way through the pipeline: one route through every stage,
        or with the bidirectional placement the down route (stages 0..p-1, the first ceil(m/2)
        microbatches) and the up route (stages p..2p-1, the rest). Each route's stages and
        microbatches are consecutive numbers."""
        if not self.bidirectional:
            return ((range(self.num_stages), range(self.total_microbatches)),)
        p, down = self.num_devices, (self.num_microbatches + 1) // 2
        return ((range(p), range(down)), (range(p, 2 * p), range(down, self.num_microbatches)))

    @property
    def route_length(self) -> int:
        """The stages one microbatch visits: S, or p with the bidirectional placement."""
        return self.num_devices if self.bidirectional else self.num_stages

    def route_of_stage(self, stage: int) -> int:
        """The number of the route that visits `stage` (0 unless bidirectional)."""
        return int(self.bidirectional and stage >= self.num_devices)

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
        B and W must stay one microbatch's)."""
        return not (self.mechanisms_matter or self.overlap_times)

    @property
    def num_ops(self) -> int:
        return len(self.kinds) * self.num_activations

    def device_of(self, stage: int) -> int:
        """Device holding virtual stage `stage`."""
        return stage_device(stage, self.num_devices, self.placement)

    def host_link(self, device: int) -> int:
        """The host link a device's copies use: its own, or its pair's (2k, 2k+1) when shared."""
        return device // 2 if self.shared_host_link else device

    @cached_property
    def stages_of_device(self) -> tuple[tuple[int, ...], ...]:
        """Per device, its virtual stages in increasing order."""
        p, v = self.num_devices, self.chunks_per_device
        return tuple(tuple(device_stage(device, chunk, p, self.placement) for chunk in range(v)) for device in range(p))

    @cached_property
    def chunk_of(self) -> tuple[int, ...]:
        """Per virtual stage, its chunk: its place among its device's stages in increasing order."""
        return tuple(stage // self.num_devices for stage in range(self.num_stages))

    def cost(self, kind: str, stage: int) -> float:
        """Duration of one op of `kind` on virtual stage `stage`."""
        return getattr(self, _COST_KEYS[kind])[stage]

    def memory_delta(self, kind: str, stage: int, recomputed: bool = False) -> float:
        """Memory change an op causes: + at the start of F (only the checkpoint when the microbatch
        is `recomputed` on this stage), of R (the rest of the activation) and of L (all of it), - at
        the end of O (all of it), B, W or BW."""
        activation = self.activation_memory[stage]
        if kind == RELOAD:
            return activation
        if kind == OFFLOAD:
            return -activation
        if kind == FORWARD:
            return self.checkpoint_memory[stage] if recomputed else activation
        if kind == RECOMPUTE:
            return activation - self.checkpoint_memory[stage]
        if kind == FUSED_BACKWARD:
            return -activation
        kept = self.weight_memory[stage]
        return -(activation - kept) if kind == BACKWARD else -kept

    def releases(self, stage: int) -> tuple[tuple[str, float], ...]:
        """(kind, amount) of each op that frees part of one microbatch's activation on `stage`
        (B and W when split, BW when fused), amount > 0: what every memory model holds per op."""
        return tuple((kind, -self.memory_delta(kind, stage)) for kind in self.kinds
                     if self.memory_delta(kind, stage) < 0)

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
        """A copy with some parameters changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The parameters as plain JSON-able values, with scalars where all stages agree."""

        def compact(values):
            if values is None or isinstance(values, (int, float, str)):
                return values
            return values[0] if len(set(values)) == 1 else list(values)

        data = {field.name: compact(getattr(self, field.name)) for field in dataclasses.fields(self)}
        if self.overlap_times is None:
            del data["overlap_times"]
        else:
            data["overlap_times"] = {kind: compact(costs) for kind, costs in self.overlap_times}
        # the keys of mechanisms not allowed stay out, as in the configs that predate them
        for switch, keys in _MECHANISM_KEYS.items():
            if not data[switch]:
                for key in (switch, *keys):
                    del data[key]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Problem:
        """Inverse of `to_dict`; unknown keys are an error."""
        known_parameters(data, dataclasses.fields(cls))
        return cls(**data)

    def describe(self) -> str:
        """One line: p, m, v, placement, backward kind, iterations."""
        backward = "split backward (F, B, W)" if self.split_backward else "fused backward (F, BW)"
        text = (
            f"p={self.num_devices} devices, m={self.num_microbatches} microbatches, "
            f"v={self.chunks_per_device} chunk(s) ({self.placement} placement), {backward}"
        )
        if self.bidirectional:
            (_, down), (_, up) = self.routes
            text += f", {len(down)} down and {len(up)} up"
        if self.iterations > 1:
            text += f", {self.iterations} iterations" + ("" if self.flush else " without flush")
        if self.allow_recompute:
            text += ", recomputation allowed"
        if self.allow_offload:
            text += ", offload allowed" + (" (host link shared by device pairs)" if self.shared_host_link else "")
        if self.overlap_times:
            text += ", overlapped pairs " + " and ".join(kind for kind, _ in self.overlap_times)
        return text
