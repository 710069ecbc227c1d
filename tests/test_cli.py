"""The CLI end to end: the visualizer's configs, flags, and one-line errors with exit status 2."""

import json
import shutil
from pathlib import Path

import pytest

from tests.reference import longest_path_starts
from zbopt import Op, Problem, Schedule, generate, load_schedule, simulate
from zbopt.core.problem.checks import MAX_OPS
from zbopt.interfaces.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def expected_makespan(problem: Problem, orders: list[list[str]]) -> float:
    schedule = Schedule(orders)
    starts = longest_path_starts(problem, schedule)
    return max(start + problem.cost(op.kind, op.stage) for op, start in starts.items())


@pytest.mark.parametrize(
    ("config", "picture", "costs"),
    [
        ("visualizer_custom.json", "pipeline_1f1b_custom.png",
         dict(num_devices=6, num_microbatches=12, forward_times=[0.8, 1.0, 1.2, 1.0, 0.9, 1.1],
              backward_times=[1.6, 2.0, 2.4, 2.0, 1.8, 2.2])),
        ("visualizer.yaml", "pipeline_1f1b_yaml.png",
         dict(num_devices=5, num_microbatches=8, forward_times=[0.9, 1.1, 1.0, 0.8, 1.2],
              backward_times=[1.8, 2.2, 2.0, 1.6, 2.4])),
    ],
)
def test_visualizer_configs_run_unchanged_and_write_their_png(tmp_path, monkeypatch, capsys, config, picture, costs):
    shutil.copy(EXAMPLES / config, tmp_path / config)
    monkeypatch.chdir(tmp_path)
    status, out, err = run(capsys, "simulate", config, "--json")
    assert (status, err) == (0, "")
    result = json.loads(out)
    assert result["num_stages"] == costs["num_devices"] and result["schedule"] == "1f1b"
    assert result["makespan"] == pytest.approx(expected_makespan(Problem(**costs), result["orders"]))
    assert (tmp_path / picture).read_bytes().startswith(PNG_SIGNATURE)


def test_flags_alone_describe_a_problem(capsys):
    status, out, _ = run(capsys, "simulate", "--num-stages", "4", "--num-batches", "8", "--json")
    result = json.loads(out)
    # defaults F=1, fused backward 2: (m+p-1)(F+B) = 11 · 3
    assert status == 0 and result["makespan"] == 33.0 and result["peak_memory"] == [4, 3, 2, 1]
    assert result["orders"][3][:2] == ["3F0", "3BW0"]


def test_list_flags_take_spaces_or_commas(capsys):
    _, out, _ = run(capsys, "simulate", "-s", "2", "-b", "2", "-f", "1", "2", "-bw", "3,4", "--json")
    assert json.loads(out)["makespan"] == pytest.approx(expected_makespan(
        Problem(num_devices=2, num_microbatches=2, forward_times=[1, 2], backward_times=[3, 4]),
        json.loads(out)["orders"]))


def test_flags_override_the_config_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("num_stages: 4\nnum_batches: 8\nforward_times: 1\nbackward_times: 2\n")
    _, out, _ = run(capsys, "simulate", str(config), "--num-microbatches", "4", "--json")
    assert json.loads(out)["num_microbatches"] == 4 and json.loads(out)["makespan"] == 21.0


def test_readable_table_and_gantt_formats(tmp_path, capsys):
    status, out, _ = run(capsys, "simulate", "-s", "3", "-b", "4", "-o", str(tmp_path / "g.svg"))
    assert status == 0
    assert "makespan        18" in out and "bubble_rate     0.3333" in out
    assert (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml")


def test_no_visualization_skips_the_config_picture(tmp_path, monkeypatch, capsys):
    shutil.copy(EXAMPLES / "visualizer.yaml", tmp_path / "v.yaml")
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "simulate", "v.yaml", "--no-visualization")[0] == 0
    assert not (tmp_path / "pipeline_1f1b_yaml.png").exists()


def test_schedules_lists_names(capsys):
    status, out, _ = run(capsys, "schedules", "--json")
    entries = json.loads(out)
    assert status == 0 and {"gpipe", "1f1b", "looped-bfs"} <= {entry["name"] for entry in entries}
    status, out, _ = run(capsys, "schedules")
    lines = out.splitlines()
    assert len(lines) == len(entries)
    assert all(line.split()[0] == entry["name"] and line.endswith(entry["summary"])
               for line, entry in zip(lines, entries, strict=True))


