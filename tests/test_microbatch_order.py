"""The order microbatches enter the pipeline (`zbopt.core.problem.order`, `zbopt.schedules.ordering`):
relabelled schedules against hand-computed makespans, the rules against brute force over orders."""

import itertools

import pytest

from zbopt import Problem, ProblemError, generate, simulate
from zbopt.core.errors import NotApplicableError
from zbopt.core.problem.microbatches import EQUAL_MICROBATCHES
from zbopt.core.problem.order import entry_order, relabelled, reordered, sizes, sorted_order
from zbopt.interfaces.cli import main
from zbopt.planning.comparison import compare
from zbopt.schedules import registered
from zbopt.schedules.ordering import clusters, dynapipe_candidates

# F 0.5, 1, 1.5 and BW 1, 2, 3 per stage (tau = tokens / 2, no attention share)
THREE = Problem(num_devices=2, num_microbatches=3, forward_times=1, backward_times=2, microbatch_tokens=[1, 2, 3])
RULES = ("given", "longest-first", "shortest-first", "dynapipe")


def _makespan(problem: Problem, name: str, order) -> float:
    return simulate(problem, generate(name, problem, order=order)).makespan


def test_relabelled_1f1b_makespans_by_hand():
    """1F1B, p = 2, m = 3. Given order (costs F .5 1 1.5, BW 1 2 3): device 1 runs BW0 1-2, F1 2-3,
    BW1 3-5, F2 5-6.5, BW2 6.5-9.5; device 0 ends with 0BW2 9.5-12.5. Order 0, 2, 1: device 1 runs
    BW0 1-2, F 2-3.5, BW 3.5-6.5, F 6.5-7.5, BW 7.5-9.5; device 0's 0BW1 9.5-11.5."""
    assert _makespan(THREE, "1f1b", None) == 12.5
    assert _makespan(THREE, "1f1b", [0, 2, 1]) == 11.5
    assert _makespan(THREE, "1f1b", "longest-first") == 12.5  # 2, 1, 0: device 0's last BW 11.5-12.5
    schedule = generate("1f1b", THREE, order=[0, 2, 1])
    assert [str(op) for op in schedule.orders[0]] == ["0F0", "0F2", "0BW0", "0F1", "0BW2", "0BW1"]
    assert entry_order(THREE, schedule) == (0, 2, 1)


def test_rules_sort_by_total_work():
    assert sizes(THREE) == (3.0, 6.0, 9.0)  # F + BW on both stages
    assert sorted_order(THREE, "longest-first") == (2, 1, 0)
    assert sorted_order(THREE, "shortest-first") == (0, 1, 2)
    tied = THREE.replace(microbatch_tokens=[2, 1, 2])
    assert sorted_order(tied, "longest-first") == (0, 2, 1)  # ties keep their given order


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "eager-1f1b", "zb-auto"])
def test_brute_force_over_orders_bounds_every_rule(name):
    """Every order of 4 microbatches (p = 3): the best is no longer than any rule's, and DynaPipe's
    search, with 4 distinct sizes (a cluster each), tries them all and finds it."""
    problem = Problem(num_devices=3, num_microbatches=4, forward_times=1, backward_times=1, weight_times=1,
                      microbatch_tokens=[300, 2400, 900, 1500], attention_share=0.4)
    best = min(_makespan(problem, name, list(order)) for order in itertools.permutations(range(4)))
    rules = {rule: _makespan(problem, name, rule) for rule in RULES}
    assert all(best <= makespan + 1e-9 for makespan in rules.values())
    assert rules["dynapipe"] == pytest.approx(best)
    assert rules["dynapipe"] <= rules["given"]


def test_equal_microbatches_give_todays_schedules():
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    today = generate("1f1b", problem)
    for rule in RULES:
        assert generate("1f1b", problem, order=rule) == today  # every rule keeps 0..m-1
    swapped = generate("1f1b", problem, order=[7, 6, 5, 4, 3, 2, 1, 0])
    assert simulate(problem, swapped).makespan == simulate(problem, today).makespan


