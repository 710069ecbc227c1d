"""Overlapped pairs (DualPipe's "F&B", `Problem.overlap_times`): one op of the pair's cost that
starts once every member's input is ready and ends all of them; the DualPipe README's bubble table.

Units: zbopt's B is the input gradient; the README's "B" is a full backward chunk, zbopt's B + W.
"""

import dataclasses
import itertools
import math
import random
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import assert_cpsat_proves, device_linear_extensions
from zbopt import (
    DeadlockError,
    Op,
    Problem,
    ProblemError,
    Schedule,
    ScheduleError,
    ZboptError,
    generate,
    simulate,
    solve,
)
from zbopt.core.kinds import PAIR_MEMBERS
from zbopt.io.export import save_schedule
from zbopt.io.read import load_schedule
from zbopt.io.torch_format import megatron_order, torch_csv
from zbopt.io.torch_order import parse_torch_csv
from zbopt.presentation.plot import plot_gantt
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.pair_relaxation import pair_count_bound, pair_relaxed


def one_device(**changes):
    parameters = dict(num_devices=1, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1,
                      overlap_times={"FBW": 1.5, "FB": 1.25})
    return Problem(**{**parameters, **changes})


PAIRED = ["0F0", "(0F1;0B0;0W0)", "0B1", "0W1"]


def test_a_pair_runs_as_one_op_of_its_cost():
    """One device, F = B = W = 1, FBW pair 1.5: F0 [0, 1], the pair (F1 with B0 and W0) [1, 2.5],
    B1 [2.5, 3.5], W1 [3.5, 4.5]. Memory: F0 +1 at 0, F1 +1 at the pair's start (2), B0 and W0
    release M_B = 1 at its end (1), then B1 and W1."""
    problem = one_device()
    result = simulate(problem, Schedule([PAIRED]))
    assert [result.times_of(Op.from_str(text)) for text in ("0F0", "0F1", "0B0", "0W0", "0B1", "0W1")] == [
        (0, 1), (1, 2.5), (1, 2.5), (1, 2.5), (2.5, 3.5), (3.5, 4.5)]
    assert result.makespan == 4.5 and result.busy == (4.5,)
    times, levels = result.memory_steps[0]
    assert list(times) == [0, 1, 2.5, 3.5, 4.5] and list(levels) == [1, 2, 1, 0.5, 0]


def test_a_pair_waits_for_every_members_input():
    """Two devices, latency 0.5, device 0's forward 2: device 1 pairs F(1, 1), whose input arrives
    at 4 + 0.5, with B(1, 0), ready when F(1, 0) ends at 3.5. The pair starts at 4.5 (its later
    member's readiness) and ends both at 6; device 0's B(0, 0) then waits for B(1, 0)'s end."""
    problem = Problem(num_devices=2, num_microbatches=2, forward_times=[2, 1], backward_times=1, weight_times=1,
                      p2p_time=0.5, overlap_times={"FB": 1.5})
    orders = [["0F0", "0F1", "0B0", "0W0", "0B1", "0W1"], ["1F0", "(1F1;1B0)", "1W0", "1B1", "1W1"]]
    result = simulate(problem, Schedule(orders))
    times = {text: result.times_of(Op.from_str(text)) for order in orders for text in order if "(" not in text}
    assert times["1F0"] == (2.5, 3.5)
    assert result.times_of(Op.from_str("1F1")) == result.times_of(Op.from_str("1B0")) == (4.5, 6.0)
    assert times["0B0"] == (6.5, 7.5) and times["1B1"] == (7.0, 8.0)
    assert result.makespan == 10.5


