"""What the optimizer finds with overlapped pairs against DualPipe's and DualPipeV's fixed patterns;
prints a table and writes benchmarks/results/bench_overlap.json.

F = B = W = 1 per stage copy (chunk), a forward overlapped with another microbatch's full backward
(FBW) at FRACTION of the three in a row, no latency, no memory limit. Both ways (placement
"bidirectional", DualPipe) on p devices and m microbatches, and DualPipeV (placement "v") on the
same devices: per shape, the heuristic's makespan, CP-SAT's answer with the time limit, its lower
bound and gap, and how many pairs each runs.

Usage: python benchmarks/bench_overlap.py [--time-limit S] [--shapes 2x4,2x8,4x8,4x16]
"""

from __future__ import annotations

import argparse

from record import write_results

from zbopt import Problem, generate, simulate, solve

FRACTION = 2.2 / 3  # the pair against F + B + W in a row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--shapes", default="2x4,2x8,4x8,4x16")
    args = parser.parse_args()
    rows = []
    print(f"{'layout':<14} {'p':>2} {'m':>3} | {'heuristic':>9} {'pairs':>5} | {'cpsat':>7} {'bound':>7} {'gap':>6} "
          f"{'status':>8} {'pairs':>5} {'s':>5}", flush=True)
    for shape in args.shapes.split(","):
        p, m = (int(x) for x in shape.split("x"))
        for placement, name in (("bidirectional", "dualpipe"), ("v", "dualpipe-v")):
            problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement=placement,
                              forward_times=1, backward_times=1, weight_times=1,
                              overlap_times={"FBW": round(3 * FRACTION, 6)})
            heuristic = simulate(problem, generate(name, problem))
            result = solve(problem, time_limit=args.time_limit, lower_peak=False)
            row = {"layout": placement, "schedule": name, "p": p, "m": m, "heuristic": heuristic.makespan,
                   "heuristic_pairs": len(heuristic.pairs), "cpsat": result.objective, "bound": result.lower_bound,
                   "gap": result.gap, "status": result.status, "cpsat_pairs": len(result.simulation.pairs),
                   "time_s": result.solve_time_s}
            rows.append(row)
            print(f"{placement:<14} {p:>2} {m:>3} | {heuristic.makespan:>9.1f} {len(heuristic.pairs):>5} | "
                  f"{result.objective:>7.1f} {result.lower_bound:>7.1f} {result.gap:>6.1%} {result.status:>8} "
                  f"{row['cpsat_pairs']:>5} {result.solve_time_s:>5.0f}", flush=True)
    write_results("bench_overlap", time_limit_s=args.time_limit, fraction=FRACTION, rows=rows)


if __name__ == "__main__":
    main()
