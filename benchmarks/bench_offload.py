"""What offload buys near the memory floor, alone and with recomputation; prints a table and writes
benchmarks/results/bench_offload.json.

The Zero Bubble paper's 1.5B costs (as `bench_recompute.py`: F 18.522, B 18.086, W 9.337, comm
0.601 ms; M_B = 1, M_W = 0.366), a checkpoint of 0.03 M_B, R = F, and a PCIe-like copy of one
activation each way of OFFLOAD_MS: with flash attention a layer keeps 34sbh bytes (Korthikanti et
al.'s per-layer count without the attention scores), 80 MB for s = 1024, b = 1, h = 2304; a stage
of three layers (an assumption) holds 240 MB, which PCIe 4.0 x16 (about 25 GB/s in practice)
moves in about 10 ms. For p = 4,
m = 8 and p = 8, m = 16 and memory limits from the floor (1) to 2p activations, per limit: the
optimum keeping every activation, allowed to offload, allowed to offload and recompute (CP-SAT,
each with the time limit), PipeOffload on 1F1B where it fits, and full offload on 1F1B's order
fitted to the limit.

Usage: python benchmarks/bench_offload.py [--time-limit S] [--shapes 4x8,8x16]
"""

from __future__ import annotations

from bench_recompute import CHECKPOINT, LIMITS, arguments, problem
from record import write_results

from zbopt import NotApplicableError, generate, simulate, solve

OFFLOAD_MS = 10.0


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    rows = []
    print(f"{'p':>2} {'m':>3} {'limit':>5} | {'kept':>7} {'gap':>6} | {'offload':>7} {'bound':>7} {'gap':>6} "
          f"{'O':>4} | {'both':>7} {'bound':>7} {'gap':>6} {'R':>4} {'O':>4} | {'pipeoffload':>11} "
          f"{'full-offload':>12}", flush=True)
    for shape in args.shapes.split(","):
        p, m = (int(x) for x in shape.split("x"))
        for limit in LIMITS[p]:
            kept = solve(problem(p, m, limit, False), time_limit=args.time_limit, lower_peak=False)
            offload = solve(problem(p, m, limit, False, OFFLOAD_MS), time_limit=args.time_limit, lower_peak=False)
            both_problem = problem(p, m, limit, True, OFFLOAD_MS)
            both = solve(both_problem, time_limit=args.time_limit, lower_peak=False)
            heuristic = simulate(both_problem, generate("pipeoffload", both_problem))
            pipeoffload = heuristic.makespan if heuristic.valid else None
            try:
                fitted_run = simulate(both_problem, generate("full-offload", both_problem))
                full = fitted_run.makespan if fitted_run.valid else None
            except NotApplicableError:  # its order found no room at this limit
                full = None
            row = {"p": p, "m": m, "limit": limit, "activations": p * m,
                   "kept": kept.objective, "kept_status": kept.status, "kept_gap": kept.gap,
                   "offload": offload.objective, "offload_status": offload.status,
                   "offload_bound": offload.lower_bound, "offload_gap": offload.gap,
                   "offload_binding": offload.binding_bound,
                   "offloaded": len(offload.simulation.table.offloaded),
                   "both": both.objective, "both_status": both.status, "both_bound": both.lower_bound,
                   "both_gap": both.gap, "both_recomputed": len(both.simulation.table.recomputed),
                   "both_offloaded": len(both.simulation.table.offloaded),
                   "pipeoffload": pipeoffload, "pipeoffload_peak": max(heuristic.peak_memory), "full_offload": full,
                   "time_s": kept.solve_time_s + offload.solve_time_s + both.solve_time_s}
            rows.append(row)
            fitted = f"{pipeoffload:>11.1f}" if pipeoffload is not None else \
                f"{'peak ' + format(max(heuristic.peak_memory), 'g'):>11}"
            print(f"{p:>2} {m:>3} {limit:>5g} | {kept.objective:>7.1f} {kept.gap:>6.1%} | "
                  f"{offload.objective:>7.1f} {offload.lower_bound:>7.1f} {offload.gap:>6.1%} "
                  f"{row['offloaded']:>4} | {both.objective:>7.1f} {both.lower_bound:>7.1f} {both.gap:>6.1%} "
                  f"{row['both_recomputed']:>4} {row['both_offloaded']:>4} | {fitted} "
                  f"{'-' if full is None else format(full, '.1f'):>12}", flush=True)
    write_results("bench_offload", time_limit_s=args.time_limit, checkpoint_memory=CHECKPOINT,
                  offload_ms=OFFLOAD_MS, rows=rows)


if __name__ == "__main__":
    main()
