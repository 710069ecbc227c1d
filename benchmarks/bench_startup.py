"""What a `zbopt` command costs before it does any work: prints a table and writes
benchmarks/results/bench_startup.json.

Each command runs as `python -m zbopt ...` in a fresh interpreter (the entry point's own start-up,
imports included), the best wall time of five, and the CPU time (user + system) of that run: on a
busy machine the wall time waits for a core, the CPU time does not. A sixth run in-process
reports which heavy third-party libraries the command loaded. The cases: `--help`, `schedules`, a small `simulate`
(p = 4, m = 8), the same with a Gantt chart (`-o x.png`), and a 1-second `solve`.

Usage: python benchmarks/bench_startup.py
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time

from record import write_results

REPEATS = 5
HEAVY = ("ortools", "matplotlib", "networkx", "pandas", "pulp", "highspy", "torch", "dask", "scipy")
CASES = (
    ("help", ["--help"]),
    ("schedules", ["schedules"]),
    ("simulate", ["simulate", "-s", "4", "-b", "8"]),
    ("simulate -o png", ["simulate", "-s", "4", "-b", "8", "-o", "x.png"]),
    ("solve 1 s", ["solve", "-s", "4", "-b", "8", "--time-limit", "1"]),
)
# runs one command in-process, then names the heavy libraries it loaded (on stderr, its last line)
PROBE = """
import json, sys
from zbopt.interfaces.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print(json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)), file=sys.stderr)
"""


def _children_cpu() -> float:
    """CPU time (user + system) of every child process waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def best_time(argv: list[str], directory: str) -> tuple[float, float]:
    """The least of REPEATS fresh interpreters' wall times for `python -m zbopt ARGV`, and that
    run's CPU time (user + system)."""
    runs = []
    for _ in range(REPEATS):
        began, cpu = time.perf_counter(), _children_cpu()
        subprocess.run([sys.executable, "-m", "zbopt", *argv], cwd=directory, capture_output=True, check=False)
        runs.append((time.perf_counter() - began, _children_cpu() - cpu))
    return min(runs)


def heavy_loaded(argv: list[str], directory: str) -> list[str]:
    """The heavy libraries in sys.modules after the command ran."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], cwd=directory,
                          capture_output=True, text=True, check=False)
    return json.loads(done.stderr.strip().splitlines()[-1])


def main() -> None:
    rows = []
    print(f"{'command':<16} {'best s':>7} {'cpu s':>6}  heavy libraries loaded", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        for name, argv in CASES:
            seconds, cpu = best_time(argv, directory)
            loaded = heavy_loaded(argv, directory)
            rows.append({"command": name, "argv": argv, "best_s": seconds, "cpu_s": cpu, "heavy": loaded})
            print(f"{name:<16} {seconds:>7.2f} {cpu:>6.2f}  {', '.join(loaded) or '-'}", flush=True)
    write_results("bench_startup", repeats=REPEATS, rows=rows)


if __name__ == "__main__":
    main()