def test_memory_violation_exits_1_with_the_violation(capsys):
    status, out, err = run(capsys, "simulate", "-s", "4", "-b", "8", "--memory-limit", "3", "--json")
    assert status == 1 and json.loads(out)["valid"] is False
    assert err.strip() == "zbopt: invalid schedule: device 0 holds 4 at t=3, over its memory limit 3"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("num_stages: 4\nnum_batch: 8\n", "unknown key 'num_batch'"),
        ("num_stages: four\n", "num_stages = 'four': expected a positive integer"),
        ("num_stages: 2\nforward_times: [1, -2]\n", "forward_times = [1, -2]: every value must be > 0"),
        ("num_stages: 3\nbackward_times: [1, 2]\n", "backward_times = [1, 2]: expected one value per virtual"),
        ("num_stages: 2\nmemory_limit: 0.5\n", "memory_limit = 0.5: device 0 must hold one microbatch"),
        ("num_stages: 2\nnum_devices: 2\n", "'num_devices' and 'num_stages' both set num_devices"),
        ("num_stages: [2\n", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("placement: spiral\n", "placement = 'spiral'"),
    ],
)
def test_config_errors_are_one_line_naming_the_key(tmp_path, capsys, content, needle):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    status, out, err = run(capsys, "simulate", str(config))
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["simulate", "missing.yaml"], "config file 'missing.yaml' not found"),
        (["simulate", "--schedule", "zb-h9"], "unknown schedule 'zb-h9'"),
        (["simulate", "-v", "2"], "1f1b needs chunks_per_device = 1"),
        (["simulate", "--num-stages", "x"], "argument --num-stages/--num-devices/-s: invalid int value: 'x'"),
        (["simulate", "-f", "fast"], "expected numbers, got 'fast'"),
        (["simulate", "-o", "chart.jpg"], "output file 'chart.jpg': unsupported extension"),
        (["simulate", "--bogus"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_cli_errors_are_one_line_with_exit_2(capsys, argv, needle):
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and needle in err


@pytest.mark.parametrize("argv", [["simulate", "--bogus"], ["simulate", "--num-stages", "x"], ["frobnicate"]])
def test_usage_mistakes_say_zbopt_once_and_point_to_the_commands_help(capsys, argv):
    _, _, err = run(capsys, *argv)
    command = "zbopt simulate" if argv[0] == "simulate" else "zbopt"
    assert err.count("zbopt:") == 1 and err.endswith(f" (see '{command} --help')\n")
    if argv[1:] == ["--bogus"]:
        assert err == "zbopt: unrecognized arguments: --bogus (see 'zbopt simulate --help')\n"


def test_a_value_is_named_where_it_was_given(tmp_path, capsys):
    config = tmp_path / "a.yaml"
    config.write_text("num_stages: 2\n")
    needs = "device 0 must hold one microbatch's activations on its stages (1); no schedule fits below that"
    assert run(capsys, "simulate", str(config), "--memory-limit", "0.5")[2] == f"zbopt: --memory-limit 0.5: {needs}\n"
    config.write_text("num_stages: 2\nmemory_limit: 0.5\n")
    assert run(capsys, "simulate", str(config))[2] == f"zbopt: {config}: memory_limit = 0.5: {needs}\n"
    # a list flag as typed, and the flag's name whichever alias was used
    _, _, err = run(capsys, "simulate", "-s", "2", "-f", "1,0")
    assert err == "zbopt: --forward-times 1 0: every value must be > 0 (virtual stage 1)\n"


def test_a_stored_problem_is_named_by_its_schedule_file(tmp_path, capsys):
    stored = Problem(num_devices=2, num_microbatches=3, memory_limit=5)
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"orders": [[], []], "problem": stored.to_dict()}))  # the problem fails first
    status, _, err = run(capsys, "simulate", str(path), "--activation-memory", "10")
    assert status == 2
    assert err == (f"zbopt: {path}: memory_limit = 5.0: device 0 must hold one microbatch's activations on its "
                   "stages (10); no schedule fits below that\n")


