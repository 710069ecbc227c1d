"""Does a bound over several devices at once raise the lower bound where one device is exhausted?

For issue 30's grid (the costs of `bench_scale.py`, halved per chunk, v = 2): V placement, p = 8,
m = 16 and 24, at V-Min's memory; loop placement, p = 6, m = 12, memory 3 and 6, and p = 8, m = 16,
memory 4 and 8. Per case: `lower_bounds(problem).best` (today's bounds, cut short where the machine
is busy), each device's sequencing bound (`sequencing.device_sequencing`, no deadline: "seq" is the
highest), and for k = 1, 2, 3 the k-device relaxation (`cross_device.group_relaxation`) on the most
promising groups (`device_groups`, scored by the sequencing bounds), started from the best of those
bounds: what CP-SAT proved, and the best solution of the relaxation it found (no bound from that
group can pass it, however long it runs), with the time each took; next to the best makespan known
(issue 30's table). Then item 2's cases: recomputation (p = 4, m = 8, limit 1.5, `bench_recompute.py`'s
1.5B costs) and overlapped pairs both ways (`bench_overlap.py`'s p = 2, m = 8, and p = 4, m = 16 with
F = B = W = 3 and an FBW pair of 8).

Prints a table and writes benchmarks/results/bench_cross_device.json. Timings are wall times on a
shared machine (CP-SAT with two workers).
Usage: python benchmarks/bench_cross_device.py [--seconds S (per bound; default 30)] [--groups N (per k;
default 1)] [--ks 1,2,3] [--cases N,N (row numbers; default all; the file is then named after them)]
"""

from __future__ import annotations

import argparse
import time

from bench_recompute import problem as recompute_problem
from bench_scale import HALVED
from record import write_results

from zbopt import Problem, generate, simulate
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.cross_device import device_groups, group_relaxation
from zbopt.solvers.implied import heads_and_tails, implied_graph
from zbopt.solvers.overlap_pairs import as_paired
from zbopt.solvers.sequencing import device_sequencing

# (placement, p, m, memory limit: a number, or the named heuristic's peak; best makespan known, issue 30)
CASES = [("v", 8, 16, "v-min", 1139.3), ("v", 8, 24, "v-min", 1649.3), ("loop", 6, 12, 3, 876.8),
         ("loop", 6, 12, 6, 629.4), ("loop", 8, 16, 4, 1207.9), ("loop", 8, 16, 8, 918.0)]
# item 2 (recomputation, overlapped pairs): (name, problem, best makespan known, issue 30)
MECHANISM_CASES = [
    ("recompute p=4 m=8 1.5", recompute_problem(4, 8, 1.5, True), 546.5),
    ("pairs 2 ways p=2 m=8", Problem(num_devices=2, num_microbatches=8, chunks_per_device=2,
                                     placement="bidirectional", forward_times=1, backward_times=1, weight_times=1,
                                     overlap_times={"FBW": 2.2}), 19.2),
    ("pairs 2 ways p=4 m=16", Problem(num_devices=4, num_microbatches=16, chunks_per_device=2,
                                      placement="bidirectional", forward_times=3, backward_times=3, weight_times=3,
                                      overlap_times={"FBW": 8}), 138.0),
]


def case_problem(placement: str, p: int, m: int, memory) -> Problem:
    base = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement=placement, **HALVED)
    if isinstance(memory, str):
        memory = max(simulate(base, generate(memory, base)).peak_memory)
    return base.replace(memory_limit=memory)


def measure(name: str, problem: Problem, known: float, ks: list[int], groups: int, seconds: float) -> dict:
    """Today's bounds, each device's sequencing bound (the groups' scores and the floor; where it
    applies: not with recomputation or both ways), then per k the most promising groups'
    relaxation: what CP-SAT proved and the best solution it found."""
    began = time.perf_counter()
    today = lower_bounds(problem)
    row = {"case": name, "problem": problem.to_dict(), "known": known, "today": today.best,
           "today_binding": today.binding, "today_complete": today.complete, "today_s": time.perf_counter() - began,
           "k": {}}
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(as_paired(graph, problem) if problem.overlap_times else graph)
    began = time.perf_counter()
    scores = None
    if not (problem.mechanisms_matter or problem.bidirectional):
        scores = [device_sequencing(problem, device, heads, tails) for device in range(problem.num_devices)]
    row.update(sequencing=scores or [0.0], sequencing_s=time.perf_counter() - began)
    floor = max(today.best, *row["sequencing"])
    for k in ks:
        tried = []
        for group in device_groups(problem, k, scores)[:groups]:
            began = time.perf_counter()
            found = group_relaxation(problem, group, graph, heads, tails, seconds, floor)
            tried.append({"devices": group, "bound": found.bound, "relaxed": found.relaxed,
                          "seconds": time.perf_counter() - began})
        row["k"][k] = tried
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--ks", default="1,2,3")
    parser.add_argument("--cases", default=None)
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    cases = [(f"{placement} p={p} m={m} mem {memory}", case_problem(placement, p, m, memory), known)
             for placement, p, m, memory, known in CASES] + MECHANISM_CASES
    chosen = cases if args.cases is None else [cases[int(n)] for n in args.cases.split(",")]
    print(f"{'case':<22}{'known':>8}{'today':>8}{'seq':>8}  "
          + "".join(f"{'k=' + str(k) + ' bound / relaxed':>36}" for k in ks))
    rows = []
    for name, problem, known in chosen:
        row = measure(name, problem, known, ks, args.groups, args.seconds)
        rows.append(row)
        print(f"{name:<22}{row['known']:>8.1f}{row['today']:>8.1f}{max(row['sequencing']):>8.1f}  "
              + "".join(_cell(row["k"][k]) for k in ks), flush=True)
    name = "bench_cross_device" + ("" if args.cases is None else "_" + args.cases.replace(",", "_"))
    write_results(name, seconds=args.seconds, groups=args.groups, rows=rows)


def _cell(tried: list[dict]) -> str:
    """The group that proved the most: its bound, the best solution of its relaxation found (no
    bound from it can pass that), its devices and time."""
    best = max(tried, key=lambda t: t["bound"])
    relaxed = "none" if best["relaxed"] is None else f"{best['relaxed']:.1f}"
    return f"{best['bound']:>10.1f} / {relaxed:>7} {','.join(map(str, best['devices'])):>8} {best['seconds']:>4.0f}s"


if __name__ == "__main__":
    main()