@pytest.mark.parametrize(("orders", "pairs", "message"), [
    ([["0F0", "0F1", "0B0", "0W0", "0B1", "0W1"]], [("0F1", "0W0")],
     r"pair \(0F1;0W0\): expected a forward and one microbatch's backward"),
    ([["0F0", "0F1", "0B1", "0B0", "0W0", "0W1"]], [("0F1", "0B0", "0W0")], "must be consecutive"),
    ([["0F0", "0F1", "0B0", "0W0", "0B1", "0W1"]], [("0F1", "0B0", "0W1")],
     "expected a forward and one microbatch's backward"),
])
def test_a_malformed_pair_is_named(orders, pairs, message):
    with pytest.raises(ScheduleError, match=message):
        simulate(one_device(), Schedule(orders, pairs=pairs))


def test_a_pair_kind_without_a_cost_is_named():
    problem = one_device(overlap_times={"FB": 1.25})
    with pytest.raises(ScheduleError, match=r"pair \(0F1;0B0;0W0\): the problem's overlap_times gives no FBW cost "
                                             r"\(it gives FB\)"):
        simulate(problem, Schedule([PAIRED]))
    with pytest.raises(ScheduleError, match=r"gives no FBW cost \(it gives none\)"):
        simulate(problem.replace(overlap_times=None), Schedule([PAIRED]))


def test_given_start_times_of_a_pair_are_one_time():
    problem = one_device()
    timed = simulate(problem, Schedule([PAIRED])).timed_orders()
    assert simulate(problem, timed).makespan == 4.5  # the simulator's own times verify
    times = [list(timed.start_times[0])]
    times[0][2] += 0.25  # B0 apart from its pair's F1
    with pytest.raises(ScheduleError, match=r"pair \(0F1;0B0;0W0\): its ops start together"):
        simulate(problem, Schedule(timed.orders, times, pairs=timed.pairs))


def test_pairs_survive_a_json_round_trip_as_one_item(tmp_path):
    problem = one_device()
    timed = simulate(problem, Schedule([PAIRED])).timed_orders()
    save_schedule(tmp_path / "paired.json", timed, problem)
    text = (tmp_path / "paired.json").read_text()
    assert '"(0F1;0B0;0W0)"' in text and '"start_times": [\n  [\n   0.0,\n   1.0,\n   2.5' in text
    loaded, loaded_problem = load_schedule(tmp_path / "paired.json")
    assert loaded.pairs == timed.pairs and loaded_problem == problem
    assert simulate(loaded_problem, loaded).makespan == 4.5


@pytest.mark.parametrize(("value", "message"), [
    ({"FX": 1}, "unknown pair kind 'FX'"),
    ({"FBW": 0}, "every value must be > 0"),
    ([2.5], "expected a mapping from pair kind"),
])
def test_bad_overlap_times_are_one_line_errors(value, message):
    with pytest.raises(ProblemError, match=message):
        one_device(overlap_times=value)


def test_fb_pairs_need_a_split_backward():
    with pytest.raises(ProblemError, match="FB pairs a forward with an input-gradient B, which needs a split"):
        one_device(weight_times=None, overlap_times={"FB": 1.0})


# The DualPipe README's table (deepseek-ai/DualPipe, "Pipeline Bubbles and Memory Usage Comparison";
# DeepSeek-V3 report, Table 2), its B being a full backward chunk (zbopt's B + W):
#   1F1B (PP-1)(F+B); ZB1P (PP-1)(F+B-2W); DualPipe (PP/2-1)(F&B+B-3W).
# Its assumptions, under which zbopt's simulator gives each row exactly: the chunks of one kind cost
# the same on every stage, no latency, and for DualPipe (and DualPipeV on PP/2 devices) F equal to
# the input-gradient part and to W, with F + W <= F&B <= F + B (a pair no faster than a forward and
# a W, no slower than a forward and a full backward in a row). The bubble is the idle time of the
# most idle device, makespan minus its work: DualPipe's middle ranks, which overlap one pair fewer.
# Outside those assumptions the model's bubble differs (see test_readme_dualpipe_row_needs_its_assumptions).


