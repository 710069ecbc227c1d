"""The optimal block against brute force over blocks, the published blocks and the simulator."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from zbopt import Op, Problem, simulate
from zbopt.core.errors import ZboptError
from zbopt.core.ticks import tick_scale
from zbopt.schedules.slot_model import v_half_peak, v_min_peak
from zbopt.solvers.blocks import Block, block_schedule, published_block, steady_peak
from zbopt.solvers.blocks.search import optimal_block


def _held(offsets: dict[str, int], period: int, limit: float | None) -> bool:
    """Brute force: the repeated block's memory (F frees half at B's end, half at W's end) counted
    copy by copy over one period deep in the steady state, for p = 2, v = 1, unit costs."""
    if limit is None:
        return True
    deep = 100 * period
    for device in (0, 1):
        start, b_end, w_end = offsets[f"F{device}"], offsets[f"B{device}"] + 1, offsets[f"W{device}"] + 1
        for moment in range(deep, deep + period):
            level = sum(0.5 * ((start + k * period <= moment < b_end + k * period)
                               + (start + k * period <= moment < w_end + k * period)) for k in range(0, 2 * deep))
            if level > limit:
                return False
    return True


def _fits_modulo(times: list[int], period: int) -> bool:
    phases = sorted(t % period for t in times)
    return len(set(phases)) == len(phases)  # unit ops on integer phases: distinct phases, no overlap


def _brute_force_block(limit: float | None, horizon: int = 12) -> tuple[int, int]:
    """(least T, least length at that T) over integer blocks of p = 2, v = 1, F = B = W = 1."""
    for period in itertools.count(3):
        best = None
        for f1, b1, b0, w1, w0 in itertools.product(range(1, horizon), repeat=5):
            offsets = {"F0": 0, "F1": f1, "B1": b1, "B0": b0, "W1": w1, "W0": w0}
            if not (b1 >= f1 + 1 and b0 >= b1 + 1 and w1 >= b1 + 1 and w0 >= b0 + 1):
                continue
            if not (_fits_modulo([0, b0, w0], period) and _fits_modulo([f1, b1, w1], period)):
                continue
            length = max(offsets.values()) + 1
            if (best is None or length < best) and _held(offsets, period, limit):
                best = length
        if best is not None:
            return period, best


@pytest.mark.parametrize("limit", [None, 2.0, 1.5, 1.0])
def test_optimal_block_agrees_with_brute_force(limit):
    problem = Problem(num_devices=2, num_microbatches=4, forward_times=1, backward_times=1, weight_times=1,
                      memory_limit=limit)
    found = optimal_block(problem, time_limit=20)
    period, length = _brute_force_block(limit)
    assert found.status == "optimal"
    assert (found.block.interval, found.block.length) == (period, length)
    assert found.least_interval == period


@pytest.mark.parametrize("p", [2, 3, 4])
def test_optimal_block_is_no_slower_than_the_published_at_their_memory(p):
    """F = B = W, whole activations held to W: at V-Min's, V-Half's and V-ZB's peak the optimal
    block repeats every 6 slots, as theirs do (none can do better: 6 is a device's work)."""
    for name, limit in (("v-min", v_min_peak(p)), ("v-half", v_half_peak(p)), ("v-zb", 2 * p)):
        problem = Problem(num_devices=p, num_microbatches=4 * p, chunks_per_device=2, placement="v",
                          forward_times=1, backward_times=1, weight_times=1, weight_memory=1, memory_limit=limit)
        found = optimal_block(problem, time_limit=20)
        published = published_block(name, problem.replace(memory_limit=None))
        assert found.block.interval <= published.interval == 6
        assert found.status == "optimal"
        assert found.block.length <= published.length


@pytest.mark.parametrize("seed", range(6))
def test_optimal_block_builds_a_valid_schedule_within_the_limit(seed):
    """Unequal costs and latency: the block's steady peak is within the limit and its schedule is
    valid under it (the simulator, strict); T is at least a device's work per microbatch."""
    rng = random.Random(seed)
    p = rng.randint(2, 4)
    v = rng.choice([1, 2])
    stages = p * v
    problem = Problem(num_devices=p, num_microbatches=rng.randint(2, 3 * p), chunks_per_device=v,
                      placement=rng.choice(["loop", "v"]), forward_times=[rng.randint(2, 4) for _ in range(stages)],
                      backward_times=[rng.randint(2, 5) for _ in range(stages)],
                      weight_times=[rng.randint(1, 2) for _ in range(stages)], p2p_time=rng.choice([0, 1]))
    limit = max(problem.min_memory_limit) * rng.choice([1, 1.5, 2, 3])
    problem = problem.replace(memory_limit=limit)
    found = optimal_block(problem, time_limit=5)
    assert all(peak <= limit + 1e-9 for peak in steady_peak(found.block))
    run = simulate(problem, block_schedule(found.block), strict=True)
    assert run.valid
    work = max(sum(problem.cost(kind, s) for kind in problem.kinds for s in stages)
               for stages in problem.stages_of_device)
    assert found.block.interval >= work - 1e-9
    assert found.least_interval <= found.block.interval


def test_optimal_block_always_has_a_block_even_without_time_or_a_fitting_published_one():
    """At the memory floor no published block fits; with almost no time the search still answers
    with a block within the limit, at worst one microbatch's ops one after another (T at most
    their work plus one latency per hop)."""
    problem = Problem(num_devices=3, num_microbatches=6, chunks_per_device=2, forward_times=2, backward_times=3,
                      weight_times=1, p2p_time=1)
    problem = problem.replace(memory_limit=problem.min_memory_limit)
    found = optimal_block(problem, time_limit=0.05)
    assert found.start == "none"
    assert all(peak <= limit + 1e-9 for peak, limit in zip(steady_peak(found.block), problem.memory_limit, strict=True))
    hops = 2 * (problem.num_stages - 1)
    assert found.block.interval <= problem.num_stages * (2 + 3 + 1) + hops * 1 + 1e-9
    assert simulate(problem, block_schedule(found.block), strict=True).valid


def test_optimal_block_time_limit_must_be_positive():
    problem = Problem(num_devices=2, num_microbatches=2)
    with pytest.raises(ZboptError, match="time_limit = 0"):
        optimal_block(problem, time_limit=0)
    assert Op("F", 0, 0) in optimal_block(problem, time_limit=5).block.offsets


def test_optimal_block_starts_from_a_group_block_and_keeps_a_tiny_latency():
    """Interleaved 1F1B's block holds p microbatches: its first microbatch alone seeds the search.
    A latency far below the tick resolution still holds in the answer (it is at least one tick)."""
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1, p2p_time=3)
    found = optimal_block(problem, time_limit=5)
    assert found.block.interval == found.least_interval == 6 and found.status == "optimal"
    tiny = Problem(num_devices=2, num_microbatches=4, forward_times=1, backward_times=2, weight_times=1,
                   p2p_time=1e-6)
    block = optimal_block(tiny, time_limit=3).block
    assert block.offsets[Op("F", 1, 0)] >= block.offsets[Op("F", 0, 0)] + 1 + 1e-6


