"""Issue 32's case: 16 microbatches whose tokens span 8x, how close `solve` gets and what binds.

p = 4, v = 1 (loop) or 2 (V), split backward (F = 1, B = 1, W = 1 per stage at the mean length,
halved per chunk with v = 2), tokens drawn log-uniform over [512, 4096] (seeded, then the smallest
set to 512 and the largest to 4096 so they span exactly 8x), attention_share 0.3; no memory limit,
or a limit of 4 mean activations per chunk (`--memory`). Per case: the best heuristic (the warm
start), `solve`'s makespan, lower bound, gap and status within the time limit, the binding bound,
and every bound's value.

Prints a table and writes benchmarks/results/bench_unequal[_<tag>].json. Wall times on a shared
machine (CP-SAT with two workers).
Usage: python benchmarks/bench_unequal.py [--chunks 1|2] [--seconds S (default 60)] [--memory L] [--seed N]
"""

from __future__ import annotations

import argparse
import math
import random

from record import write_results

from zbopt import Problem, solve

LOW, HIGH = 512, 4096


def tokens(count: int, seed: int) -> list[int]:
    """`count` token counts drawn log-uniform over [LOW, HIGH], the extremes pinned to LOW and HIGH."""
    rng = random.Random(seed)
    drawn = [round(math.exp(rng.uniform(math.log(LOW), math.log(HIGH)))) for _ in range(count)]
    drawn[drawn.index(min(drawn))], drawn[drawn.index(max(drawn))] = LOW, HIGH
    return drawn


def problem(chunks: int, memory: float | None, seed: int) -> Problem:
    cost = 1.0 / chunks
    return Problem(num_devices=4, num_microbatches=16, chunks_per_device=chunks,
                   placement="v" if chunks == 2 else "loop",
                   forward_times=cost, backward_times=cost, weight_times=cost, microbatch_tokens=tokens(16, seed),
                   attention_share=0.3, memory_limit=None if memory is None else memory * chunks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--memory", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    case = problem(arguments.chunks, arguments.memory, arguments.seed)
    result = solve(case, time_limit=arguments.seconds, lower_peak=False)
    row = {"p": 4, "v": arguments.chunks, "m": 16, "memory": arguments.memory, "tokens": list(case.microbatch_tokens),
           "warm_start": result.warm_start, "makespan": result.objective, "lower_bound": result.lower_bound,
           "gap": result.gap, "status": result.status, "binding": result.binding_bound,
           "bounds": result.bounds, "seconds": result.solve_time_s}
    print("| p | v | memory | warm start | makespan | bound | gap | status | binding | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| 4 | {arguments.chunks} | {arguments.memory or '-'} | {result.warm_start} | {result.objective:.4f} | "
          f"{result.lower_bound:.4f} | {result.gap:.2%} | {result.status} | {result.binding_bound} | "
          f"{result.solve_time_s:.1f} |")
    print("bounds:", {name: round(value, 4) for name, value in result.bounds.items()})
    tag = f"v{arguments.chunks}" + ("" if arguments.memory is None else f"_mem{arguments.memory:g}")
    write_results(f"bench_unequal_{tag}", rows=[row])


if __name__ == "__main__":
    main()
