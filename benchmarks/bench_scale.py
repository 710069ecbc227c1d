"""The optimizer at training scale: does the time limit bound the whole call, and how far is it?

Rows (the Zero Bubble paper's 1.5B costs, F 18.522, B 18.086, W 9.337, comm 0.601 ms):
- "limit": v = 1, memory p·M_B, at p = 32, m = 512 (10 s) and p = 64, m = 4096 (60 s): the wall time of
  `solve` against its limit, what it answered and with which bounds (issue 14, item 5);
- "vshape": issue 14's V-shape grid, v = 2, V placement, the costs halved per chunk (activation 0.5,
  M_W 0.183 per chunk), memory limit = the named heuristic's own peak (V-Min's, V-Half's, ZB-V's):
  the gap the solver certifies;
- "interleaved": loop placement, v = 2, the same costs, memory p/2 and p whole-stage activations;
- "block": the optimal block alone (`zbopt.solvers.blocks.search`) at V-Min's and ZB-V's memory: its T, the
  least T proven, the wall time against its limit.

Prints a table and writes benchmarks/results/bench_scale.json.
Usage: python benchmarks/bench_scale.py [--rows limit,vshape,interleaved,block] [--time-limit S (all but
the limit rows; default 60)] [--solver cpsat|lns] [--quick]
"""

from __future__ import annotations

import argparse
import time

from record import write_results

from zbopt import Problem, generate, simulate, solve
from zbopt.core.dag import device_work
from zbopt.solvers.blocks.search import optimal_block
from zbopt.solvers.warm import best_heuristic

COSTS = dict(forward_times=18.522, backward_times=18.086, weight_times=9.337, p2p_time=0.601)
HALVED = dict(forward_times=9.261, backward_times=9.043, weight_times=4.6685, p2p_time=0.601, activation_memory=0.5,
              weight_memory=0.183)
LIMIT_ROWS = [(32, 512, 10.0), (64, 4096, 60.0)]
VSHAPE_ROWS = [(4, 8, "v-min"), (4, 12, "v-min"), (8, 16, "v-min"), (8, 16, "v-half"), (8, 24, "v-min"),
               (4, 8, "zb-v"), (8, 16, "zb-v"), (16, 32, "zb-v"), (16, 64, "zb-v"), (32, 64, "zb-v"), (32, 256, "zb-v")]
INTERLEAVED_ROWS = [(p, 2 * p, memory) for p in (4, 6, 8) for memory in (p // 2, p)]
BLOCK_ROWS = [(8, "v-min"), (8, "zb-v"), (16, "v-min"), (16, "zb-v"), (32, "v-min"), (32, "zb-v")]


def limit_rows(quick: bool) -> list[dict]:
    rows = []
    for p, m, limit in LIMIT_ROWS[:1] if quick else LIMIT_ROWS:
        problem = Problem(num_devices=p, num_microbatches=m, memory_limit=p, **COSTS)
        began = time.perf_counter()
        result = solve(problem, "cpsat", time_limit=limit)
        rows.append({"row": "limit", "p": p, "m": m, "v": 1, "time_limit": limit,
                     "wall_s": time.perf_counter() - began, "status": result.status, "objective": result.objective,
                     "lower_bound": result.lower_bound, "gap": result.gap, "warm_start": result.warm_start,
                     "bounds_complete": result.bounds_complete, "binding_bound": result.binding_bound})
    return rows


def _solved(kind: str, problem: Problem, solver: str, time_limit: float, **extra) -> dict:
    began = time.perf_counter()
    result = solve(problem, solver, time_limit=time_limit, lower_peak=False)
    return {"row": kind, "p": problem.num_devices, "m": problem.num_microbatches, "v": problem.chunks_per_device,
            "time_limit": time_limit, "wall_s": time.perf_counter() - began, "memory_limit": problem.memory_limit[0],
            "status": result.status, "objective": result.objective, "lower_bound": result.lower_bound,
            "gap": result.gap, "warm_start": result.warm_start, "bounds_complete": result.bounds_complete,
            "binding_bound": result.binding_bound, **extra}


def vshape_rows(time_limit: float, quick: bool, solver: str) -> list[dict]:
    rows = []
    for p, m, name in VSHAPE_ROWS[:2] if quick else VSHAPE_ROWS:
        base = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="v", **HALVED)
        heuristic = simulate(base, generate(name, base))
        problem = base.replace(memory_limit=max(heuristic.peak_memory))
        rows.append(_solved("vshape", problem, solver, time_limit, heuristic=name,
                            heuristic_makespan=heuristic.makespan))
    return rows


def interleaved_rows(time_limit: float, quick: bool, solver: str) -> list[dict]:
    rows = []
    for p, m, memory in INTERLEAVED_ROWS[:1] if quick else INTERLEAVED_ROWS:
        problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, memory_limit=memory, **HALVED)
        best = best_heuristic(problem)
        rows.append(_solved("interl", problem, solver, time_limit, heuristic=best[0] if best else "no heuristic fits",
                            heuristic_makespan=best[1].makespan if best else None))
    return rows


