"""The exact optimizer as a mixed-integer program through PuLP (CBC or HiGHS): a backend of `solve`.

The disjunctive big-M model of the Zero Bubble paper's Appendix G, built from the same op DAG as
the CP-SAT model:
  - start time S_i >= head_i per op, makespan C >= S_i + d_i (or per-device spans);
  - precedences S_j >= S_i + d_i + latency;
  - one binary x_ik per pair of ops on a device ("i runs before k"), with
        S_k >= S_i + d_i - M (1 - x_ik)   and   S_i >= S_k + d_k - M x_ik,
    fixed where the implied graph (DAG, symmetry breaking, memory precedences) orders the pair;
  - memory: a device's level when forward k starts depends only on which of its ops run before
    k, so  M_B(k) + sum_i x_ik · delta_i <= limit  is linear in the binaries; and the memory
    disjunctions (`implied.memory_disjunctions`) as cuts x_(B,F) + x_(W,F) >= 1;
  - the iteration's ends (`_ends_rows`): a reduction per stage on its device's stream, the step,
    the objective at least every step's end (FSDP's gathered memory is refused).
Times are the problem's own floats (no ticks); the MILP's tolerances state its resolution.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import networkx as nx

from zbopt.core.kinds import FORWARD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import unshard_windows
from zbopt.solvers.answer import objective_value, start_times
from zbopt.solvers.implied import heads_and_tails, implied_graph, memory_disjunctions
from zbopt.solvers.task import Found, SearchTask, simple_model_refusal

__all__ = ["DEADLINE_GRACE_S", "ENGINES", "MIN_SEARCH_S", "RESOLUTION", "build_model", "refusal", "search"]

ENGINES = ("cbc", "highs")
DEADLINE_GRACE_S = 2.0  # past the deadline the child is killed: its solver had its own limit, this covers start-up
MIN_SEARCH_S = 0.1  # the least time a solver is given, even past the deadline (it needs one to answer)
RESOLUTION = 1e-6  # feasibility tolerance of CBC and HiGHS, in the problem's units


def _ordered_before(graph: nx.DiGraph) -> set[tuple[Op, Op]]:
    """Pairs (a, b) on one device where a must precede b through the implied graph (the DAG, the
    symmetry breaking and the memory precedences, safe as in the CP-SAT model)."""
    closure = nx.transitive_closure_dag(graph)
    return {(a, b) for a, b in closure.edges if graph.nodes[a]["device"] == graph.nodes[b]["device"]}


def refusal(problem: Problem) -> str | None:
    """Why the MILP cannot take `problem`: it keeps every activation, and of the iteration's ends
    it leaves out FSDP's gathered memory."""
    return simple_model_refusal(problem, "the MILP", ends=True)


def search(problem: Problem, task: SearchTask, *, engine: str = "highs") -> Found:
    """Build and solve the MILP (see the module docstring) with CBC or HiGHS until the deadline.

    The MILP is built and solved in a child process: PuLP imports highspy, and highspy and OR-Tools
    each ship their own HiGHS library; whichever loads second into a process fails to resolve its
    symbols. So PuLP never enters the caller's process, which may use CP-SAT. The child runs in a
    session of its own, so a terminal's Ctrl-C reaches only the caller; stopping (Ctrl-C, or the
    deadline passed by more than DEADLINE_GRACE_S) kills the child and the CBC it started. The
    answer then has no schedule (the MILP solvers keep their incumbent to themselves). The second
    phase (lowering the peak memory) is CP-SAT's only: here it finds nothing.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}")
    if task.peak_cap is not None:
        return Found("unknown", None, 0.0, None, RESOLUTION)
    warm = None
    if task.warm is not None:
        warm = (start_times(task.warm), task.warm.makespan,
                objective_value(task.warm, task.objective))
    arguments = dict(engine=engine, deadline=time.time() + task.remaining(), workers=task.workers,
                     objective=task.objective, independent_bound=task.independent_bound, warm=warm)
    stop = threading.Event()
    task.on_stop(stop.set)
    answer = _run_child(problem, arguments, stop, task.deadline + DEADLINE_GRACE_S)
    if answer is None:
        return Found("unknown", None, 0.0, None, RESOLUTION)
    status, starts, goal = answer
    tolerance = RESOLUTION * max(1.0, task.independent_bound)
    return Found(status, starts, 0.0, goal, RESOLUTION, error_bound=RESOLUTION, tolerance=tolerance)


def _run_child(problem: Problem, arguments: dict, stop: threading.Event, kill_at: float):
    """`_solve_in_child(problem, **arguments)` in a fresh interpreter in its own session, through
    files (no `__main__` re-import, so scripts need no guard); None when stopped or killed at
    `kill_at` (`time.perf_counter()`)."""
    with tempfile.TemporaryDirectory(prefix="zbopt-milp-") as folder:
        given, answer, errors = (Path(folder) / name for name in ("given.pickle", "answer.pickle", "stderr.txt"))
        given.write_bytes(pickle.dumps((problem, arguments)))
        command = [sys.executable, "-c", f"from zbopt.solvers.milp import _child_main; _child_main({str(folder)!r})"]
        with open(errors, "wb") as stderr:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                     start_new_session=True, env={**os.environ, "TMPDIR": folder})  # PuLP's files too
        try:
            while child.poll() is None:
                if stop.wait(0.1) or time.perf_counter() > kill_at:
                    return None
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)  # the child and the CBC it started
                child.wait()
        if child.returncode != 0:
            raise RuntimeError(f"the MILP child failed (exit {child.returncode}): {errors.read_text()[-2000:]}")
        return pickle.loads(answer.read_bytes())


def _child_main(folder: str) -> None:
    """The child's side of `_run_child`: read the problem, solve, write the answer."""
    problem, arguments = pickle.loads((Path(folder) / "given.pickle").read_bytes())
    (Path(folder) / "answer.pickle").write_bytes(pickle.dumps(_solve_in_child(problem, **arguments)))


