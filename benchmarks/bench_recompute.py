"""What recomputation buys near the memory floor; prints a table and writes benchmarks/results/*.json.

The Zero Bubble paper's 1.5B costs (F 18.522, B 18.086, W 9.337, comm 0.601 ms; M_B = 1, M_W =
0.366 from its Table 1), R = F, and a checkpoint of 0.03 M_B: a stage keeps its input, 2bsh bytes,
against M_B = 34bsh + 5as²b per layer (Table 1) -- for h = 2304, a = 24, s = 1024 that is 0.023 of
one layer's activation, less for a stage of several layers; 0.03 rounds it up. For p = 4, m = 8
and p = 8, m = 16 and memory limits from the floor (1) to 2p activations, per limit: the optimum
keeping every activation, the optimum allowed to recompute (CP-SAT, each with the time limit),
Megatron's full recomputation on 1F1B and Mario's on 1F1B.

Usage: python benchmarks/bench_recompute.py [--time-limit S] [--shapes 4x8,8x16]
"""

from __future__ import annotations

import argparse

from record import write_results

from zbopt import Problem, generate, simulate, solve
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS

CHECKPOINT = 0.03
LIMITS = {4: (1, 1.5, 2, 3, 4, 6, 8), 8: (1, 1.5, 2, 4, 8, 12, 16)}


def problem(p: int, m: int, limit: float, recompute: bool, offload_ms: float | None = None) -> Problem:
    """The 1.5B costs at p, m and the limit; recomputation allowed with CHECKPOINT when `recompute`,
    offload with copies of `offload_ms` each way when given (`bench_offload.py`)."""
    mechanisms = {"allow_recompute": True, "checkpoint_memory": CHECKPOINT} if recompute else {}
    if offload_ms is not None:
        mechanisms.update(allow_offload=True, offload_times=offload_ms)
    return ZERO_BUBBLE_MODELS["1.5B"].problem(limit, num_devices=p, num_microbatches=m, **mechanisms)


def arguments(description: str) -> argparse.Namespace:
    """--time-limit S (per solve) and --shapes PxM,..., shared with `bench_offload.py`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--shapes", default="4x8,8x16")
    return parser.parse_args()


def heuristic(name: str, limited: Problem) -> float | None:
    """The heuristic's makespan, or None when it does not fit the limit."""
    result = simulate(limited, generate(name, limited))
    return result.makespan if result.valid else None


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    rows = []
    print(f"{'p':>2} {'m':>3} {'limit':>5} | {'kept':>8} {'gap':>6} | {'recompute':>9} {'bound':>8} {'gap':>6} "
          f"{'R':>4} | {'megatron':>8} {'mario':>8} | {'kept/rec':>8} {'meg/rec':>7}", flush=True)
    for shape in args.shapes.split(","):
        p, m = (int(x) for x in shape.split("x"))
        for limit in LIMITS[p]:
            kept = solve(problem(p, m, limit, False), time_limit=args.time_limit, lower_peak=False)
            allowed = problem(p, m, limit, True)
            chosen = solve(allowed, time_limit=args.time_limit, lower_peak=False)
            recomputed = len(chosen.simulation.table.recomputed)
            megatron, mario = heuristic("1f1b-recompute", allowed), heuristic("mario-1f1b", allowed)
            row = {"p": p, "m": m, "limit": limit, "kept": kept.objective, "kept_status": kept.status,
                   "kept_gap": kept.gap, "recompute": chosen.objective, "recompute_status": chosen.status,
                   "recompute_bound": chosen.lower_bound, "recompute_gap": chosen.gap,
                   "recompute_binding": chosen.binding_bound, "recomputed": recomputed,
                   "activations": p * m, "megatron": megatron, "mario": mario,
                   "time_s": kept.solve_time_s + chosen.solve_time_s}
            rows.append(row)

            def text(value):
                return f"{value:>8.1f}" if value is not None else f"{'-':>8}"

            print(f"{p:>2} {m:>3} {limit:>5g} | {text(kept.objective)} {kept.gap:>6.1%} | "
                  f"{chosen.objective:>9.1f} {chosen.lower_bound:>8.1f} {chosen.gap:>6.1%} {recomputed:>4} | "
                  f"{text(megatron)} {text(mario)} | {kept.objective / chosen.objective:>8.2f} "
                  f"{(megatron / chosen.objective if megatron else float('nan')):>7.2f}", flush=True)
    write_results("bench_recompute", time_limit_s=args.time_limit, checkpoint_memory=CHECKPOINT, rows=rows)


if __name__ == "__main__":
    main()
