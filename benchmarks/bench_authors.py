"""zbopt's V-shape generators against the Zero Bubble authors' algorithms (issue 30, item 5).

`zb-v` and `v-half` are zbopt's accounts of the authors' generators (sail-sg/zero-bubble-pipeline-
parallelism: zbv.py, the ZB-V greedy; zbv_greedy.py, V-Half's reordering); `torch-zbv` and
`v-half-squeezed` are zbopt's earlier readings of the papers. Per problem: each one's simulated
makespan and peak memory; the authors' own pick among the greedy's variants (least worst idle,
where zbopt picks by makespan); and an independent timing of zb-v's order by the authors' cost
model (each op after its device's previous op and its input, plus the latency between devices),
which must equal zbopt's simulator. Costs: F = B = W = 1; the 1.5B model's per chunk (HALVED,
bench_scale.py); the same with the last stage (device 0's chunk 1) twice as heavy. (The authors'
code times with one F, B, W for all stages, so the heavy-last-stage rows time each op by its own
costs instead.)

    python benchmarks/bench_authors.py [--quick]
"""

from __future__ import annotations

import sys
import time

from record import write_results

from zbopt import Problem, generate, simulate
from zbopt.core.ops import Op
from zbopt.schedules.common import passes_to_schedule
from zbopt.schedules.vshape_greedy import greedy_candidates

HALVED = dict(forward_times=9.261, backward_times=9.043, weight_times=4.6685, p2p_time=0.601, activation_memory=0.5,
              weight_memory=0.183)
EQUAL = dict(forward_times=1.0, backward_times=1.0, weight_times=1.0, weight_memory=1.0)
NAMES = ("torch-zbv", "zb-v", "v-half-squeezed", "v-half")


def heavy_last(p: int) -> dict:
    """HALVED with the last virtual stage's F, B, W doubled (the output layer)."""
    def doubled(value: float) -> list[float]:
        return [value] * (2 * p - 1) + [2 * value]
    return {**HALVED, **{key: doubled(HALVED[key]) for key in ("forward_times", "backward_times", "weight_times")}}


def authors_timing(problem: Problem, orders: list[list[Op]]) -> float:
    """The authors' cost model, written apart from zbopt's simulator: every op ends at its cost
    after the later of its device's previous op and its input (on another device: plus the
    latency); the inputs of the V placement: F after the previous stage's F, B after the next
    stage's B (the last stage's after its F), W after its B."""
    last = problem.num_stages - 1
    ends: dict[Op, float] = {}
    position, clock = [0] * len(orders), [0.0] * len(orders)

    def source(op: Op) -> Op | None:
        if op.kind == "F":
            return Op("F", op.stage - 1, op.microbatch) if op.stage else None
        if op.kind == "B":
            return Op("B", op.stage + 1, op.microbatch) if op.stage < last else Op("F", last, op.microbatch)
        return Op("B", op.stage, op.microbatch)

    while any(place < len(order) for place, order in zip(position, orders, strict=True)):
        progressed = False
        for device, order in enumerate(orders):
            while position[device] < len(order):
                op = order[position[device]]
                before = source(op)
                if before is not None and before not in ends:
                    break
                arrival = 0.0 if before is None else ends[before] + (
                    problem.p2p_time if problem.device_of(before.stage) != device else 0.0)
                clock[device] = ends[op] = max(clock[device], arrival) + problem.cost(op.kind, op.stage)
                position[device] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("the order deadlocks")
    return max(clock)


def row(p: int, m: int, costs_name: str, costs: dict) -> dict:
    problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=2, placement="v", **costs)
    began = time.perf_counter()
    results = {name: simulate(problem, generate(name, problem)) for name in NAMES}
    seconds = time.perf_counter() - began
    caps = [p * (problem.activation_memory[d] + problem.activation_memory[2 * p - 1 - d]) for d in range(p)]
    picked = min(greedy_candidates(problem, caps), key=lambda candidate: candidate[1])[0]
    authors_pick = simulate(problem, passes_to_schedule(problem, picked)).makespan
    reference = authors_timing(problem, [list(order) for order in generate("zb-v", problem).orders])
    out = {"p": p, "m": m, "costs": costs_name, "seconds": round(seconds, 2), "authors_pick_zb_v": authors_pick,
           "authors_model_zb_v": reference, "simulator_equals_authors_model":
           abs(reference - results["zb-v"].makespan) <= 1e-9 * reference}
    for name, result in results.items():
        out[name] = result.makespan
        out[f"{name} peak"] = max(result.peak_memory)
    return out


def main(quick: bool) -> None:
    rows = []
    for p in (4,) if quick else (4, 8, 16):
        for m in (2 * p, 3 * p, 4 * p):
            for costs_name, costs in (("equal", EQUAL), ("1.5B", HALVED), ("heavy last", heavy_last(p))):
                rows.append(row(p, m, costs_name, costs))
    print(f"{'p':>3} {'m':>3} {'costs':<10} {'torch-zbv':>10} {'zb-v':>10} {'Δ%':>6} {'auth.pick':>10} "
          f"{'sim=auth':>8} {'v-half-sq':>10} {'v-half':>10} {'Δ%':>6}  peaks (rule, zb-v, sq, v-half)")
    for r in rows:
        zb = 100 * (r["zb-v"] - r["torch-zbv"]) / r["torch-zbv"]
        half = 100 * (r["v-half"] - r["v-half-squeezed"]) / r["v-half-squeezed"]
        peaks = ", ".join(f"{r[f'{name} peak']:.3g}" for name in NAMES)
        print(f"{r['p']:>3} {r['m']:>3} {r['costs']:<10} {r['torch-zbv']:>10.3f} {r['zb-v']:>10.3f} {zb:>6.2f} "
              f"{r['authors_pick_zb_v']:>10.3f} {r['simulator_equals_authors_model']!s:>8} "
              f"{r['v-half-squeezed']:>10.3f} {r['v-half']:>10.3f} {half:>6.2f}  {peaks}")
    write_results("bench_authors", rows=rows)


if __name__ == "__main__":
    main("--quick" in sys.argv)
