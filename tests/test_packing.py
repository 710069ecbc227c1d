"""Packing sequences into microbatches (`zbopt.planning.packing`): each rule by hand, the balanced one
against brute force."""

import itertools

import pytest

from zbopt import Problem
from zbopt.core.errors import ZboptError
from zbopt.core.problem.batch import document_work, pack, packed_tokens


def test_the_loaders_way_fills_in_order():
    assert pack([5, 4, 3, 6], 8, "loader") == [[0], [1, 2], [3]]


def test_first_fit_decreasing_by_hand():
    """6 opens one, 5 another, 4 a third (rooms 2 and 3), 3 joins the 5."""
    assert pack([5, 4, 3, 6], 8, "first-fit-decreasing") == [[3], [0, 2], [1]]


def _brute_force_largest(lengths, budget, count, share):
    """The least largest work over every assignment of the sequences to `count` microbatches."""
    best = float("inf")
    reference = max(lengths)
    for assignment in itertools.product(range(count), repeat=len(lengths)):
        loads, tokens = [0.0] * count, [0] * count
        for length, b in zip(lengths, assignment, strict=True):
            loads[b] += round(1000 * document_work(length, share, reference))
            tokens[b] += length
        if max(tokens) <= budget:
            best = min(best, max(loads))
    return best


@pytest.mark.parametrize("lengths, budget, count, share", [
    ([900, 100, 300, 700, 500, 200], 1000, 3, 0.0),
    ([900, 100, 300, 700, 500, 200], 1000, 3, 0.5),
    ([512, 512, 2048, 128, 1024, 256, 64], 2048, 3, 0.3),
    ([8, 1, 1, 1, 1, 4, 4], 10, 4, 0.8),
])
def test_balanced_packing_is_the_brute_force_optimum(lengths, budget, count, share):
    packing = pack(lengths, budget, "balanced", attention_share=share, microbatches=count)
    assert sorted(index for microbatch in packing for index in microbatch) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in microbatch) <= budget for microbatch in packing)
    reference = max(lengths)
    largest = max(sum(round(1000 * document_work(lengths[i], share, reference)) for i in microbatch)
                  for microbatch in packing)
    assert largest == _brute_force_largest(lengths, budget, count, share)


def test_packed_microbatches_make_a_problem():
    lengths = [900, 100, 300, 700]
    tokens = packed_tokens(lengths, pack(lengths, 1000, "first-fit-decreasing"))
    assert tokens == [[900, 100], [700, 300]]
    problem = Problem(num_devices=2, num_microbatches=len(tokens), microbatch_tokens=tokens, attention_share=0.5)
    assert problem.cost("F", 0, 0) > problem.cost("F", 0, 1)  # 900² + 100² > 700² + 300²


@pytest.mark.parametrize("call, message", [
    (lambda: pack([5, 9], 8), r"^sequence_lengths: sequence 1 has 9 tokens, above token_budget 8$"),
    (lambda: pack([5, -1], 8), r"^sequence_lengths: sequence 1 = -1: expected a positive whole number$"),
    (lambda: pack([5], 0), r"^token_budget = 0: expected a positive whole number of tokens$"),
    (lambda: pack([5], 8, "best"), r"^packing rule 'best': unknown \(known: loader, first-fit-decreasing, balanced\)$"),
    (lambda: pack([5, 5, 5], 8, "balanced", microbatches=1), r"^microbatches = 1: 15 tokens do not fit in 1 of 8$"),
    (lambda: pack([5, 5, 5], 8, "balanced", microbatches=2),
     r"^microbatches = 2: the sequences fit in no 2 microbatches of 8 tokens \(first-fit decreasing needs 3\)$"),
    (lambda: pack([5, 5], 8, "balanced", microbatches=3), r"^microbatches = 3: expected a whole number from 1"),
])
def test_bad_input_is_one_line(call, message):
    with pytest.raises(ZboptError, match=message):
        call()


def test_a_config_packs_its_sequences():
    from zbopt.core.problem.config import problem_from_config

    base = {"num_devices": 2, "sequence_lengths": [600, 500, 400, 500], "token_budget": 1000}
    loader = problem_from_config(base)  # the loader's way unless a rule is named
    assert (loader.num_microbatches, loader.microbatch_tokens) == (3, ((600,), (500, 400), (500,)))
    packed = problem_from_config({**base, "packing": "first-fit-decreasing"})
    assert (packed.num_microbatches, packed.microbatch_tokens) == (2, ((600, 400), (500, 500)))


@pytest.mark.parametrize("values, message", [
    ({"token_budget": 1000}, r"^token_budget \(config\): give sequence_lengths too, which packing needs$"),
    ({"sequence_lengths": [5], "token_budget": 8, "num_microbatches": 4},
     r"^sequence_lengths \(config\) and num_microbatches \(config\) both give the microbatches; give one$"),
    ({"sequence_lengths": [5, 9], "token_budget": 8},
     r"^sequence_lengths: sequence 1 has 9 tokens, above token_budget 8$"),
])
def test_bad_packing_keys_are_one_line(values, message):
    from zbopt.core.problem.config import problem_from_config

    with pytest.raises(ZboptError, match=message):
        problem_from_config({"num_devices": 2, **values})


def test_packing_gains_are_against_the_loaders_packing_in_its_order():
    """Each row's gain is 1 - its best makespan / the loader's packing's given-order makespan (its
    first row's), and the best order is no longer than the given one."""
    from zbopt.planning.packing import packing_gains

    lengths = [600, 500, 400, 500, 100, 900, 200, 700]
    rows = packing_gains(lengths, 1000, {"num_devices": 2, "weight_times": 1.0}, schedules=("1f1b",),
                         attention_share=0.3, time_limit=5)
    assert [row["packing"] for row in rows] == ["loader", "first-fit-decreasing", "balanced"]
    base = rows[0]["given"]
    for row in rows:
        assert row["best"] <= row["given"] + 1e-9
        assert row["gain"] == pytest.approx(1 - row["best"] / base)
    tokens = packed_tokens(lengths, pack(lengths, 1000, "loader"))
    loader = Problem(num_devices=2, weight_times=1.0, num_microbatches=len(tokens), microbatch_tokens=tokens,
                     attention_share=0.3, reference_tokens=1000)  # costs at the budget for every packing
    from zbopt import generate, simulate

    assert base == simulate(loader, generate("1f1b", loader)).makespan
