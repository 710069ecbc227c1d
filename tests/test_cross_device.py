"""The k-device relaxation (`cross_device`): never above the optimum, above every single-device
bound where a neighbour's contention makes a device wait, and the groups it is tried on."""

import random

import pytest

from tests.reference import brute_force_optimum
from tests.test_overlap import brute_force_pair_optimum
from zbopt import Op, Problem, solve
from zbopt.solvers import api
from zbopt.solvers.bounds import LowerBounds, lower_bounds
from zbopt.solvers.cross_device import cross_device_bound, device_groups, group_relaxation
from zbopt.solvers.implied import heads_and_tails, implied_graph
from zbopt.solvers.overlap_pairs import as_paired
from zbopt.solvers.sequencing import chain_lags


def bounds_by_group(problem: Problem, k: int, seconds: float = 10) -> dict[tuple[int, ...], float]:
    """`cross_device_bound` of every group of k devices (heads and tails at each op's least duration)."""
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(as_paired(graph, problem) if problem.overlap_times else graph)
    return {group: cross_device_bound(problem, group, graph, heads, tails, seconds)
            for group in device_groups(problem, k)}


def optimum(problem: Problem) -> float:
    """CP-SAT's proven optimum with the driver's bounds all 0 (so it does not lean on this bound)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "lower_bounds", lambda *_args: LowerBounds())
        result = solve(problem, time_limit=30, lower_peak=False)
    assert result.status == "optimal"
    return result.objective


def test_two_devices_see_the_wait_that_one_device_cannot():
    """p = 2, V placement (device 0 holds stages 0 and 3, device 1 stages 1 and 2), m = 2, F = BW = 1,
    no latency, memory 2 on device 0 and 3 on device 1 (activations of 1).

    Device 0 holds stage 0's and stage 3's activation of a microbatch: F(0, 1) cannot start before
    BW(3, 0) has freed one (else F(3, 0) could never start), and F(3, 1) waits for BW(0, 0) too.
    BW(3, 0) ends at 5 at the earliest (F0 F1 F2 F3 BW3 of microbatch 0 in a chain), so from 5 on
    device 1 still has BW(2, 0), BW(1, 0) and, after F(0, 1) ends (>= 6), F(1, 1) and F(2, 1):
    four ops, the last ending at 9 or later. If it is F(2, 1), F(3, 1) starts at 9 or later; if
    BW(1, 0), BW(0, 0) ends at 10 or later and so does F(3, 1)'s start. Microbatch 1's last five
    ops (F3 BW3 BW2 BW1 BW0) follow: the optimum is 9 + 5 = 14 (the brute force's).

    One device alone sees device 1's ops as lags only, never that it runs them one at a time:
    from device 0, F(3, 1) can start at 8 (F(0, 1) at 5, its lag of 2), so 13; no single-device
    bound goes beyond that either; `lower_bounds` takes the two devices' 14."""
    problem = Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, memory_limit=[2, 3])
    single = lower_bounds(problem)
    assert max(value for name, value in single.by_name().items() if name != "cross_device") == 13
    assert (single.best, single.binding_bound.describe()) == (14, "cross_device on devices 0, 1")
    assert max(bounds_by_group(problem, 1).values()) == 13
    assert bounds_by_group(problem, 2) == {(0, 1): 14}
    assert brute_force_optimum(problem) == 14
    graph = implied_graph(problem)
    # started from the single-device bound, as the lead's bounds will: it proves 14 and finds it
    assert group_relaxation(problem, (0, 1), graph, *heads_and_tails(graph), 10, floor=13) == (14, 14)


@pytest.mark.parametrize("m", [1, 3])
def test_one_device_is_the_single_device_relaxation(m):
    """The closed form of test_bounds' device sequencing case (p = 2, V, F = 1, BW = 2, latency c,
    memory for one microbatch): (9 + 2c)·m + 3 + 2c, the optimum, on device 0."""
    c = 0.25
    problem = Problem(num_devices=2, num_microbatches=m, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=2, p2p_time=c, memory_limit=2)
    assert bounds_by_group(problem, 1)[(0,)] == pytest.approx((9 + 2 * c) * m + 3 + 2 * c)


def random_problem(seed: int, family: str) -> Problem:
    """Unequal whole costs, latency 0 or 0.5, memory at the floor or above it. "chunks": p = 2 or
    3, v = 1 or 2, loop or V, split or fused; "mechanisms": p = 2, recomputation or offload;
    "both ways": the bidirectional placement, p = 2, with FB pairs, FBW pairs or none by the seed."""
    rng = random.Random(seed)
    p, v, placement = rng.choice([2, 3]), rng.choice([1, 2]), rng.choice(["loop", "v"])
    if family != "chunks":
        p, v, placement = 2, (2 if family == "both ways" else 1), ("bidirectional" if family == "both ways" else "loop")
    stages = p * v
    parameters = dict(num_devices=p, num_microbatches=rng.choice([2, 3]), chunks_per_device=v, placement=placement,
                      p2p_time=rng.choice([0, 0.5]), forward_times=[rng.choice([1, 2]) for _ in range(stages)],
                      backward_times=[rng.choice([1, 2, 3]) for _ in range(stages)])
    if family != "chunks" or rng.random() < 0.5:
        parameters.update(weight_times=[rng.choice([1, 2]) for _ in range(stages)], weight_memory=0.5)
    if family == "mechanisms":
        parameters.update(rng.choice([dict(allow_recompute=True, checkpoint_memory=0.25),
                                      dict(allow_offload=True, offload_times=rng.choice([0.5, 1]))]))
    if family == "both ways" and seed % 3:
        parameters["overlap_times"] = {"FB": 2.5} if seed % 3 == 1 else {"FBW": 3.5}
    problem = Problem(**parameters)
    return problem.replace(memory_limit=[need + rng.choice([0, 0, 0.5, 1]) for need in problem.min_memory_limit])