def _solve_in_child(problem: Problem, *, engine: str, deadline: float, workers: int, objective: str,
                    independent_bound: float, warm) -> tuple[str, dict[Op, float] | None, float | None]:
    """(status, start times, objective value) of the MILP, solved in this process (a child of
    `search`) until `deadline` (wall clock, `time.time()`: the child's start-up and model building
    count too). `warm`: (start of every op, makespan, objective value) of the warm start, or None.
    The status is read from the solver's own solution status, not PuLP's "Optimal", which PuLP
    also reports after a time limit."""
    import pulp

    graph = implied_graph(problem)
    heads, tails = heads_and_tails(graph)
    ends = problem.iteration_ends
    end_work = 0.0 if ends is None else problem.iterations * ends.time
    everything_in_a_row = (sum(d["duration"] for _, d in graph.nodes(data=True))
                           + sum(d["latency"] for *_, d in graph.edges(data=True)) + end_work)
    # with the ends, a better iteration may have a longer makespan: every op ends by the warm start's iteration
    iteration = ends is not None and objective == "makespan"
    horizon = everything_in_a_row if warm is None else warm[2] if iteration else warm[1]
    model, start, before, goal = build_model(problem, graph, heads, tails, horizon, independent_bound, objective)
    if warm is not None:
        warm_starts, _, warm_value = warm
        for op, variable in start.items():
            variable.setInitialValue(warm_starts[op])
        goal.setInitialValue(warm_value)
        for (first, second), x in before.items():
            if isinstance(x, pulp.LpVariable):
                x.setInitialValue(1 if warm_starts[first] < warm_starts[second] else 0)
    seconds = max(MIN_SEARCH_S, deadline - time.time())
    if engine == "cbc":
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=seconds, threads=workers, gapRel=1e-7,
                                    warmStart=warm is not None)
    else:
        solver = pulp.HiGHS(msg=False, timeLimit=seconds, threads=workers, gapRel=1e-7)
    model.solve(solver)
    status = {pulp.LpSolutionOptimal: "optimal", pulp.LpSolutionIntegerFeasible: "feasible",
              pulp.LpSolutionInfeasible: "infeasible"}.get(model.sol_status, "unknown")
    if status not in ("optimal", "feasible"):
        return status, None, None
    return status, {op: variable.value() for op, variable in start.items()}, goal.value()


def build_model(problem: Problem, graph: nx.DiGraph, heads: dict, tails: dict, horizon: float,
                independent_bound: float, objective: str):
    """The disjunctive MILP: (model, start variables, "runs before" terms, objective variable)."""
    import pulp

    model = pulp.LpProblem("zbopt", pulp.LpMinimize)
    ops = list(graph)
    duration = {op: graph.nodes[op]["duration"] for op in ops}
    slack = RESOLUTION * max(1.0, horizon)  # float heads and warm-start times may differ by a rounding
    start = {op: pulp.LpVariable(f"S_{op}", max(0.0, heads[op] - slack), horizon - duration[op] + slack)
             for op in ops}
    goal = pulp.LpVariable(objective, independent_bound - slack, horizon + slack)
    model += goal
    for source, target, data in graph.edges(data=True):
        model += start[target] >= start[source] + duration[source] + data["latency"]
    before = _runs_before(model, problem, graph, start, duration, horizon)
    if problem.memory_limit is not None:
        _memory_rows(model, problem, ops, before)
    _objective_rows(model, problem, ops, start, duration, tails, goal, objective, horizon)
    if problem.iteration_ends is not None:
        _ends_rows(model, problem, ops, start, duration, goal, horizon, objective)
    return model, start, before, goal


