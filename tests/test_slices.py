"""Sequence slices (`zbopt.core.problem.slices`) and Seq1F1B (`zbopt.schedules.seq1f1b`): the per-slice costs,
the slice dependencies in the op table and the simulator, the schedule against the paper's
description, the optimizer against brute force, and bad input."""

import pytest

from tests.reference import brute_force_optimum
from zbopt import DeadlockError, Problem, ProblemError, Schedule, ScheduleError, generate, simulate, solve
from zbopt.core.dag import op_graph
from zbopt.core.errors import NotApplicableError, ZboptError
from zbopt.core.ops import Op, op_table
from zbopt.core.problem.config import problem_from_config
from zbopt.io.torch_format import torch_csv
from zbopt.schedules import get
from zbopt.solvers.bounds import lower_bounds

# two sequences of 2 and 4 tokens, 2 slices each, costs for a sequence of 4 tokens (half attention):
# slice factors (1 - a)·(e - s) + a·(e² - s²) over spans in quarters give F = 5, 7 | 12, 20
SLICED = dict(num_devices=2, num_microbatches=4, sequence_slices=2, microbatch_tokens=[2, 4], attention_share=0.5,
              reference_tokens=4, forward_times=32.0, backward_times=64.0)


def _orders(text: str) -> Schedule:
    return Schedule([line.split() for line in text.strip().splitlines()])


def test_later_slices_cost_more_and_a_sequences_slices_add_up_to_it():
    problem = Problem(**SLICED, weight_times=8.0)
    assert [problem.cost("F", 0, j) for j in range(4)] == [5.0, 7.0, 12.0, 20.0]
    assert [problem.cost("B", 1, j) for j in range(4)] == [10.0, 14.0, 24.0, 40.0]
    assert [problem.cost("W", 0, j) for j in range(4)] == [2.0, 2.0, 4.0, 4.0]  # linear: 8 · tokens / 4
    assert [problem.memory_delta("F", 0, microbatch=j) for j in range(4)] == [0.25, 0.25, 0.5, 0.5]
    whole = Problem(**{**SLICED, "num_microbatches": 2, "sequence_slices": 1}, weight_times=8.0)
    for kind in ("F", "B", "W"):
        assert [whole.cost(kind, 0, q) for q in range(2)] == [problem.cost(kind, 0, 2 * q) +
                                                              problem.cost(kind, 0, 2 * q + 1) for q in range(2)]


def test_uneven_tokens_split_with_the_larger_slices_last_and_no_tokens_split_the_reference():
    problem = Problem(num_devices=2, num_microbatches=2, sequence_slices=2, microbatch_tokens=[5], forward_times=5.0)
    assert [problem.cost("F", 0, j) for j in range(2)] == [2.0, 3.0]  # tokens 0..2 and 2..5
    untokened = Problem(num_devices=2, num_microbatches=2, sequence_slices=2, attention_share=1.0, forward_times=4.0)
    assert [untokened.cost("F", 0, j) for j in range(2)] == [1.0, 3.0]  # 1/4 and 3/4 of the causal pairs


def test_slices_are_ops_of_their_own_with_the_slice_dependencies():
    problem = Problem(num_devices=2, num_microbatches=4, sequence_slices=2, weight_times=1.0)
    table = op_table(problem)
    waits = {table.op(i): [table.op(j) for j in inputs] for i, inputs in enumerate(table.same_device_inputs) if inputs}
    assert waits == {Op("F", s, j + 1): [Op("F", s, j)] for s in (0, 1) for j in (0, 2)} | \
        {Op("B", s, j): [Op("B", s, j + 1)] for s in (0, 1) for j in (0, 2)}
    graph = op_graph(problem)
    assert graph.has_edge(Op("F", 1, 2), Op("F", 1, 3)) and graph.has_edge(Op("B", 0, 3), Op("B", 0, 2))
    assert not graph.has_edge(Op("F", 0, 1), Op("F", 0, 2))  # another sequence
    assert problem.microbatch_classes == (0, 1, 2, 3) and not problem.columns_interchangeable
    assert problem.uniform_relaxation().sequence_slices == 1


