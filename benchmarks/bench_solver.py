"""The exact optimizer on the issue's grids; prints a table and writes benchmarks/results/*.json.

Grid A (proof): p in {4, 8} x m in {8, 16, 24} x memory limit in {p, 1.5p, 2p}·M_B with the Zero
Bubble paper's 1.5B costs (F 18.522, B 18.086, W 9.337, comm 0.601 ms), M_B = 1, M_W = 0.3.
Grid B (scale): the four ZB Table 5 configurations (zbopt.core.paper_tables: Table 9 costs, M_B = 1, M_W
from the paper's Table 1) at memory p·M_B and 2p·M_B; --weight-memory overrides M_W.

Usage: python benchmarks/bench_solver.py [A|B] [--solvers cpsat,highs] [--time-limit S] [--objective span]
       [--weight-memory M_W]
(the Zero Bubble paper's bubble rate measures spans: compare zb_bubble_rate under --objective span)
"""

from __future__ import annotations

import argparse

from record import write_results

from zbopt import Problem, solve
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS
from zbopt.solvers.warm import best_heuristic

ONE_POINT_FIVE_B = ZERO_BUBBLE_MODELS["1.5B"]


def grid_a() -> list[tuple[str, Problem]]:
    cases = []
    for p in (4, 8):
        for m in (8, 16, 24):
            for factor in (1.0, 1.5, 2.0):
                problem = ONE_POINT_FIVE_B.problem(factor * p, num_devices=p, num_microbatches=m, weight_memory=0.3)
                cases.append((f"p={p} m={m} mem={factor:g}p", problem))
    return cases


def grid_b(weight_memory: float | None = None) -> list[tuple[str, Problem]]:
    changes = {} if weight_memory is None else {"weight_memory": weight_memory}
    return [(f"{name} mem={factor}p", model.problem(factor * model.num_devices, **changes))
            for name, model in ZERO_BUBBLE_MODELS.items() for factor in (1, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", choices=["A", "B"])
    parser.add_argument("--solvers", default="cpsat,highs")
    parser.add_argument("--time-limit", type=float)
    parser.add_argument("--objective", choices=["makespan", "span"], default="makespan")
    parser.add_argument("--weight-memory", type=float, help="Grid B: M_W instead of the paper's Table 1 share")
    args = parser.parse_args()
    cases = grid_a() if args.grid == "A" else grid_b(args.weight_memory)
    limit = args.time_limit or (60.0 if args.grid == "A" else 120.0)
    rows = []
    header = (f"{'case':<22} {'solver':<6} {'status':<8} {'objective':>10} {'bound':>10} {'gap':>7} {'time s':>7} "
              f"{'zb bubble':>9} {'best heuristic':>22}")
    print(header, flush=True)
    for label, problem in cases:
        heuristic = best_heuristic(problem, args.objective)
        for solver in args.solvers.split(","):
            result = solve(problem, solver, time_limit=limit, objective=args.objective, lower_peak=False)
            row = {"case": label, "solver": solver, "status": result.status, "objective": result.objective,
                   "lower_bound": result.lower_bound, "gap": result.gap, "solve_time_s": result.solve_time_s,
                   "zb_bubble_rate": result.simulation.zb_bubble_rate if result.simulation else None,
                   "best_heuristic": heuristic[0] if heuristic else None,
                   "best_heuristic_makespan": heuristic[1].makespan if heuristic else None,
                   "best_heuristic_zb_bubble_rate": heuristic[1].zb_bubble_rate if heuristic else None}
            rows.append(row)
            best = f"{row['best_heuristic']} {row['best_heuristic_makespan']:.1f}" if heuristic else "none"
            print(f"{label:<22} {solver:<6} {result.status:<8} {result.objective:>10.2f} {result.lower_bound:>10.2f} "
                  f"{result.gap:>7.2%} {result.solve_time_s:>7.1f} {row['zb_bubble_rate']:>9.4f} {best:>22}",
                  flush=True)
    variant = "" if args.weight_memory is None else f"_mw{args.weight_memory:g}"
    write_results(f"bench_solver_{args.grid}_{args.objective}{variant}", time_limit_s=limit,
                  objective=args.objective, rows=rows)


if __name__ == "__main__":
    main()