def _runs_before(model, problem: Problem, graph: nx.DiGraph, start: dict, duration: dict,
                 horizon: float) -> dict[tuple[Op, Op], object]:
    """(i, k) -> 1, 0 or a binary: i runs before k, for each pair of ops on a device; fixed where
    the implied graph orders the pair, else a big-M disjunction."""
    import pulp

    fixed = _ordered_before(graph)
    before: dict[tuple[Op, Op], object] = {}
    for stages in problem.stages_of_device:
        mine = sorted(op for op in graph if op.stage in stages)
        for index, first in enumerate(mine):
            for second in mine[index + 1:]:
                if (first, second) in fixed:
                    before[first, second], before[second, first] = 1, 0
                    model += start[second] >= start[first] + duration[first]
                elif (second, first) in fixed:
                    before[first, second], before[second, first] = 0, 1
                    model += start[first] >= start[second] + duration[second]
                else:
                    x = pulp.LpVariable(f"x_{first}_{second}", cat="Binary")
                    before[first, second], before[second, first] = x, 1 - x
                    model += start[second] >= start[first] + duration[first] - horizon * (1 - x)
                    model += start[first] >= start[second] + duration[second] - horizon * x
    return before


def _memory_rows(model, problem: Problem, ops: list[Op], before: dict) -> None:
    """The memory level when each forward starts within its device's limit, and the memory
    disjunctions as cuts."""
    import pulp

    for device, stages in enumerate(problem.stages_of_device):
        mine = [op for op in ops if op.stage in stages]
        for forward in (op for op in mine if op.kind == FORWARD):
            level = problem.memory_delta(FORWARD, forward.stage, microbatch=forward.microbatch) + pulp.lpSum(
                before[other, forward] * problem.memory_delta(*other[:2], microbatch=other.microbatch)
                for other in mine if other != forward)
            model += level <= problem.memory_limit[device]
    for backward, weight, forward in memory_disjunctions(problem, ops):
        ended = before[backward, forward] + before[weight, forward]
        if not isinstance(ended, int):  # both fixed: the implied graph settled it
            model += ended >= 1


def _objective_rows(model, problem: Problem, ops: list[Op], start: dict, duration: dict, tails: dict, goal,
                    objective: str, horizon: float) -> None:
    """The objective variable at least the makespan (every op without a tail ends before it) or
    every device's span."""
    import pulp

    if objective == "makespan":
        for op in ops:
            if tails[op] == 0:
                model += goal >= start[op] + duration[op]
        return
    for device, stages in enumerate(problem.stages_of_device):
        first = pulp.LpVariable(f"first_{device}", 0, horizon)
        for op in ops:
            if op.stage in stages:
                model += first <= start[op]
                model += goal >= start[op] + duration[op] - first


def _ends_rows(model, problem: Problem, ops: list[Op], start: dict, duration: dict, goal, horizon: float,
               objective: str) -> None:
    """The iteration's ends as the simulator times them (`zbopt.core.simulation.ends`): a forward
    after its stage's unshard (after its device's step before, in a later iteration); per device
    and iteration a reduction R_s per stage after its gradient ops and the device's unshards, one
    at a time on the device's stream (a big-M disjunction per pair), and the step after the
    device's compute and reductions. On the makespan objective (the iteration time) the goal is
    at least every last step's end; the span objective measures the devices' compute only, so
    the last iteration's reductions and steps are left out."""
    import pulp

    ends, m = problem.iteration_ends, problem.num_microbatches
    through = [end for _, end in unshard_windows(problem)]  # per stage, after its device's step before
    for device, stages in enumerate(problem.stages_of_device):
        done = 0.0  # the step's end before this iteration
        for iteration in range(problem.iterations):
            mine = [op for op in ops if op.stage in stages and op.microbatch // m == iteration]
            for op in mine:
                if op.kind == FORWARD and (iteration or through[op.stage]):  # after its unshard
                    model += start[op] >= done + through[op.stage]
            if iteration == problem.iterations - 1 and objective != "makespan":
                break
            reduce = {stage: pulp.LpVariable(f"R_{stage}_{iteration}", 0, horizon) for stage in stages}
            step = pulp.LpVariable(f"step_{device}_{iteration}", 0, horizon)
            for op in mine:
                # implied through the precedences to a gradient op, but stated: along those chains the
                # solver's row tolerance adds up (the model's goal came out 4e-5 below the simulated one)
                model += step >= start[op] + duration[op]
                if op.kind == problem.gradient_kind:
                    model += reduce[op.stage] >= start[op] + duration[op]
            for index, first in enumerate(stages):
                model += reduce[first] >= done + through[stages[-1]]
                model += step >= reduce[first] + ends.reduce_times[first]
                for second in stages[index + 1:]:
                    y = pulp.LpVariable(f"y_{first}_{second}_{iteration}", cat="Binary")
                    model += reduce[second] >= reduce[first] + ends.reduce_times[first] - horizon * (1 - y)
                    model += reduce[first] >= reduce[second] + ends.reduce_times[second] - horizon * y
            done = step + ends.step_times[device]
        else:  # every iteration timed: the makespan objective
            model += goal >= done

