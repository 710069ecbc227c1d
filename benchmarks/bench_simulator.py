"""Simulator speed: ops per second for p=32, m=1024 with v=1 and v=2 (split backward, latency).

Timed: simulate() plus reading makespan, bubble rates and peak memory. Prints a table and
writes benchmarks/results/bench_simulator.json. `cold` includes building the
problem's op table (first simulation of a problem); `warm` reuses it, as solvers and sweeps do.
"""

from __future__ import annotations

import platform
import time

from record import write_results

from zbopt import Problem, generate, simulate
from zbopt.core.ops import op_table

CASES = [
    ("1f1b", dict(num_devices=32, num_microbatches=1024, chunks_per_device=1)),
    ("looped-bfs", dict(num_devices=32, num_microbatches=1024, chunks_per_device=2)),
    ("looped-bfs", dict(num_devices=32, num_microbatches=1024, chunks_per_device=2, placement="v")),
]
REPEATS = 3


def simulate_with_metrics(problem, schedule):
    """Simulate and read every metric, as a user of the result would."""
    result = simulate(problem, schedule)
    return result.makespan, result.bubble_rate, result.zb_bubble_rate, result.peak_memory


def best_of(function, repeats=REPEATS) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    rows = []
    for name, shape in CASES:
        problem = Problem(forward_times=1.0, backward_times=1.0, weight_times=0.5, p2p_time=0.05, **shape)
        build = best_of(lambda: generate(name, problem))  # noqa: B023
        schedule = generate(name, problem)

        def cold():
            op_table.cache_clear()
            simulate_with_metrics(problem, schedule)  # noqa: B023

        cold_s = best_of(cold)
        warm_s = best_of(lambda: simulate_with_metrics(problem, schedule))  # noqa: B023
        rows.append({
            "schedule": name, "p": problem.num_devices, "m": problem.num_microbatches,
            "v": problem.chunks_per_device, "placement": problem.placement, "ops": problem.num_ops,
            "build_s": build, "simulate_cold_s": cold_s, "simulate_warm_s": warm_s,
            "ops_per_s_cold": problem.num_ops / cold_s, "ops_per_s_warm": problem.num_ops / warm_s,
        })
    header = f"{'schedule':<8} {'p':>3} {'m':>5} {'v':>2} {'place':>5} {'ops':>8} {'build s':>8} " \
             f"{'sim cold s':>10} {'sim warm s':>10} {'ops/s cold':>11} {'ops/s warm':>11}"
    print(header)
    for r in rows:
        print(f"{r['schedule']:<8} {r['p']:>3} {r['m']:>5} {r['v']:>2} {r['placement']:>5} {r['ops']:>8} "
              f"{r['build_s']:>8.3f} {r['simulate_cold_s']:>10.3f} {r['simulate_warm_s']:>10.3f} "
              f"{r['ops_per_s_cold']:>11,.0f} {r['ops_per_s_warm']:>11,.0f}")
    write_results("bench_simulator", python=platform.python_version(), rows=rows)


if __name__ == "__main__":
    main()