def block_rows(time_limit: float, quick: bool) -> list[dict]:
    rows = []
    for p, name in BLOCK_ROWS[:1] if quick else BLOCK_ROWS:
        base = Problem(num_devices=p, num_microbatches=2 * p, chunks_per_device=2, placement="v", **HALVED)
        problem = base.replace(memory_limit=max(simulate(base, generate(name, base)).peak_memory))
        began = time.perf_counter()
        found = optimal_block(problem, time_limit=time_limit)
        rows.append({"row": "block", "p": p, "m": problem.num_microbatches, "v": 2, "time_limit": time_limit,
                     "wall_s": time.perf_counter() - began, "memory_limit": problem.memory_limit[0], "heuristic": name,
                     "status": found.status, "interval": found.block.interval, "least_interval": found.least_interval,
                     "start": found.start, "work_per_microbatch": max(device_work(problem)) / problem.num_microbatches})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="limit,vshape,interleaved,block")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--solver", default="cpsat", choices=["cpsat", "lns"])
    parser.add_argument("--quick", action="store_true", help="the first row(s) of each kind only")
    args = parser.parse_args()
    kinds = args.rows.split(",")
    rows = (limit_rows(args.quick) if "limit" in kinds else []) + \
        (vshape_rows(args.time_limit, args.quick, args.solver) if "vshape" in kinds else []) + \
        (interleaved_rows(args.time_limit, args.quick, args.solver) if "interleaved" in kinds else [])
    print(f"{'row':<7}{'p':>4}{'m':>6}{'v':>3}{'memory':>8}{'limit s':>9}{'wall s':>8}  {'status':<9}{'objective':>11}"
          f"{'bound':>11}{'gap':>8}  warm start / heuristic; binding bound")
    for row in rows:
        extra = row["warm_start"] if row["row"] == "limit" else \
            f"{row['heuristic']} {row['heuristic_makespan'] or '':.6}"
        memory = row.get("memory_limit", row["p"])
        objective = "none" if row["objective"] is None else f"{row['objective']:.1f}"
        print(f"{row['row']:<7}{row['p']:>4}{row['m']:>6}{row['v']:>3}{memory:>8.3g}{row['time_limit']:>9g}"
              f"{row['wall_s']:>8.1f}  {row['status']:<9}{objective:>11}{row['lower_bound']:>11.1f}"
              f"{row['gap']:>8.2%}  {extra}; {row['binding_bound']}{'' if row['bounds_complete'] else ' (bounds cut)'}")
    blocks = block_rows(min(args.time_limit, 30.0), args.quick) if "block" in kinds else []
    if blocks:
        print(f"\n{'block':<7}{'p':>4}{'memory':>8}{'limit s':>9}{'wall s':>8}  {'status':<9}{'T':>9}{'least T':>9}"
              f"{'work':>9}  memory of / started from")
    for row in blocks:
        print(f"{'block':<7}{row['p']:>4}{row['memory_limit']:>8.3g}{row['time_limit']:>9g}{row['wall_s']:>8.1f}  "
              f"{row['status']:<9}{row['interval']:>9.3f}{row['least_interval']:>9.3f}{row['work_per_microbatch']:>9.3f}"
              f"  {row['heuristic']} / {row['start']}")
    write_results("bench_scale", solver=args.solver, rows=rows + blocks)


if __name__ == "__main__":
    main()
