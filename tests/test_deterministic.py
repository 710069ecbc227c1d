"""Certificates that repeat (issue 41, item 5): with --deterministic two runs of `solve`,
`compare --optimal` and `plan`, in processes with different hash seeds, print the same JSON but
for the wall-clock fields, on problems whose search is cut by its budget (so the budget, not the
search's end, decides what is printed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zbopt.core import interrupt

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WALL_CLOCK_KEYS = ("seconds", "time_s")  # solve_time_s, bound_seconds, a plan row's seconds

# p = 4, m = 8, v = 2 at memory 3: the search is still open after many seconds (the bound 40, the answer above 41)
LOOP = ["-s", "4", "-b", "8", "--chunks-per-device", "2", "--placement", "loop", "-f", "0.5", "-bw", "0.5", "-w", "0.5",
        "--memory-limit", "3"]


def _without_wall_clock(data: object) -> object:
    if isinstance(data, dict):
        return {key: _without_wall_clock(value) for key, value in data.items()
                if not any(word in key for word in WALL_CLOCK_KEYS)}
    if isinstance(data, list):
        return [_without_wall_clock(value) for value in data]
    return data


def _twice(arguments: list[str]) -> list[object]:
    """The JSON of two runs of `zbopt ARGUMENTS --json`, with hash seeds 1 and 2."""
    printed = []
    for seed in ("1", "2"):
        run = subprocess.run([sys.executable, "-m", "zbopt", *arguments, "--json"], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, check=False, timeout=300)
        assert run.returncode == 0, run.stderr
        printed.append(_without_wall_clock(json.loads(run.stdout)))
    return printed


@pytest.mark.parametrize("arguments", [
    ["solve", *LOOP, "--time-limit", "2"],
    ["compare", *LOOP, "--optimal", "--time-limit", "2"],
    ["plan", str(EXAMPLES / "model_layers.yaml"), "--devices", "4", "--microbatches", "8", "--chunks", "1,2",
     "--time-limit", "3"],
], ids=["solve", "compare", "plan"])
def test_two_deterministic_runs_print_the_same_answer_and_certificate(arguments):
    first, second = _twice([*arguments, "--deterministic"])
    assert first == second
    if arguments[0] == "solve":  # cut by the budget, not proven: else any two runs would agree
        assert first["status"] == "feasible" and first["gap"] > 0


def test_a_metered_clock_counts_the_work_spent_not_the_wall_clock():
    clock = interrupt.Clock.start(4, "work", deterministic=True)
    assert clock.deadline == pytest.approx(4 * interrupt.WORK_PER_SECOND) and clock.left() == clock.deadline
    with interrupt.metered(clock):
        assert interrupt.deterministic() and interrupt.now() == 0.0 and not interrupt.past(clock.deadline)
        interrupt.spend(0.6)
        share = clock.share("half", 0.5)
        assert interrupt.now() == pytest.approx(0.6) and share.deadline == pytest.approx(0.6 + 0.2)
        interrupt.spend(0.5)
        assert interrupt.past(clock.deadline) and clock.past()
    assert not interrupt.deterministic()


def test_the_milp_refuses_deterministic_in_one_line():
    run = subprocess.run([sys.executable, "-m", "zbopt", "solve", "-s", "2", "-b", "2", "--solver", "highs",
                          "--deterministic"], capture_output=True, text=True, check=False)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "wall-clock" in run.stderr