@pytest.mark.parametrize("pp", [4, 6, 8, 10])
@pytest.mark.parametrize("pair", [4, 5, 6])
@pytest.mark.parametrize("extra", [0, 2, 6])
def test_readme_dualpipe_row(pp, pair, extra):
    f = w = 2  # F = B(input) = W = 2, so the README's B is 4, and F&B from F + W = 4 to F + B = 6
    problem = Problem(num_devices=pp, num_microbatches=2 * pp + extra, chunks_per_device=2,
                      placement="bidirectional", forward_times=f, backward_times=f, weight_times=w,
                      overlap_times={"FBW": pair})
    result = simulate(problem, generate("dualpipe", problem))
    assert max(result.idle) == (pp // 2 - 1) * (pair + (f + w) - 3 * w)


@pytest.mark.parametrize("half", [2, 3, 4, 5])
@pytest.mark.parametrize("pair", [4, 5, 6])
def test_readme_dualpipe_row_holds_for_dualpipe_v_on_half_the_devices(half, pair):
    """DualPipeV is DualPipe cut in half: PP/2 = `half` devices, PP = 2·half stages."""
    problem = Problem(num_devices=half, num_microbatches=2 * half + 3, chunks_per_device=2, placement="v",
                      forward_times=2, backward_times=2, weight_times=2, overlap_times={"FBW": pair})
    result = simulate(problem, generate("dualpipe-v", problem))
    assert max(result.idle) == (half - 1) * (pair + 4 - 3 * 2)


@pytest.mark.parametrize("pp", [2, 4, 7])
@pytest.mark.parametrize(("f", "b", "w"), [(2, 2, 2), (3, 2, 1), (2, 3, 1)])
def test_readme_1f1b_and_zb1p_rows(pp, f, b, w):
    """1F1B on a fused problem (its backward the full B + W): (PP-1)(F + B_full); ZB-H1 (the
    README's ZB1P) on the split one: (PP-1)(F + B_full - 2W) = (PP-1)(F + B - W), for F >= W
    (the Zero Bubble paper's own condition for ZB-H1's bubble, sec. 3.1)."""
    m = 2 * pp + 1
    fused = Problem(num_devices=pp, num_microbatches=m, forward_times=f, backward_times=b + w)
    one_f_one_b = simulate(fused, generate("1f1b", fused))
    assert max(one_f_one_b.idle) == (pp - 1) * (f + (b + w))
    split = fused.replace(backward_times=b, weight_times=w)
    zb1p = simulate(split, generate("zb-h1", split))
    assert max(zb1p.idle) == (pp - 1) * (f + (b + w) - 2 * w)


def test_readme_dualpipe_row_needs_its_assumptions():
    """Where a pair is faster than F + W, DualPipe's idle is more than the row's value: the pair
    waits for both inputs and the fill is no shorter (F = B = W = 2, F&B = 3 < F + W, PP = 8)."""
    problem = Problem(num_devices=8, num_microbatches=20, chunks_per_device=2, placement="bidirectional",
                      forward_times=2, backward_times=2, weight_times=2, overlap_times={"FBW": 3})
    result = simulate(problem, generate("dualpipe", problem))
    assert max(result.idle) > 3 * (3 + 4 - 6)


def test_dualpipe_pairs_every_main_step_but_the_middle_ranks_first():
    """dualpipe.py's main step overlaps (F0&B1)(F1&B0), except the middle ranks' first F0 and B1;
    step 5 overlaps (F1&B0). Rank r at distance h from its end: 2(m/2 - p + h + 1) + (p/2 - h - 1)
    pairs, one fewer on the two middle ranks."""
    p, m = 6, 16
    problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, weight_times=1, overlap_times={"FBW": 2.5})
    result = simulate(problem, generate("dualpipe", problem))
    per_device = [0] * p
    for pair in result.pairs:
        per_device[result.table.device[pair.members[0]]] += 1
    expected = []
    for r in range(p):
        h = min(r, p - 1 - r)
        expected.append(2 * (m // 2 - p + h + 1) + (p // 2 - h - 1) - (h == p // 2 - 1))
    assert per_device == expected


def test_without_an_fbw_cost_dualpipe_runs_no_pairs():
    problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, weight_times=1, overlap_times={"FB": 1.5})
    assert generate("dualpipe", problem).pairs == ()


@given(st.sampled_from([2, 4, 6]), st.data())
@settings(max_examples=25, deadline=None)
def test_lower_bounds_hold_with_pairs(p, data):
    """The bounds of the pair-relaxed problem stay below DualPipe's makespan with pairs, however
    cheap the pairs (down to half of a forward and a full backward in a row)."""
    costs = st.lists(st.sampled_from([1.0, 1.5, 2.0]), min_size=2 * p, max_size=2 * p)
    forward, backward, weight = data.draw(costs), data.draw(costs), data.draw(costs)
    share = data.draw(st.sampled_from([0.5, 0.7, 0.9, 1.0, 1.2]))
    pair = share * min(f + b + w for f, b, w in zip(forward, backward, weight, strict=True))
    problem = Problem(num_devices=p, num_microbatches=2 * p + 2, chunks_per_device=2, placement="bidirectional",
                      forward_times=forward, backward_times=backward, weight_times=weight,
                      overlap_times={"FBW": pair})
    result = simulate(problem, generate("dualpipe", problem))
    assert lower_bounds(problem).best <= result.makespan + 1e-9


@pytest.mark.parametrize("solver", ["cbc", "lns"])
def test_solvers_without_pairs_refuse_them(solver):
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, weight_times=1, overlap_times={"FBW": 2})
    with pytest.raises(ZboptError, match=f"solver '{solver}': .*does not (model|choose) overlapped pairs"):
        solve(problem, solver=solver, time_limit=5)