def test_optimal_block_refuses_several_iterations_before_searching():
    with pytest.raises(ZboptError, match="iterations = 1"):
        optimal_block(Problem(num_devices=2, num_microbatches=2, iterations=2), time_limit=60)


def _shape(problem: Problem):
    from zbopt.core.ticks import memory_scale, tick_problem, tick_scale
    from zbopt.solvers.blocks.search import _Shape

    return _Shape(tick_problem(problem, tick_scale(problem)), problem, memory_scale(problem))


@pytest.mark.parametrize("p", [2, 3, 5])
def test_modulo_placement_repeats_at_a_devices_work_for_unit_costs(p):
    """F = B = W = 1, no latency, one stage per device: placed in chain order, device d's F, B and
    W take three distinct phases modulo 3, so the first period tried (the device's work) fits, as
    1F1B's block does; the placement is a valid block (Block checks it)."""
    problem = Problem(num_devices=p, num_microbatches=2 * p, forward_times=1, backward_times=1, weight_times=1)
    shape = _shape(problem)
    period, offsets = shape.first_placed(10 * shape.least_period, deadline=float("inf"))
    assert period == shape.least_period == 3 * tick_scale(problem).ticks_per_unit
    Block(shape.integral, offsets, period)


def test_modulo_placement_gives_the_search_a_close_upper_end_where_no_published_block_fits():
    """Loop placement, v = 2, the 1.5B costs halved, memory 2 (no published block fits): the serial
    block repeats every 135.1; from the placement's upper end (77.6) the bisection proves the least T."""
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, forward_times=9.261,
                      backward_times=9.043, weight_times=4.6685, p2p_time=0.601, activation_memory=0.5,
                      weight_memory=0.183, memory_limit=2)
    serial_period, _ = _shape(problem).serial()
    found = optimal_block(problem, time_limit=20)
    assert found.start == "none" and found.status == "optimal"
    assert found.block.interval == pytest.approx(found.least_interval)
    assert found.least_interval < serial_period / tick_scale(problem).ticks_per_unit / 2
    assert all(peak <= 2 + 1e-9 for peak in steady_peak(found.block))


def test_a_published_seed_off_the_tick_grid_is_not_rounded_into_a_broken_block():
    """Whole-tick costs, yet V-Min's block repeats every 20.5 with half-tick offsets: rounding it
    to 21 ticks overlapped two backwards. The search now answers a valid block within the limit
    even when cut short (found by review; it raised BlockError with 0.2 s)."""
    problem = Problem(num_devices=4, num_microbatches=5, chunks_per_device=2, placement="v",
                      forward_times=[4, 1, 2, 4, 2, 3, 3, 4], backward_times=[4, 1, 1, 1, 1, 1, 3, 1],
                      weight_times=[5, 3, 1, 3, 2, 4, 4, 2], p2p_time=1, memory_limit=5)
    found = optimal_block(problem, time_limit=0.2, workers=1)
    assert all(peak <= 5 + 1e-9 for peak in steady_peak(found.block))
    assert simulate(problem, block_schedule(found.block), strict=True).valid


@pytest.mark.parametrize("placement, chunks", [("loop", 1), ("loop", 2), ("loop", 3), ("v", 2)])
def test_the_block_built_start_holds_the_limit_below_at_and_above_the_blocks_size(placement, chunks):
    """`solve`'s start under a memory limit (the optimal block repeated for the instance's m and
    squeezed) is valid within the limit whether m is below, at or above the number of
    microbatches one block keeps in flight, and never longer than the block repeated unsqueezed."""
    stages = 3 * chunks
    base = Problem(num_devices=3, num_microbatches=6, chunks_per_device=chunks, placement=placement,
                   forward_times=[2 + stage % 2 for stage in range(stages)], backward_times=3, weight_times=1,
                   p2p_time=1)
    limit = 1.5 * max(base.min_memory_limit)
    block = optimal_block(base.replace(memory_limit=limit), time_limit=2).block
    size = math.ceil(block.length / block.period)
    for m in sorted({1, max(1, size - 1), size, 2 * size + 1}):
        problem = base.replace(num_microbatches=m, memory_limit=limit)
        built = simulate(problem, block_schedule(Block(problem, block.offsets, block.period, 1, block.name)),
                         strict=True)
        assert built.valid and max(built.peak_memory) <= limit + 1e-9
        assert built.makespan <= block.repeated_span(m) + 1e-9
