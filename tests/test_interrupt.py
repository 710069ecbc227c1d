"""Ctrl-C during `zbopt solve`, as a terminal sends it: SIGINT to the whole process group.

CP-SAT stops and returns the best schedule found so far; the MILP (in a child process) stops with
"interrupted" and exit status 130. Neither prints a traceback.
"""

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

from zbopt import Problem
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.warm import best_heuristic

# too large to prove in seconds: the solve is still running when Ctrl-C comes
HARD = dict(num_devices=8, num_microbatches=32, forward_times=18.522, backward_times=18.086, weight_times=9.337,
            p2p_time=0.601, chunks_per_device=2, placement="v", activation_memory=0.5, weight_memory=0.15,
            memory_limit=6)
FLAGS = ["--num-devices", "8", "--num-microbatches", "32", "--chunks-per-device", "2", "--placement", "v",
         "--forward-times", "18.522", "--backward-times", "18.086", "--weight-times", "9.337", "--p2p-time", "0.601",
         "--activation-memory", "0.5", "--weight-memory", "0.15", "--memory-limit", "6", "--time-limit", "600",
         "--no-visualization"]


def _start(*extra: str, stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zbopt.cli", "solve", *FLAGS, *extra], stdout=subprocess.PIPE,
                            stderr=stderr, start_new_session=True)


def _wait_for(descriptor: int, text: bytes, seconds: float) -> bytes:
    seen, deadline = b"", time.monotonic() + seconds
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([descriptor], [], [], 1.0)
        if ready:
            seen += os.read(descriptor, 4096)
    return seen


def test_ctrl_c_stops_cpsat_with_its_best_schedule():
    terminal, child_side = pty.openpty()  # a terminal on stderr: the live progress line is on
    process = _start(stderr=child_side)
    os.close(child_side)
    try:
        assert b"incumbent" in _wait_for(terminal, b"incumbent", 300), "no progress line"
        os.killpg(process.pid, signal.SIGINT)
        out, _ = process.communicate(timeout=120)
        progress = _wait_for(terminal, b"\n", 5)
    finally:
        process.kill()
        os.close(terminal)
    assert process.returncode == 0, progress
    text = out.decode()
    assert re.search(r"^status +feasible$", text, re.M), text
    makespan = float(re.search(r"^makespan +(\S+)$", text, re.M).group(1))
    solve_time = float(re.search(r"^solve_time_s +(\S+)$", text, re.M).group(1))
    problem = Problem(**HARD)
    assert lower_bounds(problem).best - 1e-6 <= makespan <= best_heuristic(problem)[1].makespan + 1e-6
    assert solve_time < 600
    assert b"Traceback" not in progress


def test_ctrl_c_stops_the_milp_child_without_a_traceback():
    process = _start("--solver", "highs", stderr=subprocess.PIPE)
    time.sleep(8)  # the child is solving by now
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err.decode() == "zbopt: interrupted\n"