def _pair_placements(problem, order):
    """Every set of non-overlapping overlapped pairs that one device's order can run: a forward
    followed right away by another microbatch's backward ops of a pair kind with a cost."""
    kinds = [PAIR_MEMBERS[kind, problem.split_backward] for kind, _ in problem.overlap_times]
    spots = []
    for i, op in enumerate(order):
        for shape in kinds:
            members = tuple(order[i:i + len(shape)])
            if len(members) == len(shape) and tuple(m.kind for m in members) == shape and \
                    len({(m.stage, m.microbatch) for m in members[1:]}) == 1 and members[1].microbatch != op.microbatch:
                spots.append((i, members))
    chosen = [()]
    for size in range(1, len(spots) + 1):
        for subset in itertools.combinations(spots, size):
            taken = [k for i, members in subset for k in range(i, i + len(members))]
            if len(taken) == len(set(taken)):
                chosen.append(tuple(members for _, members in subset))
    return chosen


def brute_force_pair_optimum(problem: Problem) -> float:
    """The least makespan over every combination of per-device orders and of the overlapped pairs
    each order can run (`_pair_placements`), through the simulator (whose pair timing is checked by
    hand above); deadlocks and memory violations skipped."""
    best = math.inf
    extensions = [device_linear_extensions(problem, device) for device in range(problem.num_devices)]
    for orders in itertools.product(*extensions):
        for pairs in itertools.product(*(_pair_placements(problem, order) for order in orders)):
            try:
                result = simulate(problem, Schedule(orders, pairs=[p for device in pairs for p in device]))
            except DeadlockError:
                continue
            if result.valid:
                best = min(best, result.makespan)
    return best


@st.composite
def tiny_pair_problems(draw):
    """One device with 2 microbatches, two devices with 2 (one stage each, or both ways), random
    integer costs and pair costs, split or fused, sometimes a memory limit."""
    shape = draw(st.sampled_from(["one", "two", "both ways"]))
    split = draw(st.booleans())
    p, v = (1, 1) if shape == "one" else (2, 2 if shape == "both ways" else 1)
    stages = p * v
    costs = st.lists(st.sampled_from([1, 2, 3]), min_size=stages, max_size=stages)
    kinds = ["FBW"] + (["FB"] if split else [])
    overlap = {kind: draw(st.sampled_from([1, 2, 3, 4])) for kind in draw(st.sets(st.sampled_from(kinds),
                                                                                 min_size=1))}
    problem = Problem(num_devices=p, num_microbatches=2, chunks_per_device=v,
                      placement="bidirectional" if shape == "both ways" else "loop",
                      forward_times=draw(costs), backward_times=draw(costs),
                      weight_times=draw(costs) if split else None, p2p_time=draw(st.sampled_from([0, 1])),
                      overlap_times=overlap)
    if draw(st.booleans()):
        problem = problem.replace(memory_limit=[level + draw(st.sampled_from([0, 1]))
                                                for level in problem.one_microbatch_memory])
    return problem