def test_a_problem_too_large_to_hold_is_one_line_before_any_work(tmp_path, capsys):
    """A huge count fails with the op count, not with an OverflowError or a MemoryError."""
    config = tmp_path / "a.yaml"
    config.write_text("num_stages: 1000000000000000000000000000000\n")
    status, out, err = run(capsys, "simulate", str(config))
    ops = 2 * 10**30 * 8  # F and BW on every stage, 8 microbatches by default
    assert (status, out) == (2, "")
    assert err == (f"zbopt: {config}: num_stages = 1000000000000000000000000000000: the problem has {ops:,} ops, "
                   f"more than zbopt holds (MAX_OPS = {MAX_OPS:,})\n")
    status, out, err = run(capsys, "simulate", "-b", "100000000")
    assert (status, out) == (2, "")
    assert err == (f"zbopt: --num-microbatches 100000000: the problem has {2 * 4 * 10**8:,} ops, "
                   f"more than zbopt holds (MAX_OPS = {MAX_OPS:,})\n")


def test_json_orders_parse_back_into_ops(capsys):
    _, out, _ = run(capsys, "simulate", "-s", "2", "-b", "2", "-w", "1", "--json")
    orders = json.loads(out)["orders"]
    assert [Op.from_str(text) for text in orders[1]][:3] == [Op("F", 1, 0), Op("B", 1, 0), Op("W", 1, 0)]


def test_schedule_options_pass_through_and_unknown_ones_are_named(capsys):
    base = ["simulate", "-s", "4", "-b", "12", "-v", "2", "--schedule", "interleaved-1f1b", "--json"]
    _, out, _ = run(capsys, *base, "--option", "microbatch_group_size_per_vp_stage=6")
    # device 0 warms up with 2(p-1) + (v-1)·6 = 12 forwards, so it holds 13 chunk activations
    assert json.loads(out)["peak_memory"][0] == 13
    status, _, err = run(capsys, *base, "--option", "group=6")
    assert status == 2
    assert err.strip() == ("zbopt: schedule 'interleaved-1f1b' has no option 'group' "
                           "(it takes microbatch_group_size_per_vp_stage)")


def test_solve_prints_the_optimum_with_its_certificate(capsys):
    status, out, _ = run(capsys, "solve", "-s", "4", "-b", "8", "-f", "1", "-bw", "1", "-w", "1",
                         "--weight-memory", "0.5", "--memory-limit", "2", "--json")
    result = json.loads(out)
    assert status == 0 and result["status"] == "optimal"
    assert result["makespan"] == 41.0 and result["lower_bound"] == 41.0 and result["gap"] == 0.0
    assert max(result["peak_memory"]) <= 2 and result["valid"] is True


def test_solve_says_what_it_wrote_where(tmp_path, capsys):
    chart, export = tmp_path / "best.png", tmp_path / "best.json"
    status, out, _ = run(capsys, "solve", "-s", "2", "-b", "3", "--time-limit", "10", "-o", str(chart),
                         "--export", str(export))
    assert status == 0 and out.startswith("status          optimal\n")
    assert out.endswith(f"\nGantt chart written to {chart}\n\nzbopt schedule JSON written to {export}\n")
    assert chart.read_bytes().startswith(PNG_SIGNATURE)
    schedule, stored = load_schedule(export)
    assert stored == Problem(num_devices=2, num_microbatches=3) and schedule.start_times is not None  # the optimum's
    for quiet in ("--quiet", "--json"):
        status, out, _ = run(capsys, "solve", "-s", "2", "-b", "3", "--time-limit", "10", quiet,
                             "--export", str(tmp_path / "quiet.csv"))
        assert status == 0 and (tmp_path / "quiet.csv").exists()
        assert out == "" if quiet == "--quiet" else json.loads(out)["makespan"] == 12


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["solve", "--solver", "gurobi"], "argument --solver: invalid choice: 'gurobi'"),
        (["solve", "--warm-start", "zb-h9"], "unknown schedule 'zb-h9'"),
        (["solve", "--time-limit", "0"], "time limit 0: must be positive"),
        (["solve", "--workers", "0"], "workers 0: must be at least 1"),
    ],
)
def test_solve_errors_are_one_line(capsys, argv, needle):
    status, _, err = run(capsys, *argv)
    assert status == 2 and len(err.strip().splitlines()) == 1 and needle in err


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`zbopt simulate ... | head -1`: the pipe breaks while zbopt prints; nothing on stderr."""
    import subprocess
    import sys

    reader = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    reader.wait()  # gone before zbopt writes a byte
    writer = subprocess.run([sys.executable, "-m", "zbopt", "simulate", "-s", "4", "-b", "8"],
                            stdout=reader.stdin, stderr=subprocess.PIPE, text=True, check=False)
    reader.stdin.close()
    assert (writer.returncode, writer.stderr) == (141, "")


def test_block_prints_the_optimal_block_and_draws_it(tmp_path, capsys):
    """p = 2, F = B = W = 1, half of an activation freed by B: at a limit of 1.5 the least T is 4
    (brute force, tests/test_block_search.py), above a device's work of 3."""
    drawing = tmp_path / "block.png"
    status, out, _ = run(capsys, "block", "-s", "2", "-b", "4", "-f", "1", "-bw", "1", "-w", "1",
                         "--memory-limit", "1.5", "-o", str(drawing))
    assert status == 0 and "status          optimal" in out and "T               4 per microbatch" in out
    assert out.endswith(f"\nblock drawing written to {drawing}\n")
    assert drawing.read_bytes().startswith(PNG_SIGNATURE)
    status, out, _ = run(capsys, "block", "-s", "2", "-b", "4", "-f", "1", "-bw", "1", "-w", "1",
                         "--memory-limit", "1.5", "--json")
    result = json.loads(out)
    assert result["block"]["interval"] == 4 and result["least_interval"] == 4
    assert max(result["steady_peak"]) == 1.5 and max(result["schedule"]["peak_memory"]) <= 1.5
    assert [row["name"] for row in result["published"] if row.get("fits")] == []


