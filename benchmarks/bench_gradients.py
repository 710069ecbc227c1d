"""FSDP's unsharded gradients (issue 44, `gradient_memory`): what holding each stage's gradients
from its first W until its reduce-scatter ends costs the optimum, and whether the optimizer is
still certified at the Zero Bubble paper's scale (its four Table 5 models, v = 1,
zbopt.core.paper_tables) where it is without them.

The ends, stated as in bench_ends.py but for FSDP: data-parallel 8 over 25 GB/s per rank with 0.05
ms per ring step; each stage's gradients 4 bytes per parameter (fp32), reduce-scattered
(`ring_reduce_scatter_ms`); the step moves 30 / 8 bytes per parameter (each rank updates its
shard) at 2,000 GB/s. The gradients' memory is stated in units of one microbatch's activations
on a stage (M_B, the paper's unit): G = 1 and 3 (a stage's fp32 gradients against M_B depend on
the microbatch size and the layers per stage, which the paper's tables do not fix). Each case at
the limits p·M_B + G and 2p·M_B + G (the paper's ZB-H1 and ZB-H2 memories, with room for one
stage's gradients), solved with the gradients held and, at the same limit, without them.

Usage: python benchmarks/bench_gradients.py [--time-limit S] [--models 1.5B,6.2B,...]
Prints a table and writes benchmarks/results/bench_gradients.json.
"""

from __future__ import annotations

from bench_ends import ends_of, paper_arguments
from record import write_results

from zbopt import ProblemError, solve
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS


def _solved(problem, time_limit: float) -> dict:
    try:
        result = solve(problem, time_limit=time_limit, lower_peak=False, seed=0)
    except ProblemError as error:
        return {"status": "refused", "error": str(error)}
    return {"status": result.status, "value": result.objective, "lower_bound": result.lower_bound, "gap": result.gap,
            "peak": max(result.simulation.peak_memory), "binding_bound": result.binding_bound}


def _cells(result: dict, width: int) -> str:
    """A result's status, value, bound and gap, the status `width` wide."""
    if result["status"] == "refused":
        return f"{'refused':<{width}}{'-':>10}{'-':>10}{'-':>8}"
    return f"{result['status']:<{width}}{result['value']:>10.1f}{result['lower_bound']:>10.1f}{result['gap']:>8.2%}"


def main() -> None:
    args = paper_arguments(__doc__)
    rows = []
    print(f"{'case':<22}{'gradients: status':<18}{'value':>10}{'bound':>10}{'gap':>8}  "
          f"{'without: status':<16}{'value':>10}{'bound':>10}{'gap':>8}", flush=True)
    for name in args.models.split(","):
        model = ZERO_BUBBLE_MODELS[name]
        ends = ends_of(name, model.num_devices, fsdp=True)
        for gradients in (1.0, 3.0):
            for factor in (1, 2):
                limit = factor * model.num_devices + gradients
                without = model.problem(limit, **ends)
                held = without.replace(gradient_memory=gradients)
                row = {"model": name, "gradient_memory": gradients, "memory_limit": limit, "ends": ends,
                       "time_limit": args.time_limit, "gradients": _solved(held, args.time_limit),
                       "without": _solved(without, args.time_limit)}
                rows.append(row)
                print(f"{f'{name} G={gradients:g} mem {factor}p+G':<22}{_cells(row['gradients'], 18)}  "
                      f"{_cells(row['without'], 16)}", flush=True)
    write_results("bench_gradients", rows=rows)


if __name__ == "__main__":
    main()