@given(tiny_pair_problems())
@settings(max_examples=12, deadline=None)
def test_cpsat_with_pairs_agrees_with_brute_force(problem):
    """CP-SAT's proven optimum, pairs chosen by the model, equals the least makespan over every order
    and every placement of pairs; its schedule's pairs are real (re-simulated)."""
    expected = brute_force_pair_optimum(problem)
    assert_cpsat_proves(problem, expected)


def test_cpsat_pairs_beat_dualpipe_where_pairs_pay():
    """p = 2, m = 4 both ways, F = B = W = 1, FBW pairs of 2.2 (three ops in a row: 3): DualPipe
    11.2; the optimizer proves a better schedule that pairs (its answer re-simulated with its
    pairs, its bound the objective)."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, weight_times=1, overlap_times={"FBW": 2.2})
    dual = simulate(problem, generate("dualpipe", problem))
    result = solve(problem, time_limit=30, lower_peak=False)
    assert dual.makespan == pytest.approx(11.2)
    assert result.status == "optimal" and result.objective < dual.makespan - 0.5 and result.simulation.pairs
    assert lower_bounds(problem).best <= result.objective


def test_pair_count_bound_proves_the_optimum_both_ways():
    """The same problem: the pair relaxation says 8.8 (every op of a device at 2.2 / 3), the count of
    pairs a device can form by the makespan 10.4, the optimum."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, weight_times=1, overlap_times={"FBW": 2.2})
    assert lower_bounds(pair_relaxed(problem)).best == pytest.approx(8.8)
    assert pair_count_bound(problem) == pytest.approx(10.4)
    assert (lower_bounds(problem).best, lower_bounds(problem).binding) == (pytest.approx(10.4), "pair_count")


def test_pair_count_bound_by_hand_on_one_device():
    """One device, m = 2, F = B = W = 1, FBW pairs of 1.5 (no FB): F0 cannot pair (no backward is
    ready before it ends), so one pair at most: 6 - 1.5 = 4.5, the optimum (F0, then F1 with B0
    and W0, then B1 and W1); the pair relaxation says 6 · 1.5 / 3 = 3."""
    problem = one_device(overlap_times={"FBW": 1.5})
    assert pair_count_bound(problem) == pytest.approx(4.5)
    assert brute_force_pair_optimum(problem) == pytest.approx(4.5)


@given(tiny_pair_problems())
@settings(max_examples=10, deadline=None)
def test_pair_count_bound_below_the_brute_force_optimum(problem):
    assert pair_count_bound(problem) <= brute_force_pair_optimum(problem) + 1e-9


@pytest.mark.parametrize("seed", range(8))
def test_pair_count_bound_below_the_proven_optimum_v_shape(seed):
    """Two devices, V placement, random costs and pair costs (DualPipeV's shape): below CP-SAT's optimum."""
    draw = random.Random(seed)

    def costs():
        return [draw.choice([1, 2, 3]) for _ in range(4)]

    problem = Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, placement="v",
                      forward_times=costs(), backward_times=costs(), weight_times=costs(),
                      p2p_time=draw.choice([0, 1]), overlap_times={"FBW": draw.choice([3, 4, 5]), "FB": 3})
    result = solve(problem, time_limit=15, workers=1, lower_peak=False)
    assert result.status == "optimal"
    assert pair_count_bound(problem) <= result.objective + 1e-9


