"""What a static figure costs to draw and write as PNG, in the screen and the paper style: prints a
table and writes benchmarks/results/bench_plot.json.

Gantt charts from sparse (p = 4, m = 8: every op numbered) to dense (p = 8, m = 32, v = 2 and
p = 32, m = 256: every k-th microbatch numbered, outlined), the memory timeline of the largest, and
the comparison chart of p = 8, m = 32. The best of three draws each.

Usage: python benchmarks/bench_plot.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from record import write_results

from zbopt import Problem, compare, generate, simulate
from zbopt.presentation.plot import plot_comparison, plot_gantt, plot_memory

REPEATS = 3
GANTTS = (("1f1b", dict(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)),
          ("interleaved-1f1b", dict(num_devices=8, num_microbatches=32, chunks_per_device=2, forward_times=1,
                                    backward_times=1, weight_times=1)),
          ("1f1b", dict(num_devices=32, num_microbatches=256, forward_times=1, backward_times=2)))


def best_time(plot, *args, **kwargs) -> float:
    """The least of REPEATS calls' wall times."""
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        plot(*args, **kwargs)
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    cases = []  # (figure, schedule, problem, plot function, what it draws)
    for name, shape in GANTTS:
        problem = Problem(**shape)
        cases.append(("gantt", name, problem, plot_gantt, simulate(problem, generate(name, problem))))
    cases.append(("memory", cases[-1][1], cases[-1][2], plot_memory, cases[-1][4]))
    problem = Problem(**GANTTS[1][1])
    cases.append(("comparison", "every applicable", problem, plot_comparison, compare(problem)))
    rows = []
    print(f"{'figure':<10} {'schedule':<17} {'p':>3} {'m':>4} {'v':>2} {'ops':>6} | {'screen s':>8} {'paper s':>8}",
          flush=True)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "figure.png"
        for figure, name, problem, plot, drawn in cases:
            screen, paper = (best_time(plot, drawn, out, style=style) for style in ("screen", "paper"))
            row = {"figure": figure, "schedule": name, "p": problem.num_devices, "m": problem.num_microbatches,
                   "v": problem.chunks_per_device, "ops": problem.num_ops, "screen_s": screen, "paper_s": paper}
            rows.append(row)
            print(f"{figure:<10} {name:<17} {row['p']:>3} {row['m']:>4} {row['v']:>2} {row['ops']:>6} | "
                  f"{screen:>8.2f} {paper:>8.2f}", flush=True)
    write_results("bench_plot", rows=rows)


if __name__ == "__main__":
    main()
