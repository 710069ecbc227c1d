"""Issue 44's target: is the optimizer certified on the iteration objective where it is on the
makespan? The Zero Bubble paper's four Table 5 models (v = 1, zbopt.core.paper_tables) at memory
p·M_B and 2p·M_B, each solved with the same budget: the pipeline alone (makespan), with the
iteration's ends (each stage's gradient all-reduce and each device's optimizer step), and with
the ends over two iterations (each device's step its flush).

The ends, stated: data-parallel 8 over 25 GB/s per rank with 0.05 ms per ring step (between
nodes); each stage holds the model's parameters / p, its gradients 4 bytes each (fp32
accumulation), reduced by a ring all-reduce (`ring_all_reduce_ms`); the step moves 30 bytes per
parameter (fused Adam in bf16 with fp32 master weights and moments) at 2,000 GB/s.

Usage: python benchmarks/bench_ends.py [--time-limit S] [--models 1.5B,6.2B,...]
Prints a table and writes benchmarks/results/bench_ends.json.
"""

from __future__ import annotations

import argparse

from record import write_results

from zbopt import solve
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS
from zbopt.planning.model.collectives import ring_all_reduce_ms, ring_reduce_scatter_ms

DATA_PARALLEL, BANDWIDTH_GBS, LATENCY_MS, MEMORY_BANDWIDTH_GBS = 8, 25.0, 0.05, 2000.0
GRADIENT_BYTES, STEP_BYTES = 4, 30


def ends_of(name: str, stages: int, fsdp: bool = False) -> dict:
    """The iteration's ends of one stage of the model called `name` ("1.5B": 1.5e9 parameters):
    its gradients all-reduced, or with FSDP reduce-scattered and the step on a shard of them."""
    parameters = float(name.rstrip("B")) * 1e9 / stages
    collective = ring_reduce_scatter_ms if fsdp else ring_all_reduce_ms
    reduce = collective(parameters * GRADIENT_BYTES / 1e9, DATA_PARALLEL, BANDWIDTH_GBS, LATENCY_MS)
    step = parameters * STEP_BYTES / (DATA_PARALLEL if fsdp else 1) / 1e9 / MEMORY_BANDWIDTH_GBS * 1e3
    return {"grad_reduce_times": reduce, "optimizer_step_times": step}


def paper_arguments(doc: str) -> argparse.Namespace:
    """`--time-limit` (per solve) and `--models` (of the paper's four), for the benchmarks on them."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--models", default=",".join(ZERO_BUBBLE_MODELS))
    return parser.parse_args()


def main() -> None:
    args = paper_arguments(__doc__)
    rows = []
    print(f"{'case':<18}{'objective':<14}{'status':<10}{'value':>10}{'bound':>10}{'gap':>8}  binding bound", flush=True)
    for name in args.models.split(","):
        model = ZERO_BUBBLE_MODELS[name]
        for factor in (1, 2):
            plain = model.problem(factor * model.num_devices)
            ended = plain.replace(**ends_of(name, model.num_devices))
            for objective, problem in (("makespan", plain), ("iteration", ended),
                                       ("2 iterations", ended.replace(iterations=2))):
                result = solve(problem, time_limit=args.time_limit, lower_peak=False, seed=0)
                row = {"model": name, "memory": f"{factor}p", "objective": objective, "status": result.status,
                       "value": result.objective, "lower_bound": result.lower_bound, "gap": result.gap,
                       "binding_bound": result.binding_bound, "time_limit": args.time_limit,
                       "ends": None if objective == "makespan" else ends_of(name, model.num_devices)}
                rows.append(row)
                print(f"{name + ' mem ' + row['memory']:<18}{objective:<14}{result.status:<10}{result.objective:>10.1f}"
                      f"{result.lower_bound:>10.1f}{result.gap:>8.2%}  {result.binding_bound}", flush=True)
    write_results("bench_ends", rows=rows)


if __name__ == "__main__":
    main()
