"""Combined 1F1B (1f1b-overlap, interleaved-1f1b-overlap): against the PP schedule visualizer's
1f1b_overlap and 1f1b_interleave_overlap strategies op for op, against Megatron-LM's combined 1F1B
without pipelining, the makespan's closed form, and valid within the promised memory on a grid.

Units: F, B are per virtual stage; with a fused backward the sources' "backward" is zbopt's BW.
"""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reference import order_peak_memory, problems
from zbopt import NotApplicableError, Problem, critical_path, device_work, generate, simulate
from zbopt.schedules import applicable, get
from zbopt.solvers.pair_relaxation import pair_relaxed

COMBINED = ("1f1b-overlap", "interleaved-1f1b-overlap")


def written(schedule, device):
    """A device's order as the visualizer draws it: one item per op or overlapped pair."""
    return ["(" + ";".join(map(str, item)) + ")" if len(item) > 1 else str(item[0]) for item in schedule.items(device)]


def visualizer_orders(p: int, v: int, m: int) -> list[list[str]]:
    """The visualizer's strategies rebuilt from their rules (src/strategies.py), as items: v = 1,
    `1f1b_overlap`: 2(p-r-1)+1 warm-up forwards, then (F, backward) pairs, then the rest. v >= 2,
    `1f1b_interleave_overlap`: Megatron's order of chunk numbers (+c+1 a forward of chunk c, c-v
    its backward on chunk v-1-c) with one more warm-up forward; each chunk number counts its own
    microbatches; the steady state's (forward, backward) items pair up."""
    orders = []
    for r in range(p):
        if v == 1:
            sequence, warmup = [1] * m, 2 * (p - r - 1) + 1
            backwards = [-1] * m
        else:
            groups = [chunk for first in range(0, m, p) for chunk in range(v) for _ in range(first, min(first + p, m))]
            sequence, backwards = [c + 1 for c in groups], [c - v for c in groups]
            warmup = 2 * (p - r - 1) + (v - 1) * p + 1
        steady = [x for k in range(len(sequence) - warmup) for x in (sequence[warmup + k], backwards[k])]
        numbers = sequence[:warmup] + steady + backwards[len(backwards) - warmup:]
        counted: dict[int, int] = {}
        texts = []
        for number in numbers:
            microbatch = counted.get(number, 0)
            counted[number] = microbatch + 1
            stage = (number - 1 if number > 0 else -number - 1) * p + r
            texts.append(f"{stage}{'F' if number > 0 else 'BW'}{microbatch}")
        end = warmup + len(steady)
        orders.append(texts[:warmup] + [f"({texts[i]};{texts[i + 1]})" for i in range(warmup, end, 2)] + texts[end:])
    return orders


def fused(p, m, v=1, f=1.0, b=2.0, pair=2.0, **changes):
    """The visualizer's defaults: F = 1, backward = 2, an overlapped op costs max(F, backward)."""
    return Problem(num_devices=p, num_microbatches=m, chunks_per_device=v, forward_times=f, backward_times=b,
                   overlap_times={"FBW": pair}, **changes)


def test_1f1b_overlap_redraws_the_visualizer_readme_example():
    """README: `strategy=1f1b_overlap num_devices=4 num_stages=4 num_batches=8`. Device r: 2(p-r-1)+1
    forwards, 8 - that many F&B pairs, the rest of the backwards; with F = 1, backward 2 and the
    visualizer's pair cost max(F, backward) = 2 the last device runs F0, seven pairs and BW7:
    makespan 4·(1+2) + 7·2 = 26."""
    problem = fused(4, 8)
    schedule = generate("1f1b-overlap", problem)
    assert [written(schedule, d) for d in range(4)] == [
        ["0F0", "0F1", "0F2", "0F3", "0F4", "0F5", "0F6", "(0F7;0BW0)",
         "0BW1", "0BW2", "0BW3", "0BW4", "0BW5", "0BW6", "0BW7"],
        ["1F0", "1F1", "1F2", "1F3", "1F4", "(1F5;1BW0)", "(1F6;1BW1)", "(1F7;1BW2)",
         "1BW3", "1BW4", "1BW5", "1BW6", "1BW7"],
        ["2F0", "2F1", "2F2", "(2F3;2BW0)", "(2F4;2BW1)", "(2F5;2BW2)", "(2F6;2BW3)", "(2F7;2BW4)",
         "2BW5", "2BW6", "2BW7"],
        ["3F0", "(3F1;3BW0)", "(3F2;3BW1)", "(3F3;3BW2)", "(3F4;3BW3)", "(3F5;3BW4)", "(3F6;3BW5)", "(3F7;3BW6)",
         "3BW7"]]
    result = simulate(problem, schedule)
    assert result.makespan == 26.0
    assert list(result.peak_memory) == [8, 6, 4, 2]  # min(2(p-r), m) activations


