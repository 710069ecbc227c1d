"""Ctrl-C as a terminal sends it, SIGINT to the whole process group (the policy: `zbopt.core.interrupt`).

The first Ctrl-C stops the work, prints the best answer so far, says "zbopt: interrupted" on one
stderr line and exits 130; during start-up only that line. Never a traceback, never OR-Tools'
C++ abort. Each command runs in a session of its own with stderr on a terminal (the live line and
the frontier's bar are on), and is signalled once that line shows it is working.
"""

import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

# large enough that no solver proves it in a minute: still running when Ctrl-C comes
SOLVE = ["solve", "-s", "8", "-b", "32", "-f", "1", "-bw", "1", "-w", "1", "--memory-limit", "4", "--time-limit",
         "60", "--no-visualization"]
# the limit 1 is proven in seconds, 2 to 5 are not: a minute each on two workers
FRONTIER = ["frontier", "-s", "8", "-b", "32", "-f", "1", "-bw", "1", "-w", "1", "--memory-limits", "1:5:1",
            "--time-limit", "60", "--workers", "2"]
HANG_S = 15  # far below the work left when the signal comes; only a hang reaches it


def _start(args: list[str], stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "zbopt", *args], stdout=subprocess.PIPE, stderr=stderr,
                            start_new_session=True)


def _read_until(descriptor: int, text: bytes, seconds: float) -> bytes:
    seen, deadline = b"", time.monotonic() + seconds
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([descriptor], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(descriptor, 4096)
            except OSError:  # the process ended and closed the terminal
                break
            seen += chunk
    return seen


def _interrupted(args: list[str], working: bytes) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the command signalled once `working` shows on its terminal."""
    terminal, child_side = pty.openpty()
    process = _start(args, child_side)
    os.close(child_side)
    try:
        before = _read_until(terminal, working, 300)
        assert working in before, before.decode(errors="replace")
        os.killpg(process.pid, signal.SIGINT)
        out, _ = process.communicate(timeout=HANG_S)
        after = _read_until(terminal, b"interrupted\r\n", 2)
    finally:
        process.kill()
        os.close(terminal)
    return process.returncode, out.decode(), (before + after).decode(errors="replace").replace("\r\n", "\n")


def _said_once(err: str) -> None:
    """The last line says it was interrupted, and nothing else went wrong on stderr."""
    assert err.rstrip("\n").rsplit("\n", 1)[-1] == "zbopt: interrupted", err
    assert err.count("interrupted") == 1, err
    assert "Traceback" not in err and "terminate called" not in err, err


@pytest.mark.parametrize("solver", ["lns", "cpsat", "highs"])
def test_ctrl_c_prints_the_best_schedule_so_far_and_exits_130(solver):
    code, out, err = _interrupted([*SOLVE, "--solver", solver], b"incumbent")
    assert code == 130, (out, err)
    assert re.search(r"^status +feasible$", out, re.M), out
    makespan = float(re.search(r"^makespan +(\S+)$", out, re.M).group(1))
    lower = float(re.search(r"^lower_bound +(\S+)$", out, re.M).group(1))
    assert lower <= makespan <= 151  # the bound, and the warm start's makespan (greedy)
    # the solver's schedule, or the warm start's, named for what it is
    warm = re.search(r"^warm_start +(\S+)$", out, re.M).group(1)
    assert re.search(rf"^schedule +({solver}|{warm})$", out, re.M), out
    _said_once(err)


def test_ctrl_c_stops_the_frontier_and_shows_the_points_finished():
    code, out, err = _interrupted(FRONTIER, b"1/5 limits solved")
    assert code == 130, (out, err)
    assert re.search(r"^ +1 +optimal +544 +544 ", out, re.M), out
    assert not re.search(r"^ +[2-5] +(optimal|feasible)", out, re.M), out
    _said_once(err)


def test_ctrl_c_during_start_up_is_one_line():
    process = _start(SOLVE, subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # numpy loads while zbopt.interfaces.cli is imported: start-up, before any work
        with open(f"/proc/{process.pid}/maps") as maps:
            if "numpy" in maps.read():
                break
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=HANG_S)
    assert (process.returncode, out, err) == (130, b"", b"zbopt: interrupted\n")


def test_watched_work_is_stopped_once_asked_and_its_error_reaches_the_caller():
    """`interrupt.watched` calls `stop` while the work runs once `stop_when` holds (here at once: a
    work that only ends when stopped returns), and hands the work's exception to the caller."""
    from zbopt.core import interrupt

    released = threading.Event()
    assert interrupt.watched(lambda: released.wait(HANG_S), released.set, stop_when=lambda: True) is True

    def fails():
        raise ValueError("from the work's thread")

    with pytest.raises(ValueError, match="from the work's thread"):
        interrupt.watched(fails, lambda: None)


def test_ctrl_c_stops_the_balanced_packing_with_a_packing_no_worse_than_first_fit():
    """Ctrl-C (`interrupt.requested`) stops the balanced packing's CP-SAT search: 300 sequences into
    first-fit decreasing's count of microbatches give its packing or a better one, every sequence once."""
    from zbopt.core import interrupt
    from zbopt.core.problem.batch import document_work, pack

    lengths = [64 + (index * 7919) % 4000 for index in range(300)]
    first_fit = pack(lengths, 8192, "first-fit-decreasing")
    answer = []
    interrupt.requested.set()
    try:  # given four hang times to search, it ends within one: only a stop that failed reaches it
        worker = threading.Thread(target=lambda: answer.append(pack(lengths, 8192, "balanced", attention_share=0.3,
                                                                    time_limit=HANG_S * 4)))
        worker.start()
        worker.join(HANG_S)
    finally:
        interrupt.requested.clear()
    assert answer, "the balanced packing did not stop"
    balanced = answer[0]
    assert sorted(index for microbatch in balanced for index in microbatch) == list(range(300))

    def heaviest(packing):
        return max(sum(document_work(lengths[index], 0.3, max(lengths)) for index in microbatch)
                   for microbatch in packing)

    assert len(balanced) == len(first_fit) and heaviest(balanced) <= heaviest(first_fit) + 1e-9


def test_the_exit_of_a_script_waits_for_a_worker_left_running(tmp_path):
    """A search the driver left behind at its time limit may still be inside C++ when a script
    ends, where the interpreter's shutdown aborts the process; the exit waits for it (a daemon
    thread is otherwise dropped mid-work: its file would not be written)."""
    written = tmp_path / "written"
    code = ("import threading, time, pathlib; from zbopt.core import interrupt; done = threading.Event()\n"
            "def work():\n"
            f"    time.sleep(1); pathlib.Path({str(written)!r}).write_text('finished'); done.set()\n"
            "threading.Thread(target=work, daemon=True).start(); interrupt.left_running(done)")
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert finished.returncode == 0 and written.read_text() == "finished"
