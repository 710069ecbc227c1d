"""`hanayo`: Hanayo's wave (Liu et al., SC'23) with a 1F1B discipline, zbopt's reconstruction
(zbopt/schedules/hanayo.py): valid on a grid, its closed forms against the simulator, its warm-up
the least that keeps the makespan, and no alias of another schedule."""

import contextlib
import itertools

import pytest

from zbopt import DeadlockError, NotApplicableError, Problem, generate, simulate
from zbopt.core.kinds import BACKWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.schedule import Schedule
from zbopt.schedules import registered
from zbopt.schedules.hanayo import wave_table, wave_warmup
from zbopt.schedules.interleaved import schedule_table, table_order


def wave(p: int, waves: int, m: int, **costs) -> Problem:
    return Problem(num_devices=p, num_microbatches=m, chunks_per_device=2 * waves, placement="v", **costs)


@pytest.mark.parametrize("waves", [1, 2, 3])
def test_valid_without_deadlock_within_its_memory_on_a_grid(waves):
    """p 1..6, m 1..16 (m not a multiple of p too): the simulator runs every order (no deadlock,
    every op once), and device d holds min(v·p + d, m·v) chunk activations, its promise."""
    v = 2 * waves
    bound = next(entry.peak_memory_bound for entry in registered() if entry.name == "hanayo")
    for p in range(1, 7):
        for m in range(1, 17):
            problem = wave(p, waves, m)
            result = simulate(problem, generate("hanayo", problem))
            assert list(result.peak_memory) == [min(v * p + d, m * v) for d in range(p)], (p, m)
            assert list(bound(problem)) == list(result.peak_memory)


@pytest.mark.parametrize(("forward", "backward"), [(1, 1), (1, 2), (2, 3), (2, 1)])
def test_makespan_closed_form(forward, backward):
    """m a multiple of p, m >= 2p, no latency: makespan m·v·(F+B) + 2(p-1)·max(F, B); at F = B it
    is interleaved 1F1B's (p-1)(F+B) + m·v·(F+B) (same bubble); with B > F, (p-1)(B-F) more."""
    for p in (1, 2, 3, 5):
        for waves in (1, 2):
            for m in (2 * p, 3 * p):
                problem = wave(p, waves, m, forward_times=forward, backward_times=backward)
                v = 2 * waves
                expected = m * v * (forward + backward) + 2 * (p - 1) * max(forward, backward)
                assert simulate(problem, generate("hanayo", problem)).makespan == pytest.approx(expected)
                if forward == backward:
                    loop = problem.replace(placement="loop")
                    assert simulate(loop, generate("interleaved-1f1b", loop)).makespan == pytest.approx(expected)


@pytest.mark.parametrize(("p", "waves", "m"), [(2, 1, 4), (3, 1, 9), (4, 1, 8), (3, 2, 6), (2, 3, 4)])
def test_warmup_is_the_least_that_keeps_the_makespan(p, waves, m):
    """F = B: one warm-up forward fewer on any device deadlocks or lengthens the makespan."""
    problem = wave(p, waves, m, backward_times=1)
    best = simulate(problem, generate("hanayo", problem)).makespan
    outcomes = []
    for device in range(p):
        warmups = [wave_warmup(problem, d) - (d == device) for d in range(p)]
        fewer = Schedule([table_order(problem, d, wave_table(problem, d), warmups[d]) for d in range(p)])
        try:
            outcomes.append(simulate(problem, fewer).makespan > best)
        except DeadlockError:
            outcomes.append("deadlock")
    assert all(outcome in (True, "deadlock") for outcome in outcomes), outcomes


