"""The least memory a schedule of a problem needs per device, by what the problem allows (every
activation kept, recomputation, offload): the floor below which a memory limit fits no schedule.

Each function takes a `Problem` (whose cached attributes of the same names call them).
"""

from __future__ import annotations

from zbopt.core.errors import ProblemError
from zbopt.core.kinds import FORWARD
from zbopt.core.problem.mechanisms import unshard_windows

__all__ = ["check_memory_limit", "min_memory_limit", "one_microbatch_memory", "recomputation_floor"]


def _largest(problem, floor) -> tuple[float, ...]:
    """Per device, the most `floor(activation, checkpoint)` gives over the microbatches (per
    stage, one microbatch's values: each must run; all of one class cost the same). With sequence
    slices, over the sequences, each stage's values summed over the sequence's slices: a slice's
    forward waits for the earlier slices' and their backwards for its own, so all of a sequence's
    slices on a stage are held at once."""
    slices = problem.sequence_slices

    def values(first, key):
        rows = problem.per_microbatch[key] if problem.per_microbatch and key in problem.per_microbatch else None
        if rows is None:
            stage_values = getattr(problem, key)
            return None if stage_values is None else tuple(value * slices for value in stage_values)
        return tuple(sum(row[first:first + slices]) for row in rows)

    firsts = sorted(set(problem.microbatch_classes)) if slices == 1 else range(0, problem.num_microbatches, slices)
    floors = [floor(values(j, "activation_memory"), values(j, "checkpoint_memory")) for j in firsts]
    if problem.allow_reshard:
        floors.append(_gathered_by_the_first_forward(problem))
    if problem.iteration_ends is not None and any(problem.iteration_ends.gradient_memory):
        floors.append(_at_the_first_gradient_op(problem))
    return tuple(max(device) for device in zip(*floors, strict=True))


def _at_the_first_gradient_op(problem) -> tuple[float, ...]:
    """Per device, the most over its stages s of what it must hold around s's first gradient op
    (W, or BW) of an iteration, where gradients are held until their reduction (`gradient_memory`):
    s's unsharded gradients, taken then, and the least of two cases. Either a forward of s starts
    after that op has started: the gradients are still held then (its own gradient op comes later,
    and the reduction after that), beside that microbatch's whole activation, which it holds at
    its F, R or L, and the gathered parameters then held (`_gathered`). Or every forward of s in
    the iteration has started before: that op's microbatch holds what it keeps until the op ends,
    each other microbatch the least it can hold before its own gradient op (W's kept part; less
    with a checkpoint; 0 offloaded), and s its own parameters (a split backward may have run every
    W of an earlier stage, freeing its parameters, before s's first W; a fused one cannot: the
    earlier stage's last BW follows s's BW of that microbatch)."""
    gradients, kind, m = problem.iteration_ends.gradient_memory, problem.gradient_kind, problem.num_microbatches

    def held(s: int, stages) -> float:
        firsts = [j for j in problem.microbatches_of(s) if j < m]
        whole = min(problem.memory_delta(FORWARD, s, microbatch=j) for j in firsts)
        kept = [-problem.memory_delta(kind, s, microbatch=j) for j in firsts]
        least = [0.0 if problem.allow_offload else
                 min(own, problem.memory_delta(FORWARD, s, recomputed=True, microbatch=j)) if problem.allow_recompute
                 else own for j, own in zip(firsts, kept, strict=True)]
        parameters = _gathered(problem, stages, s)
        own_parameters = problem.iteration_ends.unshard_memory[s] if problem.split_backward else parameters
        return min(whole + parameters, min(kept) + sum(sorted(least)[:len(firsts) - 1]) + own_parameters)

    return tuple(max(gradients[s] + held(s, stages) for s in stages) for stages in problem.stages_of_device)


def _gathered_by_the_first_forward(problem) -> tuple[float, ...]:
    """Per device, what it holds when its first forward starts, where stages may be resharded
    (`allow_reshard`, which lets `_gathered` count a stage's own only): that forward's activation
    (the smallest any microbatch has there) and the gathered parameters of every stage whose unshard
    has started by then. The unshards run back to back from time 0 in stage order and a forward on
    stage s starts after s's has ended; no stage is resharded before the device's first forward."""
    windows = unshard_windows(problem)
    held = problem.iteration_ends.unshard_memory
    rows = (problem.per_microbatch or {}).get("activation_memory")

    def smallest(stage: int) -> float:
        return min(rows[stage]) if rows is not None else problem.activation_memory[stage]

    return tuple(min(smallest(s) + sum(held[e] for e in stages if windows[e][0] <= windows[s][1]) for s in stages)
                 for stages in problem.stages_of_device)


