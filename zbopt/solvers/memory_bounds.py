"""Lower bounds from the memory limit: the memory-time every device's activations must hold, and,
where a device holds one whole activation at a time, the spans that cannot overlap (see
`memory_bound`'s Notes)."""

from __future__ import annotations

from typing import NamedTuple

import networkx as nx

from zbopt.core.dag import earliest_finish, one_per_route, op_graph
from zbopt.core.kinds import FORWARD, WEIGHT
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.tolerance import memory_ceiling

__all__ = ["activation_lifetimes", "memory_bound", "microbatch_memory_bound", "whole_activations_bound",
           "whole_or_offloaded_bound"]


def activation_lifetimes(problem: Problem) -> list[tuple[float, float]]:
    """Per stage, the least time from F(s) start to the end of B(s) and of W(s) (or BW(s))."""
    single = one_per_route(problem)
    graph = op_graph(single)
    lifetimes = []
    for stage in range(problem.num_stages):
        forward = Op(FORWARD, stage, single.microbatches_of(stage)[0])
        finish = earliest_finish(graph.subgraph(nx.descendants(graph, forward) | {forward}))
        frees = [op for op in finish if op.stage == stage and op.kind != FORWARD]
        by_kind = {op.kind: finish[op] for op in frees}
        input_end = by_kind.get("B", by_kind.get("BW"))
        lifetimes.append((input_end, by_kind.get("W", input_end)))
    return lifetimes


def microbatch_memory_bound(problem: Problem) -> float:
    """`memory_bound` where microbatches differ and every activation is kept: per device, the
    memory-time of each microbatch's own activations over its own least lifetimes (`_chain_ends`),
    over its memory limit; 0 without limits or where recomputation or offload matter (their
    prices are `memory_bound`'s, on `Problem.uniform_relaxation`). Each activation counts as much
    as it holds, where the relaxation counts every one as the smallest."""
    if problem.memory_limit is None or problem.mechanisms_matter:
        return 0.0
    table = op_table(problem)
    integral = [0.0] * problem.num_devices
    for stages, microbatches in problem.routes:
        for microbatch in microbatches:
            begins, ends = _chain_ends(problem, table, stages, microbatch)
            for stage in stages:
                to_input = ends[stage] - begins[stage]
                weight = table.duration[table.index(Op(WEIGHT, stage, microbatch))] if problem.split_backward else 0.0
                integral[problem.device_of(stage)] += _memory_time(problem, stage, (to_input, to_input + weight),
                                                                   microbatch)
    return max((held / limit for held, limit in zip(integral, problem.memory_limit, strict=True) if held > 0),
               default=0.0)


def _chain_ends(problem: Problem, table, stages: range, microbatch: int) -> tuple[dict[int, float], dict[int, float]]:
    """Per stage of the route, when the microbatch's forward starts and its input gradient ends
    if its chain (forwards down the route, input gradients back up) runs without waiting."""
    chain = [Op(FORWARD, stage, microbatch) for stage in stages] + \
        [Op(problem.input_gradient_kind, stage, microbatch) for stage in reversed(stages)]
    begins, ends, now = {}, {}, 0.0
    for op in chain:
        index = table.index(op)
        now += table.latency[index]  # 0 for the first: it has no predecessor
        if op.kind == FORWARD:
            begins[op.stage] = now
        now += table.duration[index]
        if op.kind != FORWARD:
            ends[op.stage] = now
    return begins, ends


def memory_bound(problem: Problem, lifetimes: list[tuple[float, float]], device_load: list[float]) -> float:
    """makespan >= (memory-time every device must integrate) / (its memory limit); 0 without limits.

    Notes
    -----
    Every microbatch's activation on stage s is held from its forward's start: all of it for at
    least the least time to the end of its input gradient (B, or BW), and the part W keeps
    (weight_memory) for at least the least time to the end of W (`lifetimes`, see
    `activation_lifetimes`). Summed over the microbatches and the device's stages, this
    memory-time (the integral) must fit under the device's limit during the makespan, so
    makespan >= integral / limit.

    With recomputation allowed, a recomputed activation holds its checkpoint for at least F and
    the whole activation from R's start for at least R + B (the part W keeps, R + B + W), which can
    be far less, but each costs its device R more work: `device_load[d]` (a bound on device d's
    makespan from its mandatory work) grows by it. Recomputing x_s microbatches of stage s,
    makespan >= max(load + sum x_s R_s, (integral - sum x_s saving_s) / limit); the least of this
    over real x_s in [0, M] bounds every choice (a fractional knapsack: recompute in decreasing
    saving per unit of R). Where the limit cannot hold two whole activations, so much more
    follows that `whole_activations_bound` is taken too (without offload: it assumes none), or
    with offload `whole_or_offloaded_bound`.

    With offload allowed, an activation may instead be held from F's start to its O's end and
    from its L's start, at no cost in compute: each activation counts the less of kept and
    offloaded (`_offloaded_memory_time`); the copy lanes' own capacity is not used here.
    """
    if problem.memory_limit is None:
        return 0.0
    best = 0.0
    for device, stages in enumerate(problem.stages_of_device):
        limit = problem.memory_limit[device]
        if problem.recomputation_matters and problem.offload is None:
            best = max(best, whole_activations_bound(problem, device, lifetimes, device_load[device]))
        if problem.offload_matters:
            best = max(best, whole_or_offloaded_bound(problem, device, lifetimes, device_load[device]))
        integral = 0.0
        trades = []  # (saving of memory-time per unit of recompute time, recompute time available)
        for stage in stages:
            count = len(problem.microbatches_of(stage))
            held = _memory_time(problem, stage, lifetimes[stage])
            if problem.offload_matters:
                held = min(held, _offloaded_memory_time(problem, stage))
            integral += count * held
            if problem.recomputation_matters:
                saving = held - _recomputed_memory_time(problem, stage)
                if saving > 0:
                    recompute = problem.recomputation.times[stage]
                    trades.append((saving / recompute, count * recompute))
        if integral <= 0:  # a device that holds nothing (its limit is positive otherwise)
            continue
        if not problem.recomputation_matters:
            best = max(best, integral / limit)
        else:
            best = max(best, _trade_off(device_load[device], integral / limit, trades, limit))
    return best


