"""Every registered heuristic at scale: p=32, m=256 (v=2 where the schedule needs it).

For each schedule: the time to build it and to simulate it, its makespan, bubble rates and peak
memory. Costs: the Zero Bubble paper's 28.3B model (Table 9: F 10.419, B 10.207, W 7.715,
comm 0.408 ms), split backward, M_B = 1, M_W = 0.3 per device-stage; with v = 2 chunks each chunk
is half a stage (half the costs and memory), so every row runs the same model. Prints a table and
writes benchmarks/results/bench_heuristics.json.
"""

from __future__ import annotations

import platform
import time

from record import write_results

from zbopt import NotApplicableError, Problem, generate, simulate
from zbopt.schedules import registered

BASE = dict(num_devices=32, num_microbatches=256, forward_times=10.419, backward_times=10.207, weight_times=7.715,
            p2p_time=0.408, activation_memory=1.0, weight_memory=0.3)
PER_STAGE = ("forward_times", "backward_times", "weight_times", "activation_memory", "weight_memory")
# The shapes tried for each schedule, in order: the first one it accepts is used.
SHAPES = [dict(chunks_per_device=1), dict(chunks_per_device=2, placement="loop"),
          dict(chunks_per_device=2, placement="v")]


def split_into_chunks(shape: dict) -> Problem:
    """The base model cut into shape's chunks per device: per-chunk costs and memory divided by v."""
    v = shape["chunks_per_device"]
    scaled = {key: (value / v if key in PER_STAGE else value) for key, value in BASE.items()}
    return Problem(**scaled, **shape)


def fitting_problem(name: str) -> tuple[Problem, float] | None:
    """The first shape the schedule accepts, with the time it took to build it there."""
    for shape in SHAPES:
        problem = split_into_chunks(shape)
        began = time.perf_counter()
        try:
            generate(name, problem)
        except NotApplicableError:
            continue
        return problem, time.perf_counter() - began
    return None


def main() -> None:
    rows = []
    for entry in registered():
        fitted = fitting_problem(entry.name)
        if fitted is None:
            rows.append({"schedule": entry.name, "applies": False})
            continue
        problem, build_s = fitted
        schedule = generate(entry.name, problem)
        began = time.perf_counter()
        result = simulate(problem, schedule)
        metrics = (result.makespan, result.bubble_rate, result.zb_bubble_rate, max(result.peak_memory))
        simulate_s = time.perf_counter() - began
        rows.append({
            "schedule": entry.name, "applies": True, "v": problem.chunks_per_device, "placement": problem.placement,
            "ops": problem.num_ops, "build_s": build_s, "simulate_s": simulate_s, "makespan": metrics[0],
            "bubble_rate": metrics[1], "zb_bubble_rate": metrics[2], "peak_memory": metrics[3],
        })
    print(f"{'schedule':<16} {'v':>2} {'place':>5} {'build s':>8} {'sim s':>7} {'makespan':>10} "
          f"{'bubble':>7} {'zb bubble':>9} {'peak mem':>8}")
    for r in sorted(rows, key=lambda r: (not r["applies"], r.get("makespan", 0))):
        if not r["applies"]:
            print(f"{r['schedule']:<16} does not apply to p=32, m=256 with v in (1, 2)")
            continue
        print(f"{r['schedule']:<16} {r['v']:>2} {r['placement']:>5} {r['build_s']:>8.3f} {r['simulate_s']:>7.3f} "
              f"{r['makespan']:>10.1f} {r['bubble_rate']:>7.4f} {r['zb_bubble_rate']:>9.4f} {r['peak_memory']:>8.1f}")
    write_results("bench_heuristics", python=platform.python_version(), problem=BASE, rows=rows)


if __name__ == "__main__":
    main()
