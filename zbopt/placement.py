"""The placement map: which device holds each virtual stage, and what each placement needs.

The one place the V zig-zag is computed is `_zigzag`; `stage_device` and its inverse
`device_stage` both read it.
"""

from __future__ import annotations

from zbopt.errors import ProblemError

PLACEMENTS = ("loop", "v", "bidirectional")


def stage_device(stage: int, num_devices: int, placement: str) -> int:
    """Device that holds virtual stage `stage`.

    `loop` (Megatron interleaving): stage s on device s mod p.
    `v` (zig-zag, torch.distributed.pipelining's "v" style): stages 0..p-1 on devices 0..p-1,
    stages p..2p-1 back on devices p-1..0, and so on back and forth.
    `bidirectional` (DualPipe's): placed as `v` with two chunks, but stages 0..p-1 are the down
    pipeline's copies of the model's stages and p..2p-1 the up pipeline's (see `Problem`).

    >>> [stage_device(s, 3, "v") for s in range(6)]
    [0, 1, 2, 2, 1, 0]
    """
    chunk, place = divmod(stage, num_devices)
    return place if placement == "loop" else _zigzag(chunk, place, num_devices)


def device_stage(device: int, chunk: int, num_devices: int, placement: str) -> int:
    """The virtual stage of `device`'s chunk number `chunk` (its stages counted in increasing
    order): the inverse of `stage_device`.

    >>> [device_stage(0, chunk, 3, "v") for chunk in range(4)], device_stage(0, 1, 3, "loop")
    ([0, 5, 6, 11], 3)
    """
    place = device if placement == "loop" else _zigzag(chunk, device, num_devices)
    return chunk * num_devices + place


def _zigzag(chunk: int, place: int, num_devices: int) -> int:
    """The V zig-zag: even chunks run down the devices, odd ones back up, so place k of an odd
    chunk is device p-1-k (and device d holds place p-1-d of it: the map is its own inverse)."""
    return place if chunk % 2 == 0 else num_devices - 1 - place


def check_placement(placement: str, chunks_per_device: int, iterations: int, num_microbatches: int) -> None:
    """A ProblemError unless `placement` is known and the problem has what it needs (bidirectional:
    two stage copies per device, one step, microbatches both ways; see `Problem`)."""
    if placement not in PLACEMENTS:
        raise ProblemError("placement", placement, f"expected one of {', '.join(PLACEMENTS)}")
    if placement != "bidirectional":
        return
    if chunks_per_device != 2:
        raise ProblemError("chunks_per_device", chunks_per_device,
                           "placement 'bidirectional' holds two stage copies per device: expected 2")
    if iterations != 1:
        raise ProblemError("iterations", iterations, "placement 'bidirectional' models one step (the two copies' "
                                                     "gradient exchange between steps is outside the model): "
                                                     "expected 1")
    if num_microbatches < 2:
        raise ProblemError("num_microbatches", num_microbatches,
                           "placement 'bidirectional' sends microbatches both ways: expected at least 2")
