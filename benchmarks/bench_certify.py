"""Issue 30's grid: how far from the optimum the answer is certified, and which bound binds.

Every row is one `solve` (default 120 s, `lower_peak=False`), run `--runs` times (runs vary):
- "loop": interleaved placement, v = 2, p = 4 (m = 8), 6 (m = 12) and 8 (m = 16), memory p/2 and p whole-stage
  activations (bench_scale.py's HALVED costs: the 1.5B costs halved per chunk);
- "vmin": V placement, p = 8, m = 16 and 24, the limit V-Min's own peak;
- "zbv": V placement at ZB-V's own peak, p = 16 (m = 32) and 32 (m = 64), the first and last stages
  1.5 times as heavy (embedding and output layer) as well as uniform;
- "pairs": both ways (DualPipe's placement), p = 4, m = 16, F = B = W = 3, a forward overlapped
  with another microbatch's whole backward (FBW: B and W) in 8;
- "span": the span objective at v = 1, p = 4 and 8, m = 3p, the Zero Bubble paper's 1.5B costs,
  memory ZB-1p's (p·M_B) and ZB-2p's (2p·M_B).
Prints a table and writes benchmarks/results/bench_certify.json.

Usage: python benchmarks/bench_certify.py [--rows loop,vmin,zbv,pairs,span] [--time-limit S] [--runs N]
"""

from __future__ import annotations

import argparse
import time

from bench_scale import COSTS, HALVED
from record import write_results

from zbopt import Problem, generate, simulate, solve

HEAVY_ENDS = 1.5


def loop_cases() -> list[tuple[str, Problem, str]]:
    return [(f"loop p{p} m{2 * p} mem {memory}",
             Problem(num_devices=p, num_microbatches=2 * p, chunks_per_device=2, memory_limit=memory, **HALVED),
             "makespan") for p in (4, 6, 8) for memory in (p // 2, p)]


def _at_own_peak(problem: Problem, name: str) -> Problem:
    return problem.replace(memory_limit=max(simulate(problem, generate(name, problem)).peak_memory))


def vmin_cases() -> list[tuple[str, Problem, str]]:
    return [(f"V p8 m{m} v-min memory", _at_own_peak(
        Problem(num_devices=8, num_microbatches=m, chunks_per_device=2, placement="v", **HALVED), "v-min"),
        "makespan") for m in (16, 24)]


def _heavy_ends(p: int) -> dict:
    """HALVED with the first and last virtual stages HEAVY_ENDS times as costly (F, B, W)."""
    costs = dict(HALVED)
    for key in ("forward_times", "backward_times", "weight_times"):
        per_stage = [HALVED[key]] * (2 * p)
        per_stage[0] = per_stage[-1] = HALVED[key] * HEAVY_ENDS
        costs[key] = per_stage
    return costs


def zbv_cases() -> list[tuple[str, Problem, str]]:
    cases = []
    for p in (16, 32):
        for label, costs in (("uniform", HALVED), ("heavy ends", _heavy_ends(p))):
            base = Problem(num_devices=p, num_microbatches=2 * p, chunks_per_device=2, placement="v", **costs)
            cases.append((f"V p{p} m{2 * p} zb-v memory, {label}", _at_own_peak(base, "zb-v"), "makespan"))
    return cases


def pair_cases() -> list[tuple[str, Problem, str]]:
    return [("pairs both ways p4 m16", Problem(num_devices=4, num_microbatches=16, chunks_per_device=2,
                                               placement="bidirectional", forward_times=3, backward_times=3,
                                               weight_times=3, overlap_times={"FBW": 8}), "makespan")]


def span_cases() -> list[tuple[str, Problem, str]]:
    return [(f"span p{p} m{3 * p} memory {factor}p", Problem(num_devices=p, num_microbatches=3 * p,
                                                             memory_limit=factor * p, weight_memory=0.366, **COSTS),
             "span") for p in (4, 8) for factor in (1, 2)]


CASES = {"loop": loop_cases, "vmin": vmin_cases, "zbv": zbv_cases, "pairs": pair_cases, "span": span_cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(CASES))
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    rows = []
    print(f"{'case':<36}{'run':>4}{'wall s':>8}  {'status':<9}{'objective':>10}{'bound':>10}{'gap':>8}  "
          "binding bound; warm start", flush=True)
    for kind in args.rows.split(","):
        for label, problem, objective in CASES[kind]():
            for run in range(args.runs):
                began = time.perf_counter()
                result = solve(problem, time_limit=args.time_limit, objective=objective, lower_peak=False, seed=run)
                row = {"row": kind, "case": label, "run": run, "time_limit": args.time_limit,
                       "wall_s": time.perf_counter() - began, "status": result.status, "objective": result.objective,
                       "lower_bound": result.lower_bound, "gap": result.gap, "binding_bound": result.binding_bound,
                       "binding_devices": list(result.binding_devices), "bounds": result.bounds,
                       "bound_seconds": result.bound_seconds, "bounds_complete": result.bounds_complete,
                       "warm_start": result.warm_start}
                rows.append(row)
                devices = f" on {row['binding_devices']}" if row["binding_devices"] else ""
                print(f"{label:<36}{run:>4}{row['wall_s']:>8.1f}  {row['status']:<9}{row['objective']:>10.1f}"
                      f"{row['lower_bound']:>10.1f}{row['gap']:>8.2%}  {row['binding_bound']}{devices}"
                      f"{'' if row['bounds_complete'] else ' (bounds cut)'}; {row['warm_start']}", flush=True)
    write_results("bench_certify", rows=rows)


if __name__ == "__main__":
    main()