def test_the_simulator_refuses_orders_and_times_that_break_them():
    problem = Problem(num_devices=2, num_microbatches=2, sequence_slices=2)
    with pytest.raises(DeadlockError, match="device 0 is stuck at 0BW0, waiting for its slice 0BW1 "):
        simulate(problem, _orders("0F0 0F1 0BW0 0BW1\n1F0 1F1 1BW0 1BW1"))
    # F 0.5, BW 1 per slice: given times may not run 1BW0 (1.5-2.5) before 1BW1 (2.5-3.5)
    timed = Schedule(_orders("0F0 0F1 0BW1 0BW0\n1F0 1F1 1BW0 1BW1").orders, [[0, 0.5, 3.5, 4.5], [0.5, 1, 1.5, 2.5]])
    with pytest.raises(ScheduleError, match=r"^1BW0 starts at 1.5, before its slice 1BW1 ends at 3.5$"):
        simulate(problem, timed)


def test_seq1f1b_runs_the_papers_order_op_for_op():
    """p = 3, two sequences of two slices (F 0.5, BW 1 per slice): device s runs p - s - 1 + k - 1
    warm-up forwards, then a forward and a backward in turn, the backwards sequence by sequence,
    each sequence's last slice first (Sun et al., §3 and Fig. 1; the authors' warm-up count).
    By hand: device 2 runs 2F0 1-1.5, 2F1 1.5-2, 2BW1 2-3, 2F2 3-3.5, 2BW0 3.5-4.5, 2F3 4.5-5 (1F3
    ended at 4.5), 2BW3 5-6, 2BW2 6-7; device 1's 1BW2 runs 7-8 and device 0's 0BW2 8-9."""
    problem = Problem(num_devices=3, num_microbatches=4, sequence_slices=2)
    schedule = generate("seq1f1b", problem)
    assert [" ".join(str(op) for op in order) for order in schedule.orders] == [
        "0F0 0F1 0F2 0F3 0BW1 0BW0 0BW3 0BW2",
        "1F0 1F1 1F2 1BW1 1F3 1BW0 1BW3 1BW2",
        "2F0 2F1 2BW1 2F2 2BW0 2F3 2BW3 2BW2"]
    result = simulate(problem, schedule)
    assert result.makespan == 9.0  # 1F1B on the unsliced sequences: (2 + 3 - 1) · 3 = 12
    assert list(result.peak_memory) == [2.0, 1.5, 1.0]  # p - s + k - 1 slices of 0.5
    unsliced = Problem(num_devices=3, num_microbatches=2)
    assert simulate(unsliced, generate("1f1b", unsliced)).makespan == 12.0


@pytest.mark.parametrize("devices, sequences, slices", [(4, 4, 2), (4, 2, 4), (2, 3, 3)])
def test_seq1f1b_keeps_its_promise_and_splits_the_backward(devices, sequences, slices):
    problem = Problem(num_devices=devices, num_microbatches=sequences * slices, sequence_slices=slices,
                      microbatch_tokens=[8 * (q + 1) for q in range(sequences)], attention_share=0.4,
                      weight_times=1.0, p2p_time=0.1, iterations=2)
    schedule = generate("seq1f1b", problem)
    result = simulate(problem, schedule)
    first = schedule.orders[0]
    assert [op.kind for op in first[:devices + slices - 1]] == ["F"] * (devices + slices - 1)
    assert first[devices + slices - 1:devices + slices + 1] == (Op("B", 0, slices - 1), Op("W", 0, slices - 1))
    promised = get("seq1f1b").peak_memory_bound(problem)
    assert all(peak <= bound + 1e-9 for peak, bound in zip(result.peak_memory, promised, strict=True))


def test_who_applies():
    sliced = Problem(num_devices=2, num_microbatches=4, sequence_slices=2)
    with pytest.raises(NotApplicableError, match="1f1b needs sequence_slices = 1"):
        generate("1f1b", sliced)
    with pytest.raises(NotApplicableError, match=r"seq1f1b needs sequence_slices > 1"):
        generate("seq1f1b", Problem(num_devices=2, num_microbatches=4))
    with pytest.raises(NotApplicableError, match="seq1f1b needs chunks_per_device = 1"):
        generate("seq1f1b", Problem(num_devices=2, num_microbatches=4, sequence_slices=2, chunks_per_device=2))
    with pytest.raises(ZboptError, match="torch schedule CSV has no sequence slices"):
        torch_csv(sliced, generate("seq1f1b", sliced))


