"""Eager 1F1B, PipeDream-2BW and looped BFS against closed forms (uniform costs)."""

import pytest

from zbopt import NotApplicableError, Problem, generate, simulate

GRID = [(p, m) for p in range(1, 7) for m in range(1, 13)]


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize(("f", "b", "c"), [(1.0, 2.0, 0.0), (1.0, 2.0, 0.7), (1.0, 2.0, 1.5), (2.0, 1.0, 1.5)])
def test_eager_1f1b_hides_latency_in_the_steady_state(p, m, f, b, c):
    """Fused eager 1F1B: makespan (m+p-1)(F+B) + 2(p-1)c whenever 2c <= F+B: with two more
    forwards in flight per hop than its neighbour, a device has one whole F+B step to cover the
    round trip of 2c, so only the fill and the drain pay latency (1F1B pays it in the steady
    state too, see tests/test_simulate.py)."""
    problem = Problem(num_devices=p, num_microbatches=m, forward_times=f, backward_times=b, p2p_time=c)
    result = simulate(problem, generate("eager-1f1b", problem))
    assert result.makespan == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c)
    assert result.peak_memory == pytest.approx([min(2 * (p - s) - 1, m) for s in range(p)])


@pytest.mark.parametrize(("p", "m"), [(2, 3), (4, 4), (4, 8), (3, 7)])
@pytest.mark.parametrize("k", [2, 3])
def test_2bw_streams_iterations_where_1f1b_flushes(p, m, k):
    """k iterations, fused, c = 0: flushed 1F1B pays the fill and drain every iteration,
    k(m+p-1)(F+B); PipeDream-2BW pays them once, (km+p-1)(F+B)."""
    flushed = Problem(num_devices=p, num_microbatches=m, iterations=k, forward_times=1, backward_times=2)
    assert simulate(flushed, generate("1f1b", flushed)).makespan == pytest.approx(k * (m + p - 1) * 3)
    streamed = flushed.replace(flush=False)
    for name in ("1f1b-2bw", "eager-1f1b-2bw"):
        assert simulate(streamed, generate(name, streamed)).makespan == pytest.approx((k * m + p - 1) * 3)
    with pytest.raises(NotApplicableError, match="1f1b-2bw needs flush = false"):
        generate("1f1b-2bw", flushed)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
@pytest.mark.parametrize("extra", [0, 1, 3])
def test_looped_bfs_closed_form(p, v, extra):
    """Loop placement, m >= p, fused, c = 0: the forwards flow as one pipeline of v·m forwards per
    device, then the backwards likewise: makespan (vm+p-1)(F+B); every device holds all m
    microbatches of each of its v stages."""
    m = p + extra
    problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=v, forward_times=1, backward_times=2)
    result = simulate(problem, generate("looped-bfs", problem))
    assert result.makespan == pytest.approx((v * m + p - 1) * 3)
    assert result.peak_memory == pytest.approx([v * m] * p)


def test_gpipe_points_to_looped_bfs_for_chunks():
    with pytest.raises(NotApplicableError, match=r"gpipe needs chunks_per_device = 1 \(use looped-bfs"):
        generate("gpipe", Problem(num_devices=2, num_microbatches=2, chunks_per_device=2))