def test_interleaved_overlap_redraws_the_visualizer_readme_example():
    """README: `strategy=1f1b_interleave_overlap num_devices=4 num_stages=8 num_batches=8` (loop
    placement, v = 2, groups of p). Device 0: 2·3 + 4 + 1 = 11 warm-up forwards, five pairs (the
    last across its two chunks), eleven backwards."""
    schedule = generate("interleaved-1f1b-overlap", fused(4, 8, v=2))
    assert written(schedule, 0) == [
        "0F0", "0F1", "0F2", "0F3", "4F0", "4F1", "4F2", "4F3", "0F4", "0F5", "0F6",
        "(0F7;4BW0)", "(4F4;4BW1)", "(4F5;4BW2)", "(4F6;4BW3)", "(4F7;0BW0)",
        "0BW1", "0BW2", "0BW3", "4BW4", "4BW5", "4BW6", "4BW7", "0BW4", "0BW5", "0BW6", "0BW7"]
    assert written(schedule, 3)[4:9] == ["7F0", "(7F1;7BW0)", "(7F2;7BW1)", "(7F3;7BW2)", "(3F4;7BW3)"]


@pytest.mark.parametrize(("p", "v", "m"), [(p, 1, m) for p in (1, 2, 3, 4) for m in range(2 * p - 1, 2 * p + 4)]
                         + [(p, v, k * p) for p in (1, 2, 3, 4) for v in (2, 3) for k in (1, 2, 3)
                            if 2 * (p - 1) + (v - 1) * p + 1 < k * p * v])
def test_equal_to_the_visualizer_op_for_op(p, v, m):
    """Wherever the visualizer's strategies run (v = 1 needs m >= 2p - 1 there; v >= 2, m a
    multiple of p with its warm-up below m·v: its interleaved loop fails beyond): the same items
    on every device."""
    schedule = generate(COMBINED[v > 1], fused(p, m, v=v))
    assert [written(schedule, d) for d in range(p)] == visualizer_orders(p, v, m)


@pytest.mark.parametrize("m", range(1, 7))
def test_one_stage_is_megatrons_combined_1f1b_without_pipelining(m):
    """combined_1f1b_schedule_for_no_pipelining: F0 alone, then B(j) with F(j+1), then B(m-1)."""
    schedule = generate("1f1b-overlap", fused(1, m))
    pairs = [f"(0F{j + 1};0BW{j})" for j in range(m - 1)]
    assert written(schedule, 0) == ["0F0", *pairs, f"0BW{m - 1}"]


@pytest.mark.parametrize(("p", "m", "f", "b", "pair"), [
    (p, m, f, b, pair) for p, m, (f, b) in itertools.product((1, 2, 3, 5), (1, 3, 4, 9), ((1, 2), (2, 1), (1, 1)))
    for pair in (max(f, b), (max(f, b) + f + b) / 2, f + b)])
def test_1f1b_overlap_makespan_closed_form(p, m, f, b, pair):
    """Uniform costs, fused backward, no latency, max(F, B) <= F&B <= F + B: the last device runs
    F, m-1 pairs and B, and idles (p-1)(F+B) as in 1F1B: makespan p(F + B) + (m-1)·F&B, any m."""
    result = simulate(problem := fused(p, m, f=f, b=b, pair=pair), generate("1f1b-overlap", problem))
    assert result.makespan == pytest.approx(p * (f + b) + (m - 1) * pair)


@pytest.mark.parametrize(("p", "v", "k", "pair"), list(itertools.product((1, 2, 3, 4), (2, 3), (1, 2, 3), (2, 2.5, 3))))
def test_interleaved_overlap_makespan_closed_form(p, v, k, pair):
    """Uniform F = 1, B = 2, m = kp, groups of p, the pair from max(F, B) to F + B: the last device
    runs w = min((v-1)p + 1, mv) forwards and backwards alone and mv - w pairs, and idles (p-1)(F+B)
    as in interleaved 1F1B: makespan (p-1)(F+B) + w(F+B) + (mv-w)·F&B."""
    m = k * p
    problem = fused(p, m, v=v, pair=pair)
    w = min((v - 1) * p + 1, m * v)
    result = simulate(problem, generate("interleaved-1f1b-overlap", problem))
    assert result.makespan == pytest.approx((p - 1) * 3 + w * 3 + (m * v - w) * pair)


