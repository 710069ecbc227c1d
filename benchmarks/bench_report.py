"""What the HTML report costs beyond the comparison it shows: prints a table and writes
benchmarks/results/bench_report.json.

For p = 8, m = 32 and p = 32, m = 256 (one chunk, F = 1, B = 2, W = 1, no limit), every
applicable schedule: the time `compare` takes (simulations and the quick lower bounds), the time
`render_report` takes on top, and the report's size.

Usage: python benchmarks/bench_report.py
"""

from __future__ import annotations

import time

from record import write_results

from zbopt import Problem, compare
from zbopt.presentation.report import render_report

SHAPES = ((8, 32), (32, 256))


def main() -> None:
    rows = []
    print(f"{'p':>3} {'m':>4} {'schedules':>9} {'ops each':>9} | {'compare s':>9} {'report s':>8} {'size MB':>7}",
          flush=True)
    for p, m in SHAPES:
        problem = Problem(num_devices=p, num_microbatches=m, forward_times=1, backward_times=2, weight_times=1)
        began = time.perf_counter()
        comparison = compare(problem)
        compared = time.perf_counter() - began
        began = time.perf_counter()
        size = len(render_report(comparison).encode())
        rendered = time.perf_counter() - began
        row = {"p": p, "m": m, "schedules": len(comparison.rows), "ops": problem.num_ops, "compare_s": compared,
               "report_s": rendered, "bytes": size}
        rows.append(row)
        print(f"{p:>3} {m:>4} {len(comparison.rows):>9} {problem.num_ops:>9} | {compared:>9.2f} {rendered:>8.2f} "
              f"{size / 1e6:>7.2f}", flush=True)
    write_results("bench_report", rows=rows)


if __name__ == "__main__":
    main()
