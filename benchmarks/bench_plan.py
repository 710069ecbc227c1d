"""Issue 31's targets: the joint split and schedule against the even split, and the gap over every
split, within the plan's time limit.

Rows: the 32-layer model with heavy ends (examples/model_layers.yaml) on 4 devices, v = 1 and
v = 2 (V), m = 16 and 32, at 80 GB and at two tight memories (36 and 30 GB); the same layers 80 times on 8 devices,
v = 2, m = 64; Llama 3 70B (examples/model_llama3_70b.yaml) on 8 devices, v = 2, m = 64. For each:
the even split's best schedule (the least makespan of its rows, the optimizer's included), the
joint answer, how much shorter it is, the gap over every split, the seconds, the splits solved and
whether the rest were pruned.

With --joint, each row also runs the one CP-SAT model of the split and the schedule together
(`zbopt.planning.planner.joint_model`), from the even split's 1F1B (greedy with two chunks), for the same
time: its answer, the bound it proves over every split, and its gap, beside the plan's.

    python benchmarks/bench_plan.py [--time-limit 120] [--rows name,...] [--joint]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from record import write_results

from zbopt.core.errors import ZboptError
from zbopt.planning.model import Model, load_model
from zbopt.planning.planner import Pipeline, plan

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _repeated(model: Model, repeat: int) -> Model:
    """The model with its repeated layer written `repeat` times."""
    layers = model.layers
    return Model.from_repeats([(layers[0], 1), (layers[1], repeat), (layers[-1], 1)])


def cases():
    model, device = load_model(EXAMPLES / "model_layers.yaml")
    for chunks, placement in ((1, "loop"), (2, "v")):
        for m in (16, 32):
            for memory in (80.0, 36.0, 30.0):
                yield (f"32L p4 v{chunks} m{m} {memory:g}GB", model, replace(device, memory_gb=memory),
                       Pipeline(4, chunks, placement, m))
    yield "80L p8 v2 m64 80GB", _repeated(model, 80), device, Pipeline(8, 2, "v", 64)
    llama, llama_device = load_model(EXAMPLES / "model_llama3_70b.yaml")
    yield "llama-3-70b p8 v2 m64", llama, llama_device, Pipeline(8, 2, "v", 64)


def measure(name, model, device, pipeline, time_limit: float) -> dict:
    began = time.perf_counter()
    try:
        answer = plan(model, device, pipeline, time_limit=time_limit)
    except ZboptError as error:  # say, no split fits: the row says so and the others go on
        return {"case": name, "error": str(error)}
    seconds = time.perf_counter() - began
    chosen = answer.pipelines[0]
    even = [row.makespan for row in chosen.rows if row.rule == "even" and row.makespan is not None]
    even_best = min(even) if even else None
    return {"case": name, "seconds": seconds, "even_best_ms": even_best, "joint_ms": answer.makespan,
            "shorter": None if even_best is None else 1 - answer.makespan / even_best,
            "lower_bound_ms": answer.lower_bound, "gap": answer.gap, "split": list(chosen.best.split),
            "schedule": chosen.best.schedule, "splits_solved": chosen.explored, "rest_pruned": chosen.pruned}


def joint_row(model, device, pipeline, time_limit: float) -> dict:
    """The joint model's answer, bound and gap in `time_limit`, hinted with the even split's 1F1B
    (with two chunks, its `greedy`)."""
    from zbopt.core.simulation import simulate
    from zbopt.planning.planner import split_by_rule, split_problem
    from zbopt.planning.planner.joint_model import joint_search
    from zbopt.schedules import generate

    even = split_by_rule("even", model, pipeline)
    problem = split_problem(model, device, pipeline, even)
    began = time.perf_counter()
    hint = (even, simulate(problem, generate("1f1b" if pipeline.chunks_per_device == 1 else "greedy", problem)))
    answer = joint_search(model, device, pipeline, time_limit, hint=hint)
    makespan = None if answer.simulation is None or not answer.simulation.valid else answer.simulation.makespan
    return {"joint_model_ms": makespan, "joint_model_bound_ms": answer.lower_bound_ms,
            "joint_model_gap": None if makespan is None else 1 - answer.lower_bound_ms / makespan,
            "joint_model_s": time.perf_counter() - began}


def split_costs(samples: int = 10) -> list[dict]:
    """What one split costs to look at, per step, averaged over the first `samples` splits the
    family ranks (32-layer model, 4 devices, v = 1 and 2, m = 16): its Problem, every heuristic
    simulated, the quick lower bounds, and one step of the family's CP-SAT (the next split)."""
    from zbopt.core.simulation import simulate
    from zbopt.planning.planner.certify import SplitFamily
    from zbopt.planning.planner.split import split_problem
    from zbopt.schedules import applicable
    from zbopt.solvers import lower_bounds

    model, device = load_model(EXAMPLES / "model_layers.yaml")
    rows = []
    for pipeline in (Pipeline(4, 1, "loop", 16), Pipeline(4, 2, "v", 16)):
        family, times = SplitFamily(model, device, pipeline), {"problem": 0.0, "heuristics": 0.0, "bounds": 0.0,
                                                               "family step": 0.0}
        for _ in range(samples):
            began = time.perf_counter()
            split, _ = family.next_split(5.0)
            family.exclude(split)
            times["family step"] += time.perf_counter() - began
            began = time.perf_counter()
            problem = split_problem(model, device, pipeline, split)
            times["problem"] += time.perf_counter() - began
            began = time.perf_counter()
            for _, schedule in applicable(problem):
                simulate(problem, schedule)
            times["heuristics"] += time.perf_counter() - began
            began = time.perf_counter()
            lower_bounds(problem, time.perf_counter() + 5.0)
            times["bounds"] += time.perf_counter() - began
        row = {"pipeline": f"p4 v{pipeline.chunks_per_device} m16",
               **{key: value / samples for key, value in times.items()}}
        print(f"{row['pipeline']:12} " + "  ".join(f"{key} {value * 1000:8.1f} ms" for key, value in row.items()
                                                   if key != "pipeline"))
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--rows", help="comma-separated case names (default: all)")
    parser.add_argument("--joint", action="store_true", help="also the joint CP-SAT model, for the same time")
    parser.add_argument("--no-split-costs", action="store_true")
    args = parser.parse_args()
    wanted = None if args.rows is None else set(args.rows.split(","))
    rows = []
    print(f"{'case':26} {'even':>9} {'joint':>9} {'shorter':>8} {'bound':>9} {'gap':>7} {'s':>6} solved pruned")
    for name, model, device, pipeline in cases():
        if wanted is not None and name not in wanted:
            continue
        row = measure(name, model, device, pipeline, args.time_limit)
        rows.append(row)
        if "error" in row:
            print(f"{name:26} {row['error']}")
            continue
        shorter = "-" if row["shorter"] is None else f"{row['shorter']:.1%}"
        even = "-" if row["even_best_ms"] is None else f"{row['even_best_ms']:.1f}"
        print(f"{name:26} {even:>9} {row['joint_ms']:9.1f} {shorter:>8} {row['lower_bound_ms']:9.1f} "
              f"{row['gap']:7.2%} {row['seconds']:6.1f} {row['splits_solved']:6} {row['rest_pruned']}", flush=True)
        if args.joint:
            row.update(joint_row(model, device, pipeline, args.time_limit))
            found = "-" if row["joint_model_ms"] is None else f"{row['joint_model_ms']:.1f}"
            gap = "-" if row["joint_model_gap"] is None else f"{row['joint_model_gap']:.2%}"
            print(f"{'  joint CP-SAT model':26} {'':>9} {found:>9} {'':>8} {row['joint_model_bound_ms']:9.1f} "
                  f"{gap:>7} {row['joint_model_s']:6.1f}", flush=True)
    costs = []
    if not args.no_split_costs:
        print("\ncost per split (mean of the first 10 the family ranks):")
        costs = split_costs()
    write_results("bench_plan" + ("_joint" if args.joint else ""), time_limit=args.time_limit, rows=rows,
                  split_costs=costs)


if __name__ == "__main__":
    main()
