"""Hostile input (issue 29): every file zbopt reads goes through `zbopt.io.read`'s limits, every
number through the tolerance's range, every message shows a user value shortened; each refusal is
one stderr line naming the culprit and exit status 2, never a traceback or a hang."""

import json

import numpy as np
import pytest

from zbopt import Problem, ProblemError
from zbopt.core.errors import SHORT_LENGTH, shorten
from zbopt.interfaces.cli import main
from zbopt.io.read import MAX_ALIAS_NODES, MAX_DEPTH, read_data


def refused(capsys, *argv) -> str:
    """The one stderr line of a run that must exit 2 (and print no traceback)."""
    status = main([str(token) for token in argv])
    out, err = capsys.readouterr()
    assert status == 2, (status, out[-500:], err[-500:])
    assert err.count("\n") == 1 and err.startswith("zbopt: ") and "Traceback" not in err, err[:2000]
    return err.strip()


# ------------------------------------------------------------------- item 2: large times
@pytest.mark.parametrize("argv, key, most", [
    (["compare", "-w", "1e9"], "--weight-times 1000000000", "at most 2.49e+06 allowed here"),
    (["solve", "--p2p-time", "1e9", "--time-limit", "5"], "--p2p-time 1000000000", "at most 1.24e+06 allowed here"),
])
def test_times_spanning_more_than_the_solvers_hold_are_refused_with_the_largest_allowed(capsys, argv, key, most):
    line = refused(capsys, *argv)
    assert line.startswith(f"zbopt: {key}: one microbatch's ops take ") and most in line
    assert "more than 1e7 x the shortest cost (forward_times 1)" in line


def test_frontier_refuses_a_config_whose_weight_times_are_1e9(tmp_path, capsys):
    config = tmp_path / "w.yaml"
    config.write_text("weight_times: 1e9\n")  # YAML 1.2's float, as JSON writes it
    line = refused(capsys, "frontier", config, "--memory-limits", "4:8:2", "--time-limit", "2")
    assert line.startswith(f"zbopt: {config}: weight_times = 1000000000.0: one microbatch's ops take 4e+09")


def test_the_largest_allowed_value_is_allowed_and_runs(capsys):
    assert main(["compare", "-w", "2.49e6"]) == 0
    with pytest.raises(ProblemError, match="weight_times"):
        Problem(num_devices=4, num_microbatches=8, weight_times=2.5e6)


def test_the_total_work_stays_within_the_tolerance():
    with pytest.raises(ProblemError) as refusal:
        Problem(num_devices=4, num_microbatches=1000, weight_times=2e6)
    assert str(refusal.value) == ("weight_times = 2000000.0: all ops together take 8e+09, more than 1e9 x the "
                                  "shortest cost (forward_times 1); at most 2.49e+05 allowed here or the shortest "
                                  "cost at least 8.01")


def test_memory_that_holds_nothing_is_in_range():
    assert Problem(num_devices=1, num_microbatches=2, activation_memory=0, memory_limit=0).memory_limit == (0.0,)


def test_a_switched_off_mechanism_s_false_times_are_not_counted():  # found by the fuzz test
    assert Problem(num_devices=2, num_microbatches=2, offload_times=False, recompute_times=False).offload_times is False


# ------------------------------------------------------------------- item 3: near the float limit
def test_times_near_the_float_limit_are_refused(capsys):
    line = refused(capsys, "simulate", "-f", "1e308", "-bw", "1e308", "--json")
    assert line == "zbopt: --forward-times 1e+308: one microbatch's ops take inf, more than 1e15; give smaller values"


@pytest.mark.parametrize("changes, key", [({"forward_times": 1e-10, "backward_times": 1e-10}, "backward_times"),
                                          ({"memory_limit": 1e300}, "memory_limit"),
                                          ({"activation_memory": 2e14}, "activation_memory"),
                                          ({"unshard_memory": [1e300, 0, 0, 0]}, "unshard_memory"),
                                          ({"gradient_memory": 2e15, "grad_reduce_times": 1}, "gradient_memory")])
def test_times_below_the_tolerance_and_memory_beyond_the_exact_integers_are_refused(changes, key):
    with pytest.raises(ProblemError) as refusal:
        Problem(num_devices=4, num_microbatches=8, **changes)
    assert refusal.value.key == key


@pytest.mark.parametrize("start", [1e20, 1e300])
def test_start_times_beyond_the_tolerance_range_are_refused(tmp_path, capsys, start):
    path = tmp_path / "timed.json"
    path.write_text(json.dumps({"orders": [["0F0", "0BW0"], ["1F0", "1BW0"]],
                                "start_times": [[start, start + 3], [start + 1, start + 2]],
                                "problem": {"num_devices": 2, "num_microbatches": 1}}))
    line = refused(capsys, "simulate", "--schedule-file", path)
    assert line == (f"zbopt: schedule file '{path}': start_times of device 0, item 0: {start:g} is outside "
                    "+-1e+09, the range zbopt's tolerance holds in")