def test_order_repeats_in_every_iteration():
    problem = THREE.replace(iterations=2)
    schedule = generate("1f1b", problem, order=[2, 0, 1])
    firsts = [op.microbatch for op in schedule.orders[0] if op.kind == "F"]
    assert firsts == [2, 0, 1, 5, 3, 4]


def test_tables_reorder_by_columns():
    problem = Problem(num_devices=2, num_microbatches=3, forward_times=[[1, 2, 4], [0.1, 0.2, 0.3]],
                      backward_times=2)
    moved = reordered(problem, [2, 0, 1])
    assert moved.per_microbatch["forward_times"] == ((4.0, 1.0, 2.0), (0.3, 0.1, 0.2))
    assert moved.forward_times == problem.forward_times  # the means, exactly
    schedule = generate("1f1b", moved)
    assert simulate(problem, relabelled(schedule, [2, 0, 1], 3)).makespan == simulate(moved, schedule).makespan


def test_every_generator_takes_an_order():
    """A generator planned for the permuted problem and relabelled back: same makespan as the
    permuted problem's own schedule, for each family (loop, V, interleaved, bidirectional)."""
    tokens = dict(num_microbatches=6, forward_times=1, backward_times=1, weight_times=1,
                  microbatch_tokens=[512, 4096, 1024, 2048, 512, 8192], attention_share=0.3)
    problems = [Problem(num_devices=3, **tokens), Problem(num_devices=3, chunks_per_device=2, placement="v", **tokens),
                Problem(num_devices=2, chunks_per_device=2, **tokens),
                Problem(num_devices=3, chunks_per_device=2, placement="bidirectional", **tokens)]
    built = 0
    for problem in problems:
        order = sorted_order(problem, "longest-first")
        for entry in registered():
            try:
                ordered = generate(entry.name, problem, order=order)
            except NotApplicableError:
                continue
            own = generate(entry.name, reordered(problem, order))
            assert simulate(problem, ordered).makespan == simulate(reordered(problem, order), own).makespan, entry.name
            built += 1
    assert built >= 25


def test_dynapipe_clusters_at_the_largest_gaps():
    assert clusters([1, 1, 2, 10, 11, 30], 3) == (0, 0, 0, 1, 1, 2)
    assert clusters([5, 5, 5], 4) == (0, 0, 0)
    problem = THREE.replace(num_microbatches=6, microbatch_tokens=[1, 1, 2, 10, 11, 30])
    candidates = dynapipe_candidates(problem)  # 4 clusters (m <= 20): 1 1 | 2 | 10 11 | 30
    assert candidates[0] == (0, 1, 2, 3, 4, 5) and len(candidates) == 24  # the given order is one of 4!
    assert (5, 3, 4, 2, 0, 1) in candidates


def test_bidirectional_orders_each_route_among_itself():
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, placement="bidirectional",
                      forward_times=1, backward_times=1, microbatch_tokens=[1, 3, 2, 4])
    assert sorted_order(problem, "longest-first") == (1, 0, 3, 2)
    with pytest.raises(ProblemError, match=r"^order = .*each route orders its own"):
        generate("dualpipe", problem, order=[2, 1, 0, 3])


@pytest.mark.parametrize("order, message", [
    ([0, 0, 1], "permutation of 0..2"), ([0, 1], "permutation of 0..2"), ([True, 0, 2], "permutation"),
    ("fastest", "expected one of given, longest-first, shortest-first, dynapipe"), (3, "a rule"),
])
def test_bad_orders_name_the_key(order, message):
    with pytest.raises(ProblemError, match=rf"^order = .*{message}"):
        generate("1f1b", THREE, order=order)