def _gathered(problem, stages, upto: int) -> float:
    """FSDP's gathered parameters (`unshard_memory`) a device holding `stages` has while one
    microbatch's op on stage `upto` runs: those of its stages up to `upto` on the same route. Their
    unshards come first, in stage order, and each one's last gradient op after that microbatch's
    backward there, which follows the op. 0 without them; only `upto`'s own where a stage may be
    resharded after its forwards (`allow_reshard`: an earlier stage done with its forwards may have
    freed them; `_gathered_by_the_first_forward` counts what none can have freed yet)."""
    ends = problem.iteration_ends
    if ends is None:
        return 0.0
    if problem.allow_reshard:
        return ends.unshard_memory[upto]
    route = problem.route_of_stage(upto)
    return sum(ends.unshard_memory[s] for s in stages if s <= upto and problem.route_of_stage(s) == route)


def one_microbatch_memory(problem) -> tuple[float, ...]:
    """Per device, one microbatch's activations on all its stages (with the bidirectional
    placement, on those of its route: the larger of the two ways, not their sum), the largest
    microbatch's where they differ, and the gathered parameters then held (`_gathered`): the
    least memory a schedule that keeps every activation needs. A microbatch's forward on a
    device's last stage runs while its earlier stages there still hold their activations (their
    backwards come later); running one microbatch at a time needs no more."""
    return _largest(problem, lambda activation, _: tuple(
        max(sum(activation[s] for s in stages if s in route) + _gathered(problem, stages, max(route_stages))
            for route, _ in problem.routes if (route_stages := [s for s in stages if s in route]))
        for stages in problem.stages_of_device))


def recomputation_floor(problem) -> tuple[float, ...]:
    """Per device, the least memory a schedule that keeps or recomputes needs: the most, over
    the device's stages s (and the microbatches), of stage s's whole activation plus the
    checkpoints of its earlier stages there on the same route. When a microbatch's R (or kept F)
    on s starts, those earlier stages have run their forwards and not yet their backwards, so
    each holds at least its checkpoint. One microbatch at a time, every activation recomputed
    and each W right after its B, needs no more. Only with allow_recompute (it needs
    checkpoint_memory)."""
    route = problem.route_of_stage
    return _largest(problem, lambda activation, checkpoint: tuple(
        max(activation[s] + sum(checkpoint[e] for e in stages if e < s and route(e) == route(s))
            + _gathered(problem, stages, s) for s in stages)
        for stages in problem.stages_of_device))


def min_memory_limit(problem) -> tuple[float, ...]:
    """Per device, the least memory any schedule needs, with the mechanisms allowed.

    Keeping every activation: `one_microbatch_memory`. With recomputation: `recomputation_floor`.
    With offload: the device's largest activation (an R, L or F of stage s holds all of s's
    activation; one microbatch at a time, every other activation offloaded before the next
    forward, needs no more). With one stage per device all are the activation. Each with FSDP's
    gathered parameters held then (`_gathered`).
    """
    if problem.allow_offload:
        return _largest(problem, lambda activation, _: tuple(max(activation[s] + _gathered(problem, stages, s)
                                                                 for s in stages)
                                                             for stages in problem.stages_of_device))
    return problem.recomputation_floor if problem.allow_recompute else problem.one_microbatch_memory


def check_memory_limit(problem) -> None:
    """A ProblemError naming the first device whose limit (already one per device) is below its
    `min_memory_limit`, and what it must hold."""
    for device, limit in enumerate(problem.memory_limit):
        needed = problem.min_memory_limit[device]
        if limit < needed - 1e-12:
            raise ProblemError("memory_limit", limit, f"device {device} must hold {_floor_reason(problem)} "
                                                      f"({needed:g}); no schedule fits below that")


def _floor_reason(problem) -> str:
    ends = problem.iteration_ends
    held = [(what, key) for key, what in (("unshard_memory", "gathered parameters"), ("gradient_memory", "gradients"))
            if ends is not None and any(getattr(ends, key))]
    whats, keys = zip(*held, strict=True) if held else ((), ())
    gathered = f" and its {' and '.join(whats)} ({', '.join(keys)})" if held else ""
    if problem.allow_offload:
        return f"its largest stage's activation{gathered}, with offload"
    if problem.allow_recompute:
        return f"one stage's activation and the checkpoints of its earlier stages{gathered}, with recomputation"
    if problem.sequence_slices > 1:
        return "one sequence's activations (all its slices) on its stages" + gathered
    return "one microbatch's activations on its stages" + (" (of one route)" if problem.bidirectional else "") \
        + gathered
