"""Issue 32's target: 16 microbatches whose tokens span 8x; the optimizer against 1F1B and ZB-H1 in
the loader's order and in their best order rule, with its gap and what binds.

p = 4 and 8, v = 1 (loop) and 2 (V), split backward (F = B = W = 1 per stage at the mean length,
halved per chunk with v = 2), tokens drawn log-uniform over [512, 4096] (seeded, then the smallest
set to 512 and the largest to 4096 so they span exactly 8x), attention_share 0.3; no memory limit,
or a limit of L mean activations per chunk (`--memory L`). Per case: 1F1B and ZB-H1 (with v = 2 the
V schedules `torch-zbv` and `zb-v`) in the loader's order and in their best order rule, `solve`'s
makespan, lower bound, gap and status within the time limit, the binding bound.

Prints a table and writes benchmarks/results/bench_unequal.json. Wall times on a shared machine
(CP-SAT with two workers).
Usage: python benchmarks/bench_unequal.py [--shapes 4x1,4x2,8x1,8x2] [--seconds S (default 120)]
                                          [--memory L] [--seed N]
"""

from __future__ import annotations

import argparse
import math
import random

from record import write_results

from zbopt import Problem, solve
from zbopt.planning.packing import best_order_of, order_makespans

LOW, HIGH = 512, 4096
SCHEDULES = {1: ("1f1b", "zb-h1"), 2: ("torch-zbv", "zb-v")}


def tokens(count: int, seed: int) -> list[int]:
    """`count` token counts drawn log-uniform over [LOW, HIGH], the extremes pinned to LOW and HIGH."""
    rng = random.Random(seed)
    drawn = [round(math.exp(rng.uniform(math.log(LOW), math.log(HIGH)))) for _ in range(count)]
    drawn[drawn.index(min(drawn))], drawn[drawn.index(max(drawn))] = LOW, HIGH
    return drawn


def problem(devices: int, chunks: int, memory: float | None, seed: int) -> Problem:
    cost = 1.0 / chunks
    return Problem(num_devices=devices, num_microbatches=16, chunks_per_device=chunks,
                   placement="v" if chunks == 2 else "loop",
                   forward_times=cost, backward_times=cost, weight_times=cost, microbatch_tokens=tokens(16, seed),
                   attention_share=0.3, memory_limit=None if memory is None else memory * chunks)


def heuristics(case: Problem) -> dict:
    """Per schedule, its makespan in the loader's order and its best order rule's (None: not valid)."""
    found = {}
    for name in SCHEDULES[case.chunks_per_device]:
        by_order = order_makespans(case, name)
        best_order, best = best_order_of(by_order)
        found[name] = {"given": by_order["given"], "best_order": best_order, "best": best}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x1,4x2,8x1,8x2", help="PxV,... (devices x chunks)")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--memory", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    rows = []
    print("| p | v | schedule: loader's order / best order | optimizer | bound | gap | status | binding | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in arguments.shapes.split(","):
        devices, chunks = (int(x) for x in shape.split("x"))
        case = problem(devices, chunks, arguments.memory, arguments.seed)
        found = heuristics(case)
        result = solve(case, time_limit=arguments.seconds, lower_peak=False)
        rows.append({"p": devices, "v": chunks, "m": 16, "memory": arguments.memory,
                     "tokens": list(case.microbatch_tokens), "heuristics": found, "warm_start": result.warm_start,
                     "makespan": result.objective, "lower_bound": result.lower_bound, "gap": result.gap,
                     "status": result.status, "binding": result.binding_bound, "bounds": result.bounds,
                     "seconds": result.solve_time_s})
        text = "; ".join(f"{name} {_short(values['given'])} / {_short(values['best'])} ({values['best_order']})"
                         for name, values in found.items())
        print(f"| {devices} | {chunks} | {text} | {result.objective:.3f} | {result.lower_bound:.3f} | "
              f"{result.gap:.2%} | {result.status} | {result.binding_bound} | {result.solve_time_s:.1f} |",
              flush=True)
    write_results("bench_unequal", seconds=arguments.seconds, seed=arguments.seed, rows=rows)


def _short(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