def whole_activations_bound(problem: Problem, device: int, lifetimes: list[tuple[float, float]],
                            device_load: float) -> float:
    """A bound on the makespan from `device` when its limit holds one whole activation at a time
    (any two of its stages' activations exceed it); 0 otherwise.

    Notes
    -----
    An activation is whole from the start of its F (kept) or of its R (recomputed) to the end of
    its input gradient; two whole at once would pass the limit, so these spans are disjoint. A
    recomputed span lasts at least R + B. A kept span lasts at least F + rt + B, rt the least time
    its microbatch's chain spends away from the device between F and B (`lifetimes`), during which
    the device can only run ops that need no whole activation: W, and F of recomputed
    activations. A stage whose chain comes back to the device before its B (every stage but the
    device's last) cannot be kept: the later stage's whole span would fall within its own. The
    device's first op starts after the least head, its last ends before the least tail (together
    `device_load` less its work), and between them lie the disjoint spans and the W and
    recomputed F that found no room in a kept span. With k_s activations of stage s kept, the
    makespan is at least edges + sum_s [k_s (F + rt + B) + (M - k_s)(R + B)] + max(0, sum_s
    [(M - k_s) F + M W - k_s rt]); its least over real k_s in [0, M] is a linear program, whose
    value is max over lambda in [0, 1] of edges + sum_s M (R + B) + lambda · sum_s M (F + W) +
    sum_s M · min(0, a_s - lambda c_s), a_s = F + rt - R, c_s = F + rt (its dual), taken at the
    breakpoints.

    Where not even one whole activation and one checkpoint fit, no two activations of the device
    are held at once at all (were two held at once, the one released first is whole just before
    its release, while the other holds at least its checkpoint): each holds the device from its F's
    start for at least F + rt + B, and only W fits in the gaps.

    0 with the bidirectional placement: each route's stages on the device are not the device's
    stages, and the argument above (only the device's last stage kept) does not carry over.
    """
    device_view = _one_whole_at_a_time(problem, device, device_load)
    if device_view is None or problem.bidirectional:
        return 0.0
    stages, ceiling, whole, weight, edges = device_view
    count = problem.total_microbatches
    away = {s: lifetimes[s][0] - problem.forward_times[s] - problem.backward_times[s] for s in stages}
    if whole + min(problem.recomputation.checkpoint_memory[s] for s in stages) > ceiling:  # one stage per device: a
        # device with more stages cannot go below one activation and a checkpoint (`min_memory_limit`)
        held = sum(count * (problem.forward_times[s] + away[s] + problem.backward_times[s]) for s in stages)
        return edges + held + max(0.0, sum(count * (weight[s] - away[s]) for s in stages))
    base = edges + sum(count * (problem.recomputation.times[s] + problem.backward_times[s]) for s in stages)
    outside = sum(count * (problem.forward_times[s] + weight[s]) for s in stages)
    last = max(stages)  # the only stage that may be kept
    c = problem.forward_times[last] + away[last]
    a = c - problem.recomputation.times[last]
    breakpoints = {0.0, 1.0} | ({a / c} if c > 0 and 0 < a / c < 1 else set())
    return max(base + share * outside + count * min(0.0, a - share * c) for share in breakpoints)