def test_gantt_draws_a_pair_as_one_outlined_box_split_across():
    simulation = simulate(one_device(), Schedule([PAIRED]))
    axes = plot_gantt(simulation).axes[0]
    (outline,) = next(c for c in axes.collections if c.get_gid() == "overlapped-pairs").get_paths()
    assert (outline.vertices[:, 0].min(), outline.vertices[:, 0].max()) == (1.0, 2.5)
    strips = {}
    for kind in ("F", "B", "W"):
        for path in next(c for c in axes.collections if c.get_gid() == f"ops-{kind}-chunk0").get_paths():
            if path.vertices[:, 0].min() == 1.0:  # the pair's members
                strips[kind] = (path.vertices[:, 1].min(), path.vertices[:, 1].max(), path.vertices[:, 0].max())
    tops = sorted(strips.values())
    assert [kind for kind, value in sorted(strips.items(), key=lambda item: item[1])] == ["F", "B", "W"]
    assert all(end == 2.5 for *_, end in tops)
    assert tops[0][1] == pytest.approx(tops[1][0]) and tops[1][1] == pytest.approx(tops[2][0])  # stacked
    plt.close("all")


def dualpipe_v_with_pairs(**changes):
    parameters = dict(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=1, weight_times=1, overlap_times={"FBW": 2.5})
    return Problem(**{**parameters, **changes})


def test_torch_csv_writes_pairs_as_overlap_f_b_and_reads_them_back():
    """DualPipeV, p = 2, m = 4: rank 0 overlaps its one main step's two F&B and step 5's F1&B0,
    rank 1 (the last) its main step's two iterations but the first F0 and B1: 3 + 3 pairs, the
    first rank 0's F0 of microbatch 3 (after 2 + 1 forwards down) with B1 of microbatch 1, written
    as torch writes it (its B the full backward). Read back with overlap_times they are pairs
    again; without, their actions run one after another."""
    problem = dualpipe_v_with_pairs()
    schedule = generate("dualpipe-v", problem)
    text = torch_csv(problem, schedule)
    assert text.count("OVERLAP_F_B") == 6 and "(0F3;3B1)OVERLAP_F_B" in text.splitlines()[0]
    order = parse_torch_csv(text)
    assert set(order.to_schedule(problem).pairs) == set(schedule.pairs)
    plain = order.to_schedule(problem.replace(overlap_times=None))
    assert plain.pairs == () and plain.orders == schedule.orders


def test_an_overlap_f_b_without_its_cost_is_named():
    text = torch_csv(dualpipe_v_with_pairs(), generate("dualpipe-v", dualpipe_v_with_pairs()))
    fb_only = dualpipe_v_with_pairs(overlap_times={"FB": 1.5})
    with pytest.raises(ScheduleError, match=r"torch CSV row 1, column 8: this OVERLAP_F_B is an FBW pair, and "
                                             r"overlap_times gives no cost for it \(it gives FB\)"):
        parse_torch_csv(text).to_schedule(fb_only)


def test_an_fb_pair_is_written_with_torchs_input_backward():
    problem = one_device()
    schedule = Schedule([["0F0", "(0F1;0B0)", "0W0", "0B1", "0W1"]])
    assert torch_csv(problem, schedule).strip() == "0F0,(0F1;0I0)OVERLAP_F_B,0W0,0I1,0W1"
    assert parse_torch_csv(torch_csv(problem, schedule)).to_schedule(problem).pairs == schedule.pairs


def test_megatron_refuses_pairs_rather_than_dropping_them():
    problem = one_device(weight_times=None, overlap_times={"FBW": 2.5})
    schedule = Schedule([["0F0", "(0F1;0BW0)", "0BW1"]])
    with pytest.raises(ZboptError, match=r"Megatron-LM's order has no overlapped pair, and the schedule has 1 "
                                         r"\(first \(0F1;0BW0\)\); export it as zbopt JSON"):
        megatron_order(problem, schedule)
    assert megatron_order(problem, dataclasses.replace(schedule, pairs=())) == [[1, 1, -1, -1]]


