"""Megatron's interleaved 1F1B against the Megatron paper's bubble and its warm-up rule."""

import pytest

from zbopt import NotApplicableError, Problem, generate, simulate
from zbopt.schedules.interleaved import schedule_table


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("rounds", [1, 2, 3])
@pytest.mark.parametrize("split", [False, True])
def test_bubble_is_one_vth_of_1f1b(p, v, rounds, split):
    """Narayanan et al. (SC 2021) §2.2: with v chunks the bubble shrinks to (p-1)(t_f+t_b)/v,
    t_f = v·f the whole device's forward. With m a multiple of p, c = 0 and a fused backward:
    makespan (m·v + p-1)(f+b). Split (W right after B): (m·v + p-1)(f+b) + m·v·w, the drain
    carrying only B upstream as in 1F1B. Device 0 holds its 2(p-1) + (v-1)p warm-up forwards
    plus one."""
    m = rounds * p
    f, b, w = 1.0, 1.5, 0.5
    problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=v, forward_times=f, backward_times=b + w)
    expected = (m * v + p - 1) * (f + b + w)
    if split:
        problem = problem.replace(backward_times=b, weight_times=w)
        expected = (m * v + p - 1) * (f + b) + m * v * w
    result = simulate(problem, generate("interleaved-1f1b", problem))
    assert result.makespan == pytest.approx(expected)
    assert result.peak_memory[0] == pytest.approx(min(2 * (p - 1) + (v - 1) * p + 1, m * v))


def test_schedule_table_follows_groups_then_chunks():
    assert schedule_table(4, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    # a last, short group keeps the remaining microbatches together
    assert schedule_table(5, 2, 4)[-2:] == [(4, 0), (4, 1)]


def test_larger_groups_hold_more_but_keep_the_order_valid():
    problem = Problem(num_devices=4, num_microbatches=12, chunks_per_device=2, forward_times=1, backward_times=2)
    default = simulate(problem, generate("interleaved-1f1b", problem))
    wide = simulate(problem, generate("interleaved-1f1b", problem, microbatch_group_size_per_vp_stage=6))
    assert wide.makespan >= default.makespan - 1e-9
    # device 0's warm-up grows by (v-1)(6-4) = 2 forwards
    assert wide.peak_memory[0] - default.peak_memory[0] == pytest.approx(2)


@pytest.mark.parametrize(
    ("changes", "options", "needs"),
    [({"chunks_per_device": 1}, {}, "chunks_per_device >= 2"), ({"placement": "v"}, {}, "placement loop"),
     ({"num_microbatches": 9}, {}, r"m a multiple of .* \(got m = 9, group = 4, p = 4"),
     ({}, {"microbatch_group_size_per_vp_stage": 2}, r".*, a group >= p or of all m \(got m = 8, group = 2, p = 4")],
)
def test_preconditions(changes, options, needs):
    problem = Problem(**{"num_devices": 4, "num_microbatches": 8, "chunks_per_device": 2, **changes})
    with pytest.raises(NotApplicableError, match=f"interleaved-1f1b needs {needs}"):
        generate("interleaved-1f1b", problem, **options)


@pytest.mark.parametrize("value", ["abc", "0", "-2", "true", "1.5"])
def test_a_bad_group_size_is_one_line_naming_the_option(capsys, value):
    from zbopt.interfaces.cli import main

    status = main(["simulate", "-s", "4", "-b", "8", "-v", "2", "--schedule", "interleaved-1f1b",
                   "--option", f"microbatch_group_size_per_vp_stage={value}"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "microbatch_group_size_per_vp_stage" in err and "positive whole number" in err
