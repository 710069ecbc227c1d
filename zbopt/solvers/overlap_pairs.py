"""Overlapped pairs in the full model (`Problem.overlap_times`): the candidate pairs, each an
optional interval under its own literal, and each member run alone or in exactly one chosen pair."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import networkx as nx

from zbopt.core.kinds import BACKWARD, FORWARD, PAIR_MEMBERS, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.solvers.cp_parts import OpVars

__all__ = ["MAX_PAIR_CANDIDATES", "PairChoice", "as_paired", "candidate_window", "least_duration", "pair_choices"]

MAX_PAIR_CANDIDATES = 20_000  # every candidate pair up to this many (p = 4, m = 32 both ways: 4,096 per kind)


class PairChoice(NamedTuple):
    """A candidate overlapped pair: its members (the forward first), the literal under which they
    run as one op, that op's interval, and for a pair with a whole backward (FBW, split) the
    literal under which its B is in any such pair (W then starts with B, not after it)."""

    members: tuple[Op, ...]
    chosen: object
    interval: object
    whole_backward: object = None


def least_duration(problem: Problem, op: Op) -> int:
    """The least time `op` can take: its own cost, or less in a pair of a cheaper cost (where the
    problem has pairs, `Problem.overlap_times`)."""
    size = int(problem.cost(op.kind, op.stage, op.microbatch))
    if op.kind not in problem.kinds or problem.pairs is None:
        return size
    device = problem.device_of(op.stage)
    return min([size, *(int(cost[device]) for kind, cost in problem.pairs.costs
                        if op.kind in PAIR_MEMBERS[kind, problem.split_backward])])


def as_paired(graph: nx.DiGraph, problem: Problem) -> nx.DiGraph:
    """The graph for heads and tails where ops may pair: each op at its least duration
    (`least_duration`), and W free to start with its B (in an FBW pair they start together)."""
    paired = graph.copy()
    for op in paired:
        paired.nodes[op]["duration"] = least_duration(problem, op)
    whole = problem.split_backward and "FBW" in problem.pairs.kinds
    for source, target in paired.edges():
        if whole and source.kind == BACKWARD and target == Op(WEIGHT, source.stage, source.microbatch):
            paired.edges[source, target]["latency"] = -paired.nodes[source]["duration"]
    return paired


def candidate_window(problem: Problem, given: int | None) -> tuple[int, bool]:
    """(window, whether it leaves pairs out) for `pair_choices`: `given`, or every pair while
    they number at most MAX_PAIR_CANDIDATES, else the stages a microbatch visits."""
    full = max(len(microbatches) for _, microbatches in problem.routes) - 1
    if given is None:
        given = full if _pair_count(problem, full) <= MAX_PAIR_CANDIDATES else problem.route_length
    return given, given < full


def _pair_count(problem: Problem, window: int) -> int:
    """How many candidate pairs `pair_choices` makes with `window` (at most; same-microbatch ones
    are left out there)."""
    count = 0
    for stages in problem.stages_of_device:
        for forward_stage, backward_stage in itertools.product(stages, stages):
            backwards = len(problem.microbatches_of(backward_stage))
            count += sum(min(backwards, place + window + 1) - max(0, place - window)
                         for place in range(len(problem.microbatches_of(forward_stage))))
    return count * len(problem.pairs.costs)


def pair_choices(model, problem: Problem, ops: dict[Op, OpVars], horizon: int,
                 window: int) -> tuple[list[PairChoice], dict[Op, OpVars]]:
    """The candidate overlapped pairs: on each device, a forward and a backward of another
    microbatch whose positions in their stages' microbatch order are at most `window` apart, for
    each pair kind; and the new variables of every member, which runs alone (its own interval,
    now optional) or in exactly one chosen pair (starting with it, ending when it ends)."""
    pairs, ends = _candidates(model, problem, ops, horizon, window)
    members = {op: _alone_or_paired(model, problem, op, ops[op].start, options, horizon)
               for op, options in ends.items()}
    return _whole_backwards(model, pairs), members


def _candidates(model, problem: Problem, ops: dict[Op, OpVars], horizon: int,
                window: int) -> tuple[list[PairChoice], dict[Op, list]]:
    """The candidate pairs, and per member the (literal, end) of each pair it may run in."""
    ends: dict[Op, list] = {}
    pairs = []
    for device, stages in enumerate(problem.stages_of_device):
        for kind, costs in problem.pairs.costs:
            cost = int(costs[device])
            kinds = PAIR_MEMBERS[kind, problem.split_backward]
            for forward_stage, backward_stage in itertools.product(stages, stages):
                forwards, backwards = problem.microbatches_of(forward_stage), problem.microbatches_of(backward_stage)
                for place, first in enumerate(forwards):
                    for other in backwards[max(0, place - window):place + window + 1]:
                        members = (Op(FORWARD, forward_stage, first),
                                   *(Op(member, backward_stage, other) for member in kinds[1:]))
                        if first == other or not all(member in ops for member in members):
                            continue  # one microbatch's backward waits for its own forward
                        name = "_".join(map(str, members))
                        chosen = model.NewBoolVar(f"pair_{name}")
                        begin = model.NewIntVar(0, horizon, f"pair_start_{name}")
                        for member in members:
                            model.Add(ops[member].start == begin).OnlyEnforceIf(chosen)
                            ends.setdefault(member, []).append((chosen, begin + cost))
                        pairs.append(PairChoice(members, chosen, model.NewOptionalFixedSizeIntervalVar(
                            begin, cost, chosen, f"pair_{len(pairs)}")))
    return pairs, ends


def _alone_or_paired(model, problem: Problem, op: Op, start, options: list, horizon: int) -> OpVars:
    """A pair member's variables: alone (its own optional interval) or in exactly one of the pairs
    in `options` (literal, end), its end a variable."""
    alone = model.NewBoolVar(f"alone_{op}")
    model.AddExactlyOne([alone, *(chosen for chosen, _ in options)])
    size = int(problem.cost(op.kind, op.stage, op.microbatch))
    finish = model.NewIntVar(0, horizon, f"end_{op}")
    model.Add(finish == start + size).OnlyEnforceIf(alone)
    for chosen, pair_end in options:
        model.Add(finish == pair_end).OnlyEnforceIf(chosen)
    return OpVars(start, finish, model.NewOptionalFixedSizeIntervalVar(start, size, alone, f"op_{op}"))


def _whole_backwards(model, pairs: list[PairChoice]) -> list[PairChoice]:
    """The pairs, each of F, B and W with the literal under which its B is in any such pair (its W
    then starts with it)."""
    with_weight: dict[Op, list[int]] = {}  # B -> the pairs of F, B and W it is in
    for number, pair in enumerate(pairs):
        if len(pair.members) == 3:
            with_weight.setdefault(pair.members[1], []).append(number)
    pairs = list(pairs)
    for backward, numbers in with_weight.items():
        whole = model.NewBoolVar(f"whole_{backward}")  # B is in one of them
        chosen = [pairs[number].chosen for number in numbers]
        model.AddBoolOr(chosen).OnlyEnforceIf(whole)
        for literal in chosen:
            model.AddImplication(literal, whole)
        for number in numbers:
            pairs[number] = pairs[number]._replace(whole_backward=whole)
    return pairs
