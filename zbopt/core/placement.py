"""The placement map: which device holds each virtual stage, and what each placement needs.

The one place the V zig-zag is computed is `_zigzag`; `stage_device` and its inverse
`device_stage` both read it, and `route_stages` says which stages each way through the pipeline
visits.
"""

from __future__ import annotations

from zbopt.core.errors import ProblemError

__all__ = ["PLACEMENTS", "check_placement", "device_stage", "route_stages", "stage_device"]

PLACEMENTS = ("loop", "v", "bidirectional")


def stage_device(stage: int, num_devices: int, placement: str, chunks_per_device: int | None = None) -> int:
    """Device that holds virtual stage `stage`.

    `loop` (Megatron interleaving): stage s on device s mod p.
    `v` (zig-zag, torch.distributed.pipelining's "v" style): stages 0..p-1 on devices 0..p-1,
    stages p..2p-1 back on devices p-1..0, and so on back and forth.
    `bidirectional` (two pipelines in opposite directions, see `Problem`): the first half of the
    v = 2k chunks is the down pipeline's copy of the model, placed as `v` with k chunks (k = 1,
    DualPipe's and Chimera's: devices 0..p-1; k = 2, BitPipe's V: 0..p-1 then p-1..0); the second
    half is the up pipeline's copy, its mirror image (device d -> p-1-d). `chunks_per_device` is
    read only there, and must be given there (no default that is right for one v only).

    >>> [stage_device(s, 3, "v") for s in range(6)]
    [0, 1, 2, 2, 1, 0]
    >>> [stage_device(s, 2, "bidirectional", 4) for s in range(8)]
    [0, 1, 1, 0, 1, 0, 0, 1]
    """
    chunk, place = divmod(stage, num_devices)
    if placement == "loop":
        return place
    if placement == "bidirectional":
        route, chunk = divmod(chunk, _ways_chunks(chunks_per_device))
        return _mirror(route, _zigzag(chunk, place, num_devices), num_devices)
    return _zigzag(chunk, place, num_devices)


def device_stage(device: int, chunk: int, num_devices: int, placement: str,
                 chunks_per_device: int | None = None) -> int:
    """The virtual stage of `device`'s chunk number `chunk` (its stages counted in increasing
    order): the inverse of `stage_device`.

    >>> [device_stage(0, chunk, 3, "v") for chunk in range(4)], device_stage(0, 1, 3, "loop")
    ([0, 5, 6, 11], 3)
    """
    if placement == "loop":
        place = device
    elif placement == "bidirectional":
        route, within = divmod(chunk, _ways_chunks(chunks_per_device))
        place = _zigzag(within, _mirror(route, device, num_devices), num_devices)
    else:
        place = _zigzag(chunk, device, num_devices)
    return chunk * num_devices + place


def _ways_chunks(chunks_per_device: int | None) -> int:
    """A way's chunks per device with the bidirectional placement: half of them."""
    if chunks_per_device is None:
        raise TypeError("the bidirectional placement's map needs chunks_per_device")
    return chunks_per_device // 2


def route_stages(num_devices: int, chunks_per_device: int, placement: str) -> tuple[range, ...]:
    """The stages of each way through the pipeline, in the order a microbatch visits them: all
    of them, or with the bidirectional placement the down route's (the first half) and the up
    route's (the second half).

    >>> route_stages(2, 4, "bidirectional")
    (range(0, 4), range(4, 8))
    """
    stages = num_devices * chunks_per_device
    if placement != "bidirectional":
        return (range(stages),)
    return range(stages // 2), range(stages // 2, stages)


def _zigzag(chunk: int, place: int, num_devices: int) -> int:
    """The V zig-zag: even chunks run down the devices, odd ones back up, so place k of an odd
    chunk is device p-1-k (and device d holds place p-1-d of it: the map is its own inverse)."""
    return place if chunk % 2 == 0 else num_devices - 1 - place


def _mirror(route: int, device: int, num_devices: int) -> int:
    """The up route (1) runs on the down route's (0) devices mirrored, d -> p-1-d."""
    return num_devices - 1 - device if route else device


def check_placement(placement: str, chunks_per_device: int, iterations: int, num_microbatches: int) -> None:
    """A ProblemError unless `placement` is known and the problem has what it needs (bidirectional:
    an even number of chunks, half for each copy of the model, one step, microbatches both ways;
    see `Problem`)."""
    if placement not in PLACEMENTS:
        raise ProblemError("placement", placement, f"expected one of {', '.join(PLACEMENTS)}")
    if placement != "bidirectional":
        return
    if chunks_per_device % 2:
        raise ProblemError("chunks_per_device", chunks_per_device, "placement 'bidirectional' holds as many chunks "
                                                                   "of the up copy of the model as of the down "
                                                                   "copy: expected an even number (2: DualPipe's, "
                                                                   "4: BitPipe's two V's)")
    if iterations != 1:
        raise ProblemError("iterations", iterations, "placement 'bidirectional' models one step (the two copies' "
                                                     "gradient exchange between steps is outside the model): "
                                                     "expected 1")
    if num_microbatches < 2:
        raise ProblemError("num_microbatches", num_microbatches,
                           "placement 'bidirectional' sends microbatches both ways: expected at least 2")
