"""A model's parts in plain units: a Layer (ms and GB) and the Device it runs on.

The values here are already converted (`zbopt.core.units` reads the unit strings); these classes check
only what a Python caller could still get wrong: a negative, infinite or non-numeric value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.problem.checks import slowdown_factor
from zbopt.core.tolerance import MAX_TOTAL
from zbopt.core.units import parse_bandwidth, parse_flops, parse_memory, parse_time

__all__ = ["DEFAULT_RESERVE_SHARE", "DEVICE_KEYS", "MAX_REPEAT", "WEIGHT_MEMORY_SHARE", "Device", "Layer",
           "check_amount", "check_repeat"]

WEIGHT_MEMORY_SHARE = 0.5  # zbopt's rule for M_W when a layer gives none: half of M_B


def check_amount(key: str, value: object, optional: bool = False, most: float | None = MAX_TOTAL) -> float | None:
    """`value` as a float, finite, at least 0 and at most `most` (zbopt's range for times and
    memory; None: no cap); None passes when `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ZboptError(f"{key} = {shorten(value)}: expected a finite number, at least 0")
    if most is not None and value > most:
        raise ZboptError(f"{key} = {shorten(value)}: at most {most:g} (zbopt's range)")
    return float(value)


MAX_REPEAT = 100_000  # far above any model's layer count; a typo of 10^8 would fill the memory


def check_repeat(value: object, key: str) -> int:
    """A layer's repeat count: a whole number, at least 1, at most MAX_REPEAT."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ZboptError(f"{key} = {shorten(value)}: expected a positive whole number")
    if value > MAX_REPEAT:
        raise ZboptError(f"{key} = {value}: more than {MAX_REPEAT:,} layers")
    return value


@dataclass(frozen=True)
class Layer:
    """One layer's costs per microbatch: times in ms, memory in GB (10^9 bytes).

    `weight_ms` None means a fused backward: `backward_ms` is then the whole BW. `activation_gb`
    is M_B, what the forward keeps for the backward; `weight_activation_gb` M_W, what B keeps for
    W (default: half of M_B, zbopt's rule). `parameters_gb` is what the layer holds all step long:
    weights, gradients and optimizer state; `gradient_gb` the gradients a data-parallel reduction
    moves (None: not given; `collectives.gradient_of` then derives it from `parameters_gb` and how
    the model is trained).
    """

    name: str
    forward_ms: float
    backward_ms: float
    weight_ms: float | None
    activation_gb: float
    parameters_gb: float
    weight_activation_gb: float | None = None
    gradient_gb: float | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ZboptError(f"layer name = {shorten(self.name)}: expected a non-empty name")
        for field in ("forward_ms", "backward_ms", "activation_gb", "parameters_gb"):
            object.__setattr__(self, field, check_amount(f"layer {self.name!r}: {field}", getattr(self, field)))
        weight = check_amount(f"layer {self.name!r}: weight_ms", self.weight_ms, optional=True)
        kept = check_amount(f"layer {self.name!r}: weight_activation_gb", self.weight_activation_gb, optional=True)
        if weight is None and kept is not None:
            raise ZboptError(f"layer {self.name!r}: weight_activation_gb = {kept:g}: a fused backward (no "
                             "weight_ms) keeps nothing for W")
        if kept is not None and kept > self.activation_gb:
            raise ZboptError(f"layer {self.name!r}: weight_activation_gb = {kept:g}: more than its activation_gb "
                             f"{self.activation_gb:g} (B keeps part of what F stored)")
        if weight is not None and kept is None:
            kept = self.activation_gb * WEIGHT_MEMORY_SHARE
        object.__setattr__(self, "weight_ms", weight)
        object.__setattr__(self, "weight_activation_gb", kept)
        object.__setattr__(self, "gradient_gb", check_amount(f"layer {self.name!r}: gradient_gb", self.gradient_gb,
                                                             optional=True))

    @property
    def fused(self) -> bool:
        """True when the backward is one fused BW (no separate weight-gradient step)."""
        return self.weight_ms is None

    def to_dict(self) -> dict:
        """The layer as the profile and `zbopt costs --json` spell it (units in the keys)."""
        return {"name": self.name, "forward_ms": self.forward_ms, "backward_ms": self.backward_ms,
                "weight_ms": self.weight_ms, "activation_gb": self.activation_gb,
                "weight_activation_gb": self.weight_activation_gb, "parameters_gb": self.parameters_gb,
                "gradient_gb": self.gradient_gb}


DEVICE_KEYS = ("memory", "flops", "p2p", "reserve", "dp_bandwidth", "dp_latency", "memory_bandwidth", "comm_slowdown")
# What a plan leaves free by default: a training process holds more than its tensors (the CUDA
# context and NCCL's buffers, about 1-2 GB; the caching allocator's fragmentation, a few percent of
# a busy device), none of which a plan sees. zbopt's choice, not a measurement: give `reserve`.
DEFAULT_RESERVE_SHARE = 0.1


@dataclass(frozen=True)
class Device:
    """One GPU: its memory in GB (None: not given; a plan then needs it from a flag), its
    sustained compute in FLOP/s (None: not given; only costs from an architecture need it), the
    point-to-point latency between pipeline neighbours in ms (0 unless given), and the memory a plan
    leaves free for what a training process holds beside the model's tensors (`reserve_gb`; None:
    DEFAULT_RESERVE_SHARE of the memory). A plan fills at most `usable_gb`.

    The iteration's ends (`zbopt.planning.model.collectives`): the data-parallel interconnect, the
    bus bandwidth of one rank in GB/s (`dp_bandwidth_gbs`; None: gradient reductions not timed)
    and the latency of one step of its ring in ms; the memory bandwidth in GB/s the optimizer step
    runs at (`memory_bandwidth_gbs`; None: the step not timed); how many times slower compute runs
    while the device communicates (`comm_slowdown`, the Problem's; 1: not at all)."""

    memory_gb: float | None = None
    flops: float | None = None
    p2p_ms: float = 0.0
    reserve_gb: float | None = None
    dp_bandwidth_gbs: float | None = None
    dp_latency_ms: float = 0.0
    memory_bandwidth_gbs: float | None = None
    comm_slowdown: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "memory_gb", check_amount("device memory_gb", self.memory_gb, optional=True))
        reserve = check_amount("device reserve_gb", self.reserve_gb, optional=True)
        if reserve is not None and self.memory_gb is not None and reserve >= self.memory_gb:
            raise ZboptError(f"device reserve = {reserve:g} GB: must be less than the device's memory "
                             f"({self.memory_gb:g} GB), or nothing is left to plan with")
        object.__setattr__(self, "reserve_gb", reserve)
        for field in ("flops", "dp_bandwidth_gbs", "memory_bandwidth_gbs"):  # rates: a time is divided by them
            rate = check_amount(f"device {field}", getattr(self, field), optional=True, most=None)
            if rate == 0:
                raise ZboptError(f"device {field} = 0: must be more than 0")
            object.__setattr__(self, field, rate)
        object.__setattr__(self, "p2p_ms", check_amount("device p2p_ms", self.p2p_ms))
        object.__setattr__(self, "dp_latency_ms", check_amount("device dp_latency_ms", self.dp_latency_ms))
        object.__setattr__(self, "comm_slowdown", slowdown_factor("device.comm_slowdown", self.comm_slowdown))

    @property
    def reserve(self) -> float:
        """The GB a plan leaves free on each device: `reserve_gb`, else DEFAULT_RESERVE_SHARE of the
        memory (0 without a memory)."""
        if self.reserve_gb is not None:
            return self.reserve_gb
        return 0.0 if self.memory_gb is None else DEFAULT_RESERVE_SHARE * self.memory_gb

    @property
    def usable_gb(self) -> float | None:
        """The most a plan puts on one device (parameters and activations): the memory less the reserve."""
        return None if self.memory_gb is None else self.memory_gb - self.reserve

    @classmethod
    def from_config(cls, section: object, where: str = "device") -> Device:
        """The `device:` section, e.g. {memory: 80 GB, flops: 400 TFLOPS, p2p: 0.05 ms}."""
        if section is None:
            return cls()
        if not isinstance(section, dict):
            raise ZboptError(f"{where} = {shorten(section)}: expected a mapping with keys {', '.join(DEVICE_KEYS)}")
        unknown = [key for key in section if key not in DEVICE_KEYS]
        if unknown:
            raise ZboptError(f"{where}: unknown key {shorten(unknown[0])} (known: {', '.join(DEVICE_KEYS)})")
        memory, flops, p2p, reserve, dp_bandwidth, dp_latency, memory_bandwidth, slowdown = (section.get(key)
                                                                                           for key in DEVICE_KEYS)
        return cls(memory_gb=None if memory is None else parse_memory(memory, f"{where}.memory"),
                   flops=None if flops is None else parse_flops(flops, f"{where}.flops"),
                   p2p_ms=0.0 if p2p is None else parse_time(p2p, f"{where}.p2p"),
                   reserve_gb=None if reserve is None else parse_memory(reserve, f"{where}.reserve"),
                   dp_bandwidth_gbs=None if dp_bandwidth is None else parse_bandwidth(dp_bandwidth,
                                                                                      f"{where}.dp_bandwidth"),
                   dp_latency_ms=0.0 if dp_latency is None else parse_time(dp_latency, f"{where}.dp_latency"),
                   memory_bandwidth_gbs=None if memory_bandwidth is None else parse_bandwidth(
                       memory_bandwidth, f"{where}.memory_bandwidth"),
                   comm_slowdown=1.0 if slowdown is None else slowdown)