def test_compare_adds_the_best_order_per_schedule():
    rows = {row.name: row for row in compare(THREE, ["1f1b", "gpipe"], bounds=False).rows}
    assert {name: row.makespan for name, row in rows.items() if "1f1b" in name} == \
        {"1f1b": 12.5, "1f1b (dynapipe order)": 11.5}
    assert rows["1f1b (dynapipe order)"].to_dict()["order"] == [0, 2, 1]
    ordered = compare(THREE, ["1f1b"], bounds=False, order=[0, 2, 1]).rows
    assert [(row.name, row.makespan) for row in ordered] == [("1f1b", 11.5)]
    equal = compare(THREE.replace(**EQUAL_MICROBATCHES), ["1f1b"], bounds=False).rows
    assert [row.name for row in equal] == ["1f1b"] and "order" not in equal[0].to_dict()


CONFIG = "num_devices: 2\nnum_microbatches: 3\nforward_times: 1\nbackward_times: 2\nmicrobatch_tokens: [1, 2, 3]\n"


def _run(capsys, *argv):
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("order, needle", [
    ("fastest", "argument --order: expected given, longest-first, shortest-first, dynapipe or the microbatches"),
    ("1,x", "argument --order: expected"), ("2,2,0", "order = [2, 2, 0]: expected a permutation of 0..2"),
])
def test_cli_bad_order_is_one_line(tmp_path, capsys, order, needle):
    (tmp_path / "c.yaml").write_text(CONFIG)
    for command in ("simulate", "compare"):
        status, out, err = _run(capsys, command, tmp_path / "c.yaml", "--order", order)
        assert (status, out) == (2, "") and len(err.strip().splitlines()) == 1 and needle in err


def test_cli_order_simulates_and_exports(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(CONFIG)
    status, out, _ = _run(capsys, "simulate", tmp_path / "c.yaml", "--order", "dynapipe")
    assert status == 0 and "makespan        11.5" in out and "order           0,2,1" in out
    status, out, _ = _run(capsys, "export", tmp_path / "c.yaml", "--order", "0,2,1", "-o", tmp_path / "x.csv")
    assert status == 0 and "microbatches enter in the order 0,2,1" in out and "must feed them in that order" in out
    assert (tmp_path / "x.csv").read_text().splitlines()[0] == "0F0,0F2,0B0,0F1,0B2,0B1"
    status, out, _ = _run(capsys, "export", tmp_path / "c.yaml", "--order", "0,2,1", "--format", "megatron",
                          "-o", tmp_path / "x.json")
    assert status == 0 and "must feed them in that order" in out  # no ids: numbered as they enter
    status, _, err = _run(capsys, "simulate", "--schedule-file", tmp_path / "x.csv", "-c", tmp_path / "c.yaml",
                          "--order", "given")
    assert status == 2 and "a schedule file's order is its own" in err


def test_report_and_trace_say_a_microbatchs_tokens():
    from zbopt.io.trace import chrome_trace
    from zbopt.presentation.report import schedule_data

    simulation = simulate(THREE, generate("1f1b", THREE, order=[0, 2, 1]))
    assert schedule_data(simulation)["tokens"] == [1, 2, 3]
    events = [event for event in chrome_trace(simulation)["traceEvents"] if event.get("name") == "0F2"]
    assert events[0]["args"]["tokens"] == 3
    equal = THREE.replace(**EQUAL_MICROBATCHES)
    assert schedule_data(simulate(equal, generate("1f1b", equal)))["tokens"] is None


def test_packed_documents_show_their_total_tokens():
    from zbopt.io.trace import chrome_trace
    from zbopt.presentation.report import schedule_data

    packed = Problem(num_devices=2, num_microbatches=2, microbatch_tokens=[[100, 300], 50])
    simulation = simulate(packed, generate("1f1b", packed))
    assert schedule_data(simulation)["tokens"] == [400, 50]
    events = [event for event in chrome_trace(simulation)["traceEvents"] if event.get("name") == "0F0"]
    assert events[0]["args"]["tokens"] == 400
