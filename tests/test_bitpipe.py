"""BitPipe (`zbopt.schedules.bitpipe`) on the bidirectional placement with two V's (v = 4).

The figures are the authors' (wuhouming/BitPipe, README), read rectangle by rectangle: rows are
devices, a forward is 10 px wide and a backward 20; fill #4682b4 / #a9c4eb is the forward of a
V's first / second chunk ("a" / "b" below), #eb8f6b / #fadab9 the backward of its first / second
chunk; black labels are the down way's microbatches, white the up way's (scale-moreb.svg colours
two labels the other way; the rectangles' rows and the numbers are unambiguous).
"""

import pytest

from tests.test_bidirectional import bidirectional
from zbopt import Op, critical_path, device_work, generate, simulate
from zbopt.core.placement import stage_device
from zbopt.schedules import generate_applicable, get

# docs/BitPipe_images/BitPipe-v.svg, right of the "BitPipe" label: p = 4, microbatches 1, 2 down, 3, 4 up
BITPIPE_V = [
    "F1a F2a F3a F3b F4a F4b F1b B1b F2b B2b B3b B3a B4b B4a B1a B2a",
    "F1a F3a F2a F4a F3b F1b F4b F2b B1b B3b B2b B4b B3a B1a B4a B2a",
    "F3a F1a F4a F2a F1b F3b F2b F4b B3b B1b B4b B2b B1a B3a B2a B4a",
    "F3a F4a F1a F1b F2a F2b F3b B3b F4b B4b B1b B1a B2b B2a B3a B4a",
]
# docs/BitPipe_images/scale-moreb.svg, lower panel: 8 microbatches, 1, 2, 5, 6 down, 3, 4, 7, 8 up
SCALE_MOREB = [
    "F1a F2a F3a F3b F4a F4b F1b B1b F2b B2b B3b B3a B4b B4a B1a F5a F6a B2a "
    "F7a F7b F8a F8b F5b B5b F6b B6b B7b B7a B8b B8a B5a B6a",
    "F1a F3a F2a F4a F3b F1b F4b F2b B1b B3b B2b B4b B3a B1a B4a B2a "
    "F5a F7a F6a F8a F7b F5b F8b F6b B5b B7b B6b B8b B7a B5a B8a B6a",
    "F3a F1a F4a F2a F1b F3b F2b F4b B3b B1b B4b B2b B1a B3a B2a B4a "
    "F7a F5a F8a F6a F5b F7b F6b F8b B7b B5b B8b B6b B5a B7a B6a B8a",
    "F3a F4a F1a F1b F2a F2b F3b B3b F4b B4b B1b B1a B2b B2a B3a F7a F8a B4a "
    "F5a F5b F6a F6b F7b B7b F8b B8b B5b B5a B6b B6a B7a B8a",
]


def two_vs(p, m, f=1.0, b=2.0, w=None, **changes):
    """The figures' problem: v = 4, a forward one slot, a backward two, fused (no W drawn)."""
    return bidirectional(p, m, f=f, b=b, w=w, chunks_per_device=4, **changes)


