"""Which MILP: the disjunctive big-M model (zbopt's) or a time-indexed one? Prints a table and
writes benchmarks/results/bench_milp_models.json.

The time-indexed model needs integer durations: one binary per op and start tick, so its size
grows with the horizon in ticks. It is built here only to measure it, on the issue's unit-cost
instances with known optima (F=B=W=1, c=0, M_B=1, M_W=0.5), both models with HiGHS and CBC and
the best heuristic's makespan as horizon. Run it in its own process: it imports PuLP (see milp.py).

    x[o, t] = 1 iff op o starts at tick t;   sum_t x[o, t] = 1
    device d, tick t:   sum of x[o, t'] over its ops o and t - d_o < t' <= t   <= 1
    precedence i -> j:  sum_t t x[j, t] >= sum_t t x[i, t] + d_i + latency
    memory at tick t:   sum over F started by t of M_B  -  sum over B, W ended by t of their release  <= limit
    makespan >= sum_t t x[o, t] + d_o

Usage: python benchmarks/bench_milp_models.py [--time-limit S]
"""

from __future__ import annotations

import argparse
import time

import pulp
from record import write_results

from zbopt import Problem, op_graph
from zbopt.core.kinds import FORWARD
from zbopt.solvers import solve
from zbopt.solvers.warm import best_heuristic

CASES = [(4, 8, 4, 27), (4, 8, 2, 41), (8, 16, 8, 55), (8, 16, 4, 79)]  # p, m, memory, known optimum


def time_indexed_model(problem: Problem, horizon: int) -> pulp.LpProblem:
    """The time-indexed MILP above, for integer costs and latency, over ticks 0..horizon."""
    graph = op_graph(problem)
    model = pulp.LpProblem("time_indexed", pulp.LpMinimize)
    duration = {op: int(graph.nodes[op]["duration"]) for op in graph}
    ticks = {op: range(horizon - duration[op] + 1) for op in graph}
    x = {(op, t): pulp.LpVariable(f"x_{op}_{t}", cat="Binary") for op in graph for t in ticks[op]}
    begin = {op: pulp.lpSum(t * x[op, t] for t in ticks[op]) for op in graph}
    makespan = pulp.LpVariable("makespan", 0, horizon)
    model += makespan
    for op in graph:
        model += pulp.lpSum(x[op, t] for t in ticks[op]) == 1
        model += makespan >= begin[op] + duration[op]
    for source, target, data in graph.edges(data=True):
        model += begin[target] >= begin[source] + duration[source] + int(data["latency"])
    # started[o, t] = sum of x[o, s] for s <= t, as a running sum (two terms per tick, not t)
    started = {}
    for op in graph:
        total = 0
        for t in range(horizon + 1):
            if t in ticks[op]:
                total = pulp.LpVariable(f"started_{op}_{t}", 0, 1)
                model += total == (started[op, t - 1] if t else 0) + x[op, t]
            started[op, t] = total
    for device, stages in enumerate(problem.stages_of_device):
        mine = [op for op in graph if op.stage in stages]
        for t in range(horizon):
            model += pulp.lpSum(x[op, s] for op in mine for s in range(max(0, t - duration[op] + 1), t + 1)
                                if s in ticks[op]) <= 1
            if problem.memory_limit is not None:
                level = pulp.lpSum(problem.memory_delta(op.kind, op.stage)
                                   * (started[op, t] if op.kind == FORWARD else started[op, t - duration[op]])
                                   for op in mine if op.kind == FORWARD or t >= duration[op])
                model += level <= problem.memory_limit[device]
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    rows = []
    print(f"{'case':<18} {'optimum':>7} {'model':<14} {'solver':<6} {'status':<9} {'value':>6} {'binaries':>8} "
          f"{'time s':>7}", flush=True)
    for p, m, memory, optimum in CASES:
        problem = Problem(num_devices=p, num_microbatches=m, forward_times=1, backward_times=1, weight_times=1,
                          weight_memory=0.5, memory_limit=memory)
        label = f"p={p} m={m} mem={memory}"
        horizon = round(best_heuristic(problem)[1].makespan)  # both models start from this upper bound
        for backend in ("highs", "cbc"):
            result = solve(problem, backend, time_limit=args.time_limit)
            rows.append(dict(case=label, optimum=optimum, model="disjunctive", solver=backend, status=result.status,
                             value=result.objective, binaries=None, solve_time_s=result.solve_time_s))
            began = time.perf_counter()
            model = time_indexed_model(problem, horizon)
            engine = (pulp.HiGHS(msg=False, timeLimit=args.time_limit, threads=2) if backend == "highs"
                      else pulp.PULP_CBC_CMD(msg=False, timeLimit=args.time_limit, threads=2))
            model.solve(engine)
            status = {pulp.LpSolutionOptimal: "optimal", pulp.LpSolutionIntegerFeasible: "feasible"}.get(
                model.sol_status, "unknown")
            binaries = sum(variable.cat == pulp.LpInteger for variable in model.variables())
            rows.append(dict(case=label, optimum=optimum, model="time-indexed", solver=backend, status=status,
                             value=pulp.value(model.objective), binaries=binaries,
                             solve_time_s=time.perf_counter() - began))
            for row in rows[-2:]:
                value = "-" if row["value"] is None else f"{row['value']:.0f}"
                binaries = "" if row["binaries"] is None else row["binaries"]
                print(f"{label:<18} {optimum:>7} {row['model']:<14} {backend:<6} {row['status']:<9} {value:>6} "
                      f"{binaries:>8} {row['solve_time_s']:>7.1f}", flush=True)
    write_results("bench_milp_models", time_limit_s=args.time_limit, rows=rows)


if __name__ == "__main__":
    main()