@pytest.mark.parametrize(("family", "seed"), [("chunks", seed) for seed in range(6)]
                         + [("mechanisms", seed) for seed in range(3)] + [("both ways", seed) for seed in range(4)])
def test_no_group_bound_exceeds_the_optimum(family, seed):
    problem = random_problem(seed, family)
    best = optimum(problem)
    for k in range(1, problem.num_devices + 1):
        for group, bound in bounds_by_group(problem, k).items():
            assert bound <= best + 1e-9, (k, group)


@pytest.mark.parametrize(("changes", "today", "relaxed", "best"), [
    # offload, limit 1 (test_offload's case): the bound prices the copies beside compute
    (dict(allow_offload=True, offload_times=0.5), 12, 12, 12),
    # recomputation at limit 1: each microbatch's checkpoint held, its activation rebuilt by R
    (dict(allow_recompute=True, checkpoint_memory=0.25), 12, 13, 13),
])
def test_recomputation_and_offload_are_priced(changes, today, relaxed, best):
    """p = 2, m = 3, F = B = W = 1, limit 1: the relaxation chooses per activation."""
    problem = Problem(num_devices=2, num_microbatches=3, forward_times=1, backward_times=1, weight_times=1,
                      memory_limit=1, **changes)
    assert lower_bounds(problem).best == today
    assert max(bounds_by_group(problem, 2).values()) == relaxed
    assert optimum(problem) == best


@pytest.mark.parametrize(("pair", "today"), [({"FBW": 2.5}, 11), ({"FB": 1.5}, 10.5)])
def test_overlapped_pairs_are_counted_not_assumed(pair, today):
    """Bidirectional, p = 2, m = 4, F = B = W = 1: the pair relaxation shortens every op as if all
    paired (10 and 9; the bounds' pair count says 11 and 10.5); the relaxation with each candidate
    pair proves 11, still at most the optimum."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, weight_times=1, overlap_times=pair)
    assert lower_bounds(problem).best == today
    assert max(bounds_by_group(problem, 1).values()) == 11
    assert optimum(problem) >= max(bounds_by_group(problem, 2).values()) == 11


def test_chain_lags_of_a_group_skip_only_the_devices_left_out():
    """p = 3, F = 1, BW = 2, latency 0.5, one microbatch: from device 0 to device 2 the chain passes
    device 1 (its F and two latencies: 2; back, its BW: 3); device 1 alone waits for device 2's F
    and BW and two latencies (4); F(2) to BW(2) is on one device (0)."""
    problem = Problem(num_devices=3, num_microbatches=1, forward_times=1, backward_times=2, p2p_time=0.5)
    assert sorted(chain_lags(problem, (0, 2))) == [(Op("BW", 2, 0), Op("BW", 0, 0), 3.0),
                                                   (Op("F", 0, 0), Op("F", 2, 0), 2.0),
                                                   (Op("F", 2, 0), Op("BW", 2, 0), 0.0)]
    assert chain_lags(problem, 1) == chain_lags(problem, (1,)) == [(Op("F", 1, 0), Op("BW", 1, 0), 4.0)]


def test_groups_follow_the_routes_binding_device_first():
    def groups(placement, k, p=4, v=2, scores=None):
        return device_groups(Problem(num_devices=p, num_microbatches=4, chunks_per_device=v, placement=placement),
                             k, scores)

    assert sorted(groups("loop", 2)) == [(0, 1), (0, 3), (1, 2), (2, 3)]  # the ring: stage 3 -> stage 4
    assert sorted(groups("loop", 2, v=1)) == sorted(groups("v", 2)) == sorted(groups("bidirectional", 2)) == [
        (0, 1), (1, 2), (2, 3)]
    assert groups("v", 3, scores=[1, 2, 5, 3]) == [(1, 2, 3), (0, 1, 2)]
    assert groups("v", 2, scores=[1, 2, 5, 3]) == [(2, 3), (1, 2), (0, 1)]
    assert groups("v", 5) == [(0, 1, 2, 3)]


def test_a_weight_longer_than_its_backward_does_not_lift_the_bound_above_the_optimum():
    """Both ways, p = 2, m = 2, F = B = 1, W = 8 on stage 0, FBW pairs of 6: the tails of pairable ops
    count from their start plus their least duration (a B's W may run in its pair), not from the
    end of the B alone, which overshot to 13 over the optimum 12 (a review's counterexample)."""
    problem = Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, weight_times=[8, 1, 1, 1], overlap_times={"FBW": 6})
    assert brute_force_pair_optimum(problem) == 12
    assert max(bounds_by_group(problem, 1).values()) <= 12
    assert max(bounds_by_group(problem, 2).values()) <= 12