@pytest.mark.parametrize(("flags", "culprit"), [
    (["--time-limit", "0"], "time_limit = 0"),
    (["-o", "block.txt"], "unsupported extension"),
])
def test_block_mistakes_are_one_line(capsys, flags, culprit):
    status, out, err = run(capsys, "block", "-s", "2", "-b", "2", *flags)
    assert status == 2 and out == "" and culprit in err and err.count("\n") == 1


def test_solve_starts_from_a_saved_schedule_or_an_order(tmp_path, capsys):
    """--warm-start takes a schedule file (zbopt JSON, torch CSV) as well as a name, and --order
    orders the warm start's heuristics; the answer is never worse than what it started from."""
    base = ["-s", "2", "-b", "4", "-f", "1", "-bw", "2", "--memory-limit", "2"]
    saved = tmp_path / "1f1b.json"
    assert run(capsys, "export", *base, "--schedule", "1f1b", "-o", str(saved))[0] == 0
    status, out, _ = run(capsys, "solve", *base, "--warm-start", str(saved), "--time-limit", "5", "--json")
    result = json.loads(out)
    assert status == 0 and result["warm_start"] == "1f1b" and result["makespan"] <= 15.0
    status, out, _ = run(capsys, "solve", *base, "--order", "3,2,1,0", "--time-limit", "5", "--json")
    assert status == 0 and json.loads(out)["warm_start"].endswith("(chosen order)")
    status, _, err = run(capsys, "solve", *base, "--warm-start", str(tmp_path / "none.json"))
    assert status == 2 and err.count("\n") == 1 and "none.json" in err


def test_json_numbers_carry_no_float_noise(capsys):
    """1F1B at p = 4, m = 8, F = 0.1, BW = 0.2 takes (m + p - 1)(F + BW) = 3.3; summed in floats it is
    3.3000000000000016, which the JSON must not print (12 significant digits)."""
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=0.1, backward_times=0.2)
    assert simulate(problem, generate("1f1b", problem)).makespan != 3.3  # the noise is there to remove
    status, out, _ = run(capsys, "simulate", "-s", "4", "-b", "8", "-f", "0.1", "-bw", "0.2", "--json")
    assert status == 0 and json.loads(out)["makespan"] == 3.3


def test_a_worker_thread_left_running_ends_the_process_with_the_commands_status():
    """A solver thread the driver left behind at the time limit is still inside C++ at exit, where
    the interpreter's shutdown aborts (exit 134 after a complete output: issue 42, item 4); the
    command then leaves at once with its own status, its output flushed."""
    import subprocess
    import sys

    code = ("import sys, threading, time; "
            "threading.Thread(target=time.sleep, args=(60,), daemon=True, name='zbopt-search').start(); "
            "sys.argv = ['zbopt', 'schedules']; from zbopt.__main__ import run; run()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "zb-h1" in done.stdout
