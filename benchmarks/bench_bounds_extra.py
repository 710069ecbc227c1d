"""Issue 30's bounds beside the driver's: prints tables and writes benchmarks/results/bench_bounds_extra.json.

- "span": the span objective at v = 1 on the Zero Bubble paper's 1.5B costs (F 18.522, B 18.086,
  W 9.337, comm 0.601 ms; M_B = 1, M_W = 0.3 as in bench_solver.py's grid A), memory p and 2p
  (ZB-1p's and ZB-2p's): `solve(objective="span")`'s answer, its bound (the busiest device's
  work) and gap, against `span_bound`'s.
- "pairs": overlapped pairs as in bench_overlap.py (F = B = W = 1, FBW pairs of 2.2, both ways and
  V), and DualPipe's README shape (both ways, p = 4, m = 16, F = B = W = 3, F&B 8): `solve`'s
  answer, its bound and gap, against `pair_count_bound`'s.

Usage: python benchmarks/bench_bounds_extra.py [--rows span,pairs] [--time-limit S] [--span-shapes 4x8,...]
       [--pair-shapes 2x4,...]
"""

from __future__ import annotations

import argparse
import time

from record import write_results

from zbopt import Problem, solve
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS
from zbopt.solvers.pair_relaxation import pair_count_bound
from zbopt.solvers.span_bound import span_bound


def span_rows(shapes: str, time_limit: float) -> list[dict]:
    print(f"{'p':>2} {'m':>3} {'mem':>4} | {'span':>8} {'bound':>8} {'gap':>6} | {'new':>8} {'gap':>6} {'s':>5}",
          flush=True)
    rows = []
    for shape in shapes.split(","):
        p, m = (int(x) for x in shape.split("x"))
        for factor in (1, 2):
            problem = ZERO_BUBBLE_MODELS["1.5B"].problem(factor * p, num_devices=p, num_microbatches=m,
                                                         weight_memory=0.3)
            result = solve(problem, time_limit=time_limit, objective="span", lower_peak=False)
            began = time.perf_counter()
            bound = span_bound(problem, began + time_limit)
            seconds = time.perf_counter() - began
            new = max(bound, result.lower_bound)
            gap = (result.objective - new) / result.objective
            rows.append({"row": "span", "p": p, "m": m, "memory_limit": factor * p, "span": result.objective,
                         "bound_before": result.lower_bound, "gap_before": result.gap, "span_bound": bound,
                         "gap_after": gap, "span_bound_s": seconds})
            print(f"{p:>2} {m:>3} {factor * p:>4} | {result.objective:>8.2f} {result.lower_bound:>8.2f} "
                  f"{result.gap:>6.2%} | {bound:>8.2f} {gap:>6.2%} {seconds:>5.2f}", flush=True)
    return rows


def pair_rows(shapes: str, time_limit: float) -> list[dict]:
    print(f"\n{'layout':<14} {'p':>2} {'m':>3} {'F':>2} {'pair':>4} | {'answer':>7} {'bound':>7} {'gap':>6} | "
          f"{'new':>7} {'gap':>6}", flush=True)
    cases = []
    for shape in shapes.split(","):
        p, m = (int(x) for x in shape.split("x"))
        cases += [(placement, p, m, 1, 2.2) for placement in ("bidirectional", "v")]
    rows = []
    for placement, p, m, cost, pair in [*cases, ("bidirectional", 4, 16, 3, 8)]:
        problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement=placement,
                          forward_times=cost, backward_times=cost, weight_times=cost, overlap_times={"FBW": pair})
        result = solve(problem, time_limit=time_limit, lower_peak=False)
        bound = pair_count_bound(problem)
        new = max(bound, result.lower_bound)
        gap = (result.objective - new) / result.objective
        rows.append({"row": "pairs", "layout": placement, "p": p, "m": m, "cost": cost, "pair": pair,
                     "answer": result.objective, "bound_before": result.lower_bound, "gap_before": result.gap,
                     "pair_count_bound": bound, "gap_after": gap})
        print(f"{placement:<14} {p:>2} {m:>3} {cost:>2} {pair:>4} | {result.objective:>7.2f} "
              f"{result.lower_bound:>7.2f} {result.gap:>6.2%} | {bound:>7.2f} {gap:>6.2%}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="span,pairs")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--span-shapes", default="4x8,4x16,4x24,8x8,8x16,8x24")
    parser.add_argument("--pair-shapes", default="2x4,2x8,4x8,4x16")
    args = parser.parse_args()
    kinds = args.rows.split(",")
    rows = (span_rows(args.span_shapes, args.time_limit) if "span" in kinds else []) + \
        (pair_rows(args.pair_shapes, args.time_limit) if "pairs" in kinds else [])
    write_results("bench_bounds_extra", time_limit_s=args.time_limit, rows=rows)


if __name__ == "__main__":
    main()
