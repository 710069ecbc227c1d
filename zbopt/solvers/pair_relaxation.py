"""The pair relaxation: a problem without overlapped pairs whose lower bounds also bound the problem
with them."""

from __future__ import annotations

import itertools

from zbopt.problem import Problem


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
    if not problem.overlap_times:
        return problem
    split = problem.split_backward
    ratio = [1.0] * problem.num_devices
    for device, stages in enumerate(problem.stages_of_device):
        for kind, _ in problem.overlap_times:
            cost = problem.overlap_cost(kind, device)
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