def test_an_fb_pair_runs_w_right_after_it():
    """Split backward with only an FB cost: each pair is F with the input-gradient B, its W next."""
    problem = Problem(num_devices=2, num_microbatches=3, weight_times=1, overlap_times={"FB": 1.5})
    schedule = generate("1f1b-overlap", problem)
    assert written(schedule, 1) == ["1F0", "(1F1;1B0)", "1W0", "(1F2;1B1)", "1W1", "1B2", "1W2"]
    both = generate("1f1b-overlap", problem.replace(overlap_times={"FB": 1.5, "FBW": 2.5}))
    assert written(both, 1)[1] == "(1F1;1B0;1W0)"  # FBW, the sources' full backward, when given
    simulate(problem, schedule)


@pytest.mark.parametrize(("name", "changes", "needs"), [
    ("1f1b-overlap", {}, "needs overlap_times"),
    ("interleaved-1f1b-overlap", {"chunks_per_device": 2}, "needs overlap_times"),
    ("1f1b-overlap", {"chunks_per_device": 2, "overlap_times": {"FBW": 2}}, "needs chunks_per_device = 1"),
    ("interleaved-1f1b-overlap", {"overlap_times": {"FBW": 2}}, "needs chunks_per_device >= 2"),
    ("interleaved-1f1b-overlap", {"chunks_per_device": 2, "placement": "v", "overlap_times": {"FBW": 2}},
     "needs placement loop"),
    ("interleaved-1f1b-overlap", {"chunks_per_device": 2, "num_microbatches": 9, "overlap_times": {"FBW": 2}},
     "needs m a multiple of"),  # torch's flexible group for p = 4, m = 9 is 4: 9 is no multiple
])
def test_shapes_not_served_are_named(name, changes, needs):
    problem = Problem(**{"num_devices": 4, "num_microbatches": 8, **changes})
    with pytest.raises(NotApplicableError, match=f"{name} {needs}"):
        generate(name, problem)


@pytest.mark.parametrize("name", COMBINED)
def test_no_other_schedule_is_the_same(name):
    """On the source's example every other applicable schedule differs in its orders or pairs."""
    problem = fused(4, 8, v=1 if name == "1f1b-overlap" else 2)
    mine = generate(name, problem)
    others = [other for other_name, other in applicable(problem) if other_name != name]
    assert others and all((other.orders, other.pairs) != (mine.orders, mine.pairs) for other in others)


@given(problems(max_devices=5, max_microbatches=10, chunks=(1, 2, 3), iterations=(1, 2)),
       st.sampled_from([{"FBW": 1.5}, {"FB": 1.0}, {"FB": 0.5, "FBW": 3.0}]), st.sampled_from([None, 1, 2]))
def test_valid_within_the_promised_memory(problem, overlap, group):
    """Random problems with pairs (FB only with a split backward): the simulator accepts the
    schedule, its makespan respects the pair-relaxed lower bounds, its peak is what its order
    holds and within the registered bound (the group option at p or p + group)."""
    if "FB" in overlap and not problem.split_backward:
        overlap = {"FBW": 1.5}
    problem = problem.replace(overlap_times=overlap)
    relaxed = pair_relaxed(problem)
    bound = max(critical_path(relaxed), max(device_work(relaxed)))
    for name in COMBINED:
        options = {"microbatch_group_size_per_vp_stage": problem.num_devices + group} \
            if group and name != "1f1b-overlap" else {}
        try:
            schedule = generate(name, problem, **options)
        except NotApplicableError:
            continue
        result = simulate(problem, schedule)
        assert result.makespan >= bound - 1e-9
        assert list(result.peak_memory) == pytest.approx(order_peak_memory(problem, schedule))
        if not options:
            assert all(peak <= limit + 1e-9 for peak, limit in
                       zip(result.peak_memory, get(name).peak_memory_bound(problem), strict=True))


def test_the_promised_memory_is_reached_on_a_grid():
    """Every p <= 4, m <= 8 (v = 1; v in 2, 3 with m a multiple of p), fused or split, uniform
    activations: each generator applies and device r holds exactly its promise, warm-up + 1
    activations (at most all of them): the pair's forward allocates before its backward frees."""
    for p, m, v, split in itertools.product(range(1, 5), range(1, 9), (1, 2, 3), (False, True)):
        if v > 1 and m % p:
            continue
        name = COMBINED[v > 1]
        problem = fused(p, m, v=v, weight_times=1.0 if split else None)
        result = simulate(problem, generate(name, problem))
        assert list(result.peak_memory) == pytest.approx(get(name).peak_memory_bound(problem)), (p, m, v)