def test_a_forward_paired_with_its_own_microbatchs_backward_is_refused():
    """The backward waits for its own forward: such a pair could never start (found by review: it
    used to run as one op of the pair's cost)."""
    problem = one_device(num_microbatches=1)
    with pytest.raises(ScheduleError, match=r"pair \(0F0;0B0;0W0\): a forward and its own microbatch's backward"):
        simulate(problem, Schedule([["(0F0;0B0;0W0)"]]))


def test_a_window_that_leaves_pairs_out_proves_nothing():
    """One device, m = 2, FBW 1.5: the optimum pairs F1 with B0 (4.5). With pair_window 0 the model
    has no pair and finds 6, which it must not call optimal (found by review). Without a warm start:
    `1f1b-overlap` reaches 4.5 itself, and the answer would then rightly be optimal."""
    problem = one_device(overlap_times={"FBW": 1.5})
    assert solve(problem, time_limit=10, lower_peak=False).objective == 4.5
    restricted = solve(problem, time_limit=10, lower_peak=False, pair_window=0, use_warm_start=False)
    assert (restricted.status, restricted.objective) == ("feasible", 6.0) and restricted.lower_bound <= 4.5


def test_simulate_json_carries_the_pairs_and_reads_back():
    simulation = simulate(one_device(), Schedule([PAIRED]))
    data = simulation.to_dict()
    assert data["pairs"] == ["(0F1;0B0;0W0)"]
    again = Schedule.from_dict({"orders": data["orders"], "start_times": data["start_times"], "pairs": data["pairs"]})
    assert simulate(one_device(), again).makespan == 4.5


def test_offload_heuristics_refuse_a_base_with_pairs():
    from zbopt import NotApplicableError
    problem = dualpipe_v_with_pairs(allow_offload=True, offload_times=0.5)
    with pytest.raises(NotApplicableError, match="base schedule 'dualpipe-v' runs overlapped pairs"):
        generate("pipeoffload", problem, base="dualpipe-v")


def test_the_block_search_refuses_pairs_and_both_ways():
    from zbopt.solvers.blocks.search import optimal_block
    with pytest.raises(ZboptError, match="does not model overlapped pairs"):
        optimal_block(one_device(), time_limit=5)
    both = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="bidirectional")
    with pytest.raises(ZboptError, match="placement 'bidirectional' sends microbatches two ways"):
        optimal_block(both, time_limit=5)


def test_compare_ranks_dualpipe_v_with_pairs_against_the_v_shapes_and_the_optimum(tmp_path):
    """examples/moe_overlap.yaml (README): DualPipeV pairs (FBW 2.0 < F + B + W = 2.8) and comes
    first among ZB-V and V-Half, which do not; the optimizer's row is never worse than it (hinted
    with it), the lower bound below every row; the HTML report's data hold the pairs (each member
    on the pair lane, split in three)."""
    from zbopt import compare, load_problem
    from zbopt.presentation.report import schedule_data, write_report
    problem = load_problem(Path(__file__).parent.parent / "examples" / "moe_overlap.yaml")
    comparison = compare(problem, ["dualpipe-v", "zb-v", "v-half"], optimal=True, time_limit=5)
    makespan = {row.name: row.makespan for row in comparison.rows}
    assert makespan["dualpipe-v"] < makespan["zb-v"] < makespan["v-half"]
    assert makespan["cpsat"] <= makespan["dualpipe-v"] + 1e-9
    assert all(comparison.lower_bound <= value + 1e-9 for value in makespan.values())
    write_report(tmp_path / "report.html", comparison)
    data = schedule_data(next(row.simulation for row in comparison.rows if row.name == "dualpipe-v"))
    pairs = next(row.simulation for row in comparison.rows if row.name == "dualpipe-v").pairs
    assert data["ops"]["lane"].count(3) == 3 * len(pairs) and set(data["ops"]["parts"]) == {1, 3}