# ------------------------------------------------------------------- item 4: not UTF-8
@pytest.mark.parametrize("name, content, flag", [("bad.yaml", b"forward_times: 1\n\xff\xfe: 2\n", None),
                                                 ("bad.json", b"\x89PNG\r\n\x1a\n\x00\x00", None),
                                                 ("s.json", b'{"orders": [["\xff"]]}', "--schedule-file")])
def test_a_file_that_is_not_utf8_is_named_with_its_byte_offset(tmp_path, capsys, name, content, flag):
    path = tmp_path / name
    path.write_bytes(content)
    line = refused(capsys, "simulate", *([flag] if flag else []), path)
    offset = content.index(next(byte for byte in content if byte >= 0x80).to_bytes(1, "big"))
    assert f"'{path}': not UTF-8 text (byte {offset}: " in line


# ------------------------------------------------------------------- item 5: deep nesting
@pytest.mark.parametrize("name, text", [("deep.yaml", "forward_times: " + "[" * 500 + "]" * 500 + "\n"),
                                        ("deep.json", "[" * 100_000 + "]" * 100_000)])
def test_deep_nesting_is_refused_before_it_recurses(tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert f"nested deeper than {MAX_DEPTH} levels" in refused(capsys, "simulate", path)


# ------------------------------------------------------------------- item 6: alias bomb
def _alias_bomb() -> str:
    """Nine lists of nine aliases to the list before, under forward_times: 9^9 numbers if expanded."""
    lists, previous = ["&a [1, 1, 1, 1, 1, 1, 1, 1, 1]"], "a"
    for name in "bcdefghi":
        lists.append(f"&{name} [{', '.join(['*' + previous] * 9)}]")
        previous = name
    return "forward_times: [" + ", ".join(lists) + "]\n"


def test_an_alias_bomb_is_refused_at_once(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert len(path.read_bytes()) < 700
    line = refused(capsys, "simulate", path)
    assert line == f"zbopt: config file '{path}': its aliases repeat 490,329,036 nodes (at most {MAX_ALIAS_NODES:,})"


def test_a_few_aliases_still_read(tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text("forward_times: &t [1, 2, 1, 2]\nbackward_times: *t\n")
    assert read_data(path, "config file") == {"forward_times": [1, 2, 1, 2], "backward_times": [1, 2, 1, 2]}


# ------------------------------------------------------------------- item 7: huge values in messages
def test_a_huge_key_is_shortened_in_the_message(tmp_path, capsys):
    path = tmp_path / "key.json"
    path.write_text(json.dumps({"k" * 5_000_000: 1}))
    line = refused(capsys, "simulate", path)
    assert line.startswith(f"zbopt: {path}: unknown key 'kkkk")
    assert len(line.split("'")[1]) < 100  # the key shortened; the known keys follow it


def test_a_huge_list_of_times_is_shortened_in_the_message(tmp_path, capsys):
    path = tmp_path / "times.json"
    path.write_text(json.dumps({"forward_times": [1.0] * 1_000_000}))
    line = refused(capsys, "simulate", path)
    assert "forward_times = [1.0, 1.0" in line and "expected one value per virtual stage (4), got 1000000" in line
    assert len(line) < 300


def test_shorten_keeps_a_value_within_the_short_length():
    assert shorten("x" * 10**6).startswith("'xxx") and len(shorten("x" * 10**6)) <= SHORT_LENGTH
    nested: list = [1]
    for _ in range(30):
        nested = [nested] * 10  # 10^30 leaves if walked
    assert len(shorten(nested)) <= SHORT_LENGTH


# ------------------------------------------------------------------- item 8: one line
def test_a_nul_byte_is_one_line(tmp_path, capsys):
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"\x00")
    assert refused(capsys, "simulate", path) == (f"zbopt: config file '{path}': not valid YAML (character 0: "
                                                 "#x0000, special characters are not allowed)")


# ------------------------------------------------------------------- item 14: duplicate keys
@pytest.mark.parametrize("name, text", [("dup.yaml", "forward_times: 1\nforward_times: 2\n"),
                                        ("dup.json", '{"forward_times": 1,\n "forward_times": 2}')])
def test_a_duplicate_key_is_refused_naming_the_key_and_line(tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_text(text)
    line = refused(capsys, "simulate", path)
    assert "'forward_times' given twice" in line and "line 2" in line


# ------------------------------------------------------------------- item 15: numpy values
def test_numpy_numbers_and_arrays_are_accepted_and_stored_plain():
    problem = Problem(num_devices=np.int64(4), num_microbatches=np.int64(8), forward_times=np.array([1.0, 2, 1, 1]),
                      p2p_time=np.float32(0.5), flush=np.bool_(True), memory_limit=np.array([9, 9, 9, 9]),
                      overlap_times={"FBW": np.array([2.5] * 4)})
    assert problem == Problem(num_devices=4, num_microbatches=8, forward_times=[1, 2, 1, 1], p2p_time=0.5,
                              memory_limit=9, overlap_times={"FBW": 2.5})
    assert type(problem.num_microbatches) is int and type(problem.forward_times[1]) is float
    assert type(problem.flush) is bool


def test_a_path_with_a_line_break_is_named_on_one_line(tmp_path, capsys):
    """The review's find: a missing config whose name holds a line break printed two lines."""
    line = refused(capsys, "simulate", str(tmp_path / "a\nb.yaml"))
    assert "a\\nb.yaml" in line


def test_a_short_latency_is_no_shortest_cost():
    """Milliseconds with a 1 µs link (p = 64, m = 4096, v = 2; 1.6M ops): a latency below the
    tolerance need only be ignorable, not told apart, so it does not set the range; p2p_time = 0
    and 0.001 are alike (the review found 0.001 refused: total 3e6 > 1e9 x 0.001)."""
    costs = {"forward_times": 1.5, "backward_times": 3, "weight_times": 1.2}
    for p2p_time in (0, 0.001):
        problem = Problem(num_devices=64, num_microbatches=4096, chunks_per_device=2, p2p_time=p2p_time, **costs)
        assert problem.p2p_time == p2p_time


def test_a_huge_count_is_named_shortly(capsys):
    line = refused(capsys, "simulate", "-b", str(10**400))
    assert len(line) < 300 and line.startswith("zbopt: --num-microbatches 1000")


# ------------------------------------------------------------------- issue 42: messages that blame the right key
COSTS = "num_stages: 2\nbackward_times: 1\nweight_times: 1\n"


@pytest.mark.parametrize("config, message", [
    # a row's largest value is what is out of range, not the row's mean
    ("num_microbatches: 2\nforward_times: [[1, 1e308], [1, 1]]\n",
     "forward_times = 1e+308: one microbatch's ops take 1e+308"),
    ("num_microbatches: 2\nforward_times: 1\nmicrobatch_tokens: [100, 200]\nreference_tokens: 1e-300\n",
     "reference_tokens = 1e-300: the largest microbatch's 200 tokens are more than 1e+09 times it"),
    # packed sequences in slices: the slices are refused for what they are, not as a count of sequences
    ("forward_times: 1\nsequence_lengths: [100, 200, 300]\ntoken_budget: 400\nsequence_slices: 2\n",
     "sequence_slices = 2: not with packed documents (sequence 0: [100, 200]): a slice is part of one sequence"),
])
def test_the_message_names_the_key_at_fault(tmp_path, capsys, config, message):
    path = tmp_path / "bad.yaml"
    path.write_text(COSTS + config)
    assert refused(capsys, "simulate", path, "--schedule", "1f1b", "--no-visualization") \
        .startswith(f"zbopt: {path}: {message}")


def test_rows_with_equal_columns_are_the_stage_values_in_every_command():
    """Issue 42 item 7: a table per microbatch whose columns agree is one value per stage; the
    block built from it (a copy of one microbatch) is the one built from the stage values."""
    from zbopt import generate

    table = Problem(num_devices=2, num_microbatches=3, forward_times=1, backward_times=1, weight_times=1,
                    activation_memory=[[0.5, 0.5, 0.5], [1, 1, 1]])
    plain = Problem(num_devices=2, num_microbatches=3, forward_times=1, backward_times=1, weight_times=1,
                    activation_memory=[0.5, 1])
    assert table.microbatches_equal
    assert table.replace(num_microbatches=1) == plain.replace(num_microbatches=1)
    assert generate("block-1f1b", table).orders == generate("block-1f1b", plain).orders


def test_microbatches_each_in_range_but_too_far_apart_are_refused_by_name():
    """Tokens [1e8, 1] with attention: every microbatch at the longest's costs is in range, and at the
    shortest's too, but the long one's work is past 1e9 times the short one's shortest cost (the
    tolerance could no longer tell that cost from zero): refused, naming microbatch_tokens."""
    with pytest.raises(ProblemError, match=r"^microbatch_tokens = .*the microbatches differ too much"):
        Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1,
                microbatch_tokens=[10**8, 1], attention_share=0.5)
    spread = Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1,
                     microbatch_tokens=[10**4, 1], attention_share=0.5)  # a 1e4 spread is kept as given
    assert spread.microbatch_tokens == (10**4, 1)


def test_a_problem_one_command_refuses_for_its_range_no_command_accepts(tmp_path, capsys):
    """Tokens spread 1e12 : 1 make the shortest microbatch's costs fall below the tolerance: simulate
    refuses it as compare does (before, simulate ran it and compare's relaxation refused it)."""
    path = tmp_path / "spread.yaml"
    path.write_text("num_stages: 2\nnum_microbatches: 4\nforward_times: 1\nbackward_times: 1\nweight_times: 1\n"
                    "microbatch_tokens: [1000000000000, 1, 1, 1]\n")
    messages = {refused(capsys, *argv) for argv in (("simulate", path, "--schedule", "1f1b", "--no-visualization"),
                                                    ("compare", path), ("solve", path, "--time-limit", "2"))}
    assert len(messages) == 1 and "the shortest cost must be at least 1e-09" in messages.pop()