def whole_or_offloaded_bound(problem: Problem, device: int, lifetimes: list[tuple[float, float]],
                             device_load: float) -> float:
    """With offload allowed, a bound on the makespan from `device` when its limit holds one whole
    activation at a time (with recomputation allowed too: not even one and a checkpoint); 0
    otherwise.

    Notes
    -----
    An activation is whole on its device while kept, from F's start to its input gradient's end
    (at least F + rt + B, rt the least time its chain spends away from the device, as in
    `whole_activations_bound`), or while offloaded, from F's start to O's end and from L's start
    to the input gradient's end (at least F + O + L + B). No two of these spans overlap, nor, when
    the part W keeps and a whole activation exceed the limit, a span and the time from a B to its
    W (at least W). A recomputed activation is whole from R's start (at least R + B); while it
    holds its checkpoint no other can be whole (the limit holds no activation and a checkpoint),
    so its F, a compute op, lies outside every span and every W: it counts F + R + B. All lie
    between the device's least head and least tail (`device_load` less its work), so the makespan
    is at least those edges plus, per activation, the cheapest way.
    """
    device_view = _one_whole_at_a_time(problem, device, device_load)
    if device_view is None:
        return 0.0
    stages, ceiling, whole, weight, total = device_view
    if problem.recomputation_matters and \
            whole + min(problem.recomputation.checkpoint_memory[s] for s in stages) <= ceiling:
        return 0.0  # a recomputed activation's F may run while another is whole
    for s in stages:
        count = len(problem.microbatches_of(s))
        forward, backward = problem.forward_times[s], problem.backward_times[s]
        ways = [lifetimes[s][0],  # kept: F + rt + B
                forward + problem.offload.offload_times[s] + problem.offload.reload_times[s] + backward]
        if problem.recomputation_matters:
            ways.append(forward + problem.recomputation.times[s] + backward)
        weight_alone = problem.split_backward and problem.weight_memory[s] + whole > ceiling
        total += count * (min(ways) + (weight[s] if weight_alone else 0.0))
    return total


class _OneWhole(NamedTuple):
    """A device whose limit holds one whole activation at a time (any two exceed it): its stages,
    its ceiling (`memory_ceiling`), its least activation, W's cost per virtual stage (0 when
    fused), and its edges, the least head plus the least tail (its `device_load` less its work)."""

    stages: tuple[int, ...]
    ceiling: float
    whole: float
    weight: tuple[float, ...]
    edges: float


def _one_whole_at_a_time(problem: Problem, device: int, device_load: float) -> _OneWhole | None:
    """What the bounds on a device that holds one whole activation at a time start from, or None
    when it holds two."""
    stages = problem.stages_of_device[device]
    ceiling = memory_ceiling(problem.memory_caps[device])
    whole = min(problem.activation_memory[s] for s in stages)
    if 2 * whole <= ceiling:
        return None
    weight = problem.weight_times if problem.split_backward else (0.0,) * problem.num_stages
    work = sum(len(problem.microbatches_of(s)) * (problem.forward_times[s] + problem.backward_times[s] + weight[s])
               for s in stages)
    return _OneWhole(stages, ceiling, whole, weight, device_load - work)


def _memory_time(problem: Problem, stage: int, lifetime: tuple[float, float], microbatch: int | None = None) -> float:
    """The least memory-time one kept activation of `stage` holds (the stage's, or `microbatch`'s
    own) over `lifetime`, (to its input gradient, to its W)."""
    activation = problem.memory_delta(FORWARD, stage, microbatch=microbatch)
    kept = -problem.memory_delta(WEIGHT, stage, microbatch=microbatch) if problem.split_backward else 0.0
    to_input, to_weight = lifetime
    return (activation - kept) * to_input + kept * to_weight


def _recomputed_memory_time(problem: Problem, stage: int) -> float:
    """The least memory-time one recomputed activation of `stage` holds: its checkpoint from F's
    start to R's (at least F), then all of it for R and its backward."""
    return problem.recomputation.checkpoint_memory[stage] * problem.forward_times[stage] + \
        _held_from_restore(problem, stage, problem.recomputation.times[stage])


def _offloaded_memory_time(problem: Problem, stage: int) -> float:
    """The least memory-time one offloaded activation of `stage` holds: all of it for F and its O,
    then from its L's start for L and its backward (the part W keeps, also W)."""
    return problem.activation_memory[stage] * (problem.forward_times[stage] + problem.offload.offload_times[stage]) + \
        _held_from_restore(problem, stage, problem.offload.reload_times[stage])


def _held_from_restore(problem: Problem, stage: int, restore: float) -> float:
    """The least memory-time of an activation of `stage` from the start of the op that makes it
    whole again (R or L, lasting `restore`): all of it for that op and the backward, the part W
    keeps also for W."""
    backward = problem.backward_times[stage]
    weight = problem.weight_times[stage] if problem.split_backward else 0.0
    return _memory_time(problem, stage, (restore + backward, restore + backward + weight))


def _trade_off(load: float, memory: float, trades: list[tuple[float, float]], limit: float) -> float:
    """min over recompute time y of max(load + y, memory - saved(y) / limit), saved(y) taking the
    best `trades` (rate, amount) first: where the rising and the falling line meet, or an end."""
    for rate, amount in sorted(trades, reverse=True):
        if load >= memory:
            break
        step = (memory - load) / (1 + rate / limit)  # the y where the lines meet within this trade
        if step <= amount:
            return load + step
        load, memory = load + amount, memory - amount * rate / limit
    return max(load, memory)