def test_wave_table_is_megatrons_group_with_microbatches_two_slots_apart():
    """p = 3, one wave, m = 3: device 0 runs chunk 0 alone while microbatch 0 goes down and back
    up; device 2 (the local bottom turnaround) alternates chunk 0 and chunk 1 of each microbatch."""
    problem = wave(3, 1, 3)
    assert wave_table(problem, 0) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert wave_table(problem, 1) == [(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (2, 1)]
    assert wave_table(problem, 2) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


def test_fewer_cross_device_sends_than_interleaved():
    """A microbatch's forward crosses devices 2W·(p-1) times on the wave (its turnarounds are
    local), v·p - 1 times on the loop placement of interleaved 1F1B."""
    for p, waves in [(2, 1), (4, 2), (3, 3)]:
        v = 2 * waves
        problem = wave(p, waves, p)
        devices = [problem.device_of(s) for s in range(v * p)]
        assert sum(a != b for a, b in itertools.pairwise(devices)) == v * (p - 1)
        loop = problem.replace(placement="loop")
        devices = [loop.device_of(s) for s in range(v * p)]
        assert sum(a != b for a, b in itertools.pairwise(devices)) == v * p - 1


def test_split_backward_runs_each_w_right_after_its_b():
    problem = wave(3, 1, 6, weight_times=1, iterations=2)
    result = simulate(problem, generate("hanayo", problem))
    for order in result.schedule.orders:
        assert all(order[i + 1] == Op(WEIGHT, op.stage, op.microbatch)
                   for i, op in enumerate(order) if op.kind == BACKWARD)


def test_needs_placement_v_and_an_even_chunk_count():
    for problem in (Problem(num_devices=2, num_microbatches=4, chunks_per_device=2),
                    Problem(num_devices=2, num_microbatches=4, chunks_per_device=3, placement="v"),
                    Problem(num_devices=2, num_microbatches=4, placement="v")):
        with pytest.raises(NotApplicableError, match="hanayo needs placement v and an even chunks_per_device"):
            generate("hanayo", problem)


def _by_chunk(problem: Problem, schedule: Schedule) -> list[list[tuple[str, int, int]]]:
    """Each device's order as (kind, device-local chunk, microbatch): placement-free."""
    return [[(op.kind, problem.stages_of_device[d].index(op.stage), op.microbatch) for op in order]
            for d, order in enumerate(schedule.orders)]


@pytest.mark.parametrize(("p", "waves", "m"), [(4, 1, 8), (3, 2, 6)])
def test_no_alias(p, waves, m):
    """hanayo differs from every other schedule on the same problem (torch-zbv, zb-v, v-*,
    dualpipe-v, greedy, looped-bfs, ...), and from interleaved-1f1b (loop placement only) chunk
    for chunk on the same p, v, m."""
    problem = wave(p, waves, m)
    ours = generate("hanayo", problem)
    others = 0
    for entry in registered():
        if entry.name == "hanayo":
            continue
        try:
            other = generate(entry.name, problem)
        except NotApplicableError:
            continue
        others += 1
        assert other.orders != ours.orders, entry.name
    assert others >= (7 if waves == 1 else 2)
    loop = problem.replace(placement="loop")
    assert _by_chunk(loop, generate("interleaved-1f1b", loop)) != _by_chunk(problem, ours)


def test_megatrons_table_stalls_on_the_wave():
    """Why the wave gets its own table: p = 2, one wave, m = 4, F = B = 1. Megatron's table (one
    microbatch entering per slot) on placement v takes at least 22 whatever the warm-ups; the
    wave's table takes 18, the lower bound m·v(F+B) + (p-1)(F+B)."""
    problem = wave(2, 1, 4, backward_times=1)
    table = schedule_table(4, 2, 2)
    ran = []
    for warmups in itertools.product(range(6), repeat=2):
        orders = Schedule([table_order(problem, d, table, warmups[d]) for d in range(2)])
        with contextlib.suppress(DeadlockError):
            ran.append(simulate(problem, orders).makespan)
    assert ran and min(ran) >= 22  # some warm-ups run (the rest deadlock), none in under 22
    assert simulate(problem, generate("hanayo", problem)).makespan == 18
