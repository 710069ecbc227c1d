"""The pair relaxation: a problem without overlapped pairs whose lower bounds also bound the problem
with them."""

from __future__ import annotations

import itertools
import math

from zbopt.core.kinds import FORWARD, PAIR_MEMBERS
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.solvers.implied import heads_and_tails, implied_graph
from zbopt.solvers.overlap_pairs import as_paired

__all__ = ["pair_count_bound", "pair_relaxed"]


def pair_relaxed(problem: Problem) -> Problem:
    """The problem whose bounds also bound `problem` where overlapped pairs may run
    (`Problem.overlap_times`): on each device, every F, B and W (or BW) shortened by the least
    ratio, over the pair kinds and the device's stages, of a pair's cost to its members' costs
    run one after the other (when below 1), and no pairs. The problem itself without pairs.

    Notes
    -----
    Any schedule of `problem` gives one of the relaxed problem no longer: a pair started at s with
    cost c becomes its members one after another from s, together at most c; every other op keeps
    its start and ends no later. No op starts before its inputs' (earlier) ends, the forwards
    allocate at the same moments and the backwards free no later, so the relaxed schedule is valid
    and ends no later: the relaxed problem's lower bounds bound `problem`'s optimum ("the cheapest
    way to run each op").
    """
    if problem.pairs is None:
        return problem
    split = problem.split_backward
    ratio = [1.0] * problem.num_devices
    for device, stages in enumerate(problem.stages_of_device):
        for kind, costs in problem.pairs.costs:
            cost = costs[device]
            for forward, backward in itertools.product(stages, stages):
                members = problem.forward_times[forward] + problem.backward_times[backward]
                if kind == "FBW" and split:
                    members += problem.weight_times[backward]
                ratio[device] = min(ratio[device], cost / members)
    scale = [ratio[problem.device_of(stage)] for stage in range(problem.num_stages)]

    def scaled(costs):
        return None if costs is None else [c * r for c, r in zip(costs, scale, strict=True)]

    return problem.replace(forward_times=scaled(problem.forward_times), backward_times=scaled(problem.backward_times),
                           weight_times=scaled(problem.weight_times), overlap_times=None)


def pair_count_bound(problem: Problem) -> float:
    """A lower bound on the makespan where overlapped pairs may run: per device, its least head,
    its work less what the pairs it can form save, and its least tail (0 without pairs).

    Notes
    -----
    A pair runs a forward F with another microbatch's input gradient B (and its W, for FBW) as one
    op of cost c: it saves at most s, the largest F + B (+ W) - c over the device's stages and pair
    kinds. Each op is in at most one pair, so the pairs number at most the device's F and at most
    its B that can pair at all by the makespan C: an F can when max(its head, the least head of a
    B) + c_min + its tail <= C (the pair starts once both members are ready, ends c_min later at
    the earliest, and the F's successors follow), a B the same way. The pairs lie, one after
    another on the device, after the least head H of the ops of the kind ready later (an F with
    no B ready cannot pair) and before C less the larger of the least tails of the F and of the B:
    at most (C - H - tail) / c_min of them. The device is busy for its work less s per pair, from
    its least head to C less its least tail. Heads and tails come from the op graph with the
    first stages' forwards in order (`implied.symmetric_successors` with pairs) and each op at its
    least duration (`overlap_pairs.as_paired`, in whole units, rounded down). With n pairs the
    bound is max(head + work - s·n + tail, the least C at which n pairs fit); the least over n is
    the bound.
    """
    if problem.pairs is None:
        return 0.0
    graph = as_paired(implied_graph(problem), problem)
    heads, tails = heads_and_tails(graph)
    per_device: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    for op in graph:
        per_device[graph.nodes[op]["device"]].append(op)
    return max(_device_pair_bound(problem, device, ops, heads, tails) for device, ops in enumerate(per_device))


def _device_pair_bound(problem: Problem, device: int, ops: list[Op], heads: dict[Op, float],
                       tails: dict[Op, float]) -> float:
    """`pair_count_bound` on one device."""
    saving, least_cost = _pair_saving(problem, device)
    work = sum(problem.cost(op.kind, op.stage) for op in ops)
    plain = min(heads[op] for op in ops) + work + min(tails[op] for op in ops)
    forwards = [op for op in ops if op.kind == FORWARD]
    backwards = [op for op in ops if op.kind == problem.input_gradient_kind]
    if saving <= 0 or not forwards or not backwards:
        return plain
    ready_f, ready_b = min(heads[op] for op in forwards), min(heads[op] for op in backwards)
    need_f = sorted(max(heads[op], ready_b) + least_cost + tails[op] for op in forwards)
    need_b = sorted(max(heads[op], ready_f) + least_cost + tails[op] for op in backwards)
    edges = max(ready_f, ready_b) + max(min(tails[op] for op in forwards), min(tails[op] for op in backwards))
    best = plain
    for count in range(1, min(len(need_f), len(need_b)) + 1):
        fits = max(need_f[count - 1], need_b[count - 1], edges + count * least_cost)
        best = min(best, max(plain - saving * count, fits))
    return best


def _pair_saving(problem: Problem, device: int) -> tuple[float, float]:
    """(the most one pair on `device` saves against its members run alone, the least a pair costs)."""
    stages = problem.stages_of_device[device]
    saving, least_cost = 0.0, math.inf
    for kind, costs in problem.pairs.costs:
        cost = costs[device]
        least_cost = min(least_cost, cost)
        members = PAIR_MEMBERS[kind, problem.split_backward]
        for forward, backward in itertools.product(stages, stages):
            alone = problem.forward_times[forward] + sum(problem.cost(member, backward) for member in members[1:])
            saving = max(saving, alone - cost)
    return saving, least_cost