def figure_op(problem, device, text):
    """'F5a' on `device` as zbopt's op: figure microbatch n is the k-th of its way in round
    (n-1) // p (the first p/2 of a round down, the others up); 'a' / 'b' the device's first /
    second stage on that way."""
    p, m = problem.num_devices, problem.num_microbatches
    kind, number, chunk = text[0], int(text[1:-1]), text[-1]
    round_, place = divmod(number - 1, p)
    way, k = divmod(place, p // 2)
    microbatch = (0 if way == 0 else m // 2) + round_ * (p // 2) + k
    stages = [s for s in problem.routes[way][0] if problem.device_of(s) == device]
    return Op("F" if kind == "F" else "BW", stages["ab".index(chunk)], microbatch)


def test_two_vs_in_opposite_directions():
    """v = 4: the down way's 2p stages run devices 0..p-1 then back; the up way's the mirror; v = 2
    stays DualPipe's (one stage of each way per device)."""
    problem = two_vs(4, 8)
    assert problem.routes == ((range(0, 8), range(0, 4)), (range(8, 16), range(4, 8)))
    assert [problem.device_of(s) for s in range(16)] == [0, 1, 2, 3, 3, 2, 1, 0, 3, 2, 1, 0, 0, 1, 2, 3]
    assert problem.stages_of_device[0] == (0, 7, 11, 12)
    assert [stage_device(s, 4, "bidirectional", 2) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert problem.route_length == 8 and problem.num_activations == 8 * 8
    assert problem.one_microbatch_memory == (2.0,) * 4  # two stages of one way, not all four


@pytest.mark.parametrize(("m", "figure", "slots"), [(4, BITPIPE_V, 28), (8, SCALE_MOREB, 53)])
def test_bitpipe_is_the_authors_figures_op_for_op(m, figure, slots):
    """Both figures per device, and their length: BitPipe-v.svg ends at slot 28, scale-moreb.svg's
    red "Flush" line is at x = 573 (slot 53)."""
    problem = two_vs(4, m)
    schedule = generate("bitpipe", problem)
    expected = [[figure_op(problem, device, text) for text in row.split()] for device, row in enumerate(figure)]
    assert [list(order) for order in schedule.orders] == expected
    assert simulate(problem, schedule).makespan == slots


@pytest.mark.parametrize("p", [2, 4, 6])
@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize(("split", "latency"), [(False, 0.0), (True, 0.3)])
def test_bitpipe_valid_on_a_grid_within_its_promise(p, rounds, split, latency):
    """Uneven costs and activations: no deadlock, every device does its work, the bounds hold and
    no device holds more than its promise, a round's activations (with unit activations exactly
    2p on the middle devices: the promise is reached)."""
    stages = 4 * p
    f = [1.0 + (s % 3) / 2 for s in range(stages)]
    b = [2.0 + (s % 2) for s in range(stages)]
    problem = two_vs(p, rounds * p, f=f, b=b, w=[0.5] * stages if split else None, p2p_time=latency,
                     activation_memory=[1.0 + s % 2 for s in range(stages)])
    result = simulate(problem, generate("bitpipe", problem))
    assert list(result.busy) == pytest.approx(device_work(problem))
    assert result.makespan >= max(critical_path(problem), max(device_work(problem))) - 1e-9
    promise = get("bitpipe").peak_memory_bound(problem)
    assert all(peak <= bound + 1e-9 for peak, bound in zip(result.peak_memory, promise, strict=True))
    plain = problem.replace(activation_memory=1.0)
    reached = max(simulate(plain, generate("bitpipe", plain)).peak_memory)
    assert reached == 2 * p == max(get("bitpipe").peak_memory_bound(plain))


def test_bitpipe_keeps_its_promise_where_one_stage_is_heavy():
    """At p = 4 with two rounds device 0 holds three microbatches of stage 0 at once (B1, F5, F6
    before B2): a per-stage count of p/2 would promise 26 for a peak of 30."""
    problem = two_vs(4, 8, activation_memory=[10.0] + [1.0] * 15)
    peaks = simulate(problem, generate("bitpipe", problem)).peak_memory
    assert peaks[0] == 30 and all(
        peak <= bound for peak, bound in zip(peaks, get("bitpipe").peak_memory_bound(problem), strict=True))


def test_bitpipe_peak_is_the_figure_s():
    """BitPipe-v.svg: device 0 holds 7 activations before its first backward (slot 7), device 1
    all 8 of the round."""
    problem = two_vs(4, 8)
    assert list(simulate(problem, generate("bitpipe", problem)).peak_memory) == [7, 8, 8, 7]


def test_bitpipe_is_no_alias():
    """On two V's only greedy applies besides it; on one V each way BitPipe does not."""
    built, _ = generate_applicable(two_vs(4, 8))
    assert list(built) == ["bitpipe", "greedy"]
    assert built["bitpipe"].orders != built["greedy"].orders
    assert "bitpipe" not in generate_applicable(bidirectional(4, 8))[0]