@pytest.mark.parametrize("solver", ["cpsat", "highs"])
def test_the_optimizer_schedules_slices_like_any_ops(solver):
    """Brute force over every pair of device orders: 181 (Seq1F1B: 195)."""
    problem = Problem(**SLICED, p2p_time=1.0)
    assert brute_force_optimum(problem) == 181.0
    assert simulate(problem, generate("seq1f1b", problem)).makespan == 195.0
    assert lower_bounds(problem).best <= 181.0
    result = solve(problem, solver, time_limit=30, workers=1)
    assert (result.status, result.objective) == ("optimal", 181.0)


@pytest.mark.parametrize("changes, message", [
    ({"sequence_slices": 0}, r"sequence_slices = 0: expected a positive integer"),
    ({"sequence_slices": 1.5}, r"sequence_slices = 1.5: expected a positive integer"),
    ({"sequence_slices": True}, r"sequence_slices = True: expected a positive integer"),
    ({"sequence_slices": 3}, r"sequence_slices = 3: num_microbatches \(4\) counts the slices"),
    ({"microbatch_tokens": [9, 1]}, r"sequence_slices = 2: above the tokens of sequence 1 \(1\)"),
    ({"microbatch_tokens": [9, 9, 9, 9]}, r"microbatch_tokens.*one token count per sequence \(2\), got 4"),
    ({"reference_tokens": 4}, r"reference_tokens.*needs microbatch_tokens"),
    ({"allow_recompute": True, "checkpoint_memory": 0.1}, r"sequence_slices = 2: not with allow_recompute"),
    ({"placement": "bidirectional", "chunks_per_device": 2, "num_microbatches": 6},
     r"sequence_slices = 2: with the bidirectional placement each route's microbatches must hold whole sequences"),
])
def test_bad_input_is_one_line_naming_the_key(changes, message):
    with pytest.raises(ProblemError, match=message) as caught:
        Problem(**{"num_devices": 2, "num_microbatches": 4, "sequence_slices": 2, **changes})
    assert "\n" not in str(caught.value)


def test_config_round_trip_and_describe():
    problem = problem_from_config({"num_devices": 2, "num_microbatches": 4, "sequence_slices": 2,
                                   "microbatch_tokens": [6, 8]})
    assert Problem.from_dict(problem.to_dict()) == problem
    assert "2 sequences of 2 slices" in problem.describe()
    assert "sequence_slices" not in Problem(num_devices=2, num_microbatches=4).to_dict()
    with pytest.raises(ZboptError, match="sequence_slices"):
        problem_from_config({"num_devices": 2, "num_microbatches": 4, "sequence_slices": 8})


def test_slices_keep_their_order_and_refuse_packed_documents():
    sliced = Problem(num_devices=2, num_microbatches=4, sequence_slices=2, microbatch_tokens=[4, 8])
    with pytest.raises(ProblemError, match=r"order.*not with sequence_slices"):
        generate("seq1f1b", sliced, order=[1, 0, 2, 3])
    with pytest.raises(ProblemError, match=r"sequence_slices.*not with packed documents \(sequence 0: \[2, 2\]\)"):
        Problem(num_devices=2, num_microbatches=4, sequence_slices=2, microbatch_tokens=[[2, 2], 8])


def test_a_sequences_slices_are_held_together_and_named_by_their_tokens():
    """Review findings: the floor holds every slice of a sequence at once (a limit below it is
    refused, one at it fits a schedule: brute force), and traces name each slice's own tokens."""
    from zbopt.io.trace import chrome_trace

    problem = Problem(num_devices=2, num_microbatches=2, sequence_slices=2)
    assert problem.min_memory_limit == (1.0, 1.0)
    with pytest.raises(ProblemError, match="one sequence's activations"):
        problem.replace(memory_limit=0.6)
    assert brute_force_optimum(problem.replace(memory_limit=1.0)) < float("inf")
    tokened = Problem(num_devices=2, num_microbatches=4, sequence_slices=2, microbatch_tokens=[5, 8])
    events = chrome_trace(simulate(tokened, generate("seq1f1b", tokened)))["traceEvents"]
    tokens = {event["name"]: event["args"]["tokens"] for event in events if event.get("name", "").startswith("0F")}
    assert tokens == {"0F0": 2, "0F1": 3, "0F2": 4, "0F3": 4}
