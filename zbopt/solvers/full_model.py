"""The full CP-SAT model of the problem: every op, choice and memory lifetime in one constraint program.

A backend's model (`cpsat.search` runs it, then LNS on large problems), built in named steps like
OR-Tools' job-shop example, with one `OpVars` record (start, end, interval) per op:
  1. one fixed-size interval per op, its start bounded by its head and tail;
  2. no overlap on a device; with overlapped pairs (`Problem.overlap_times`), an optional interval
     per candidate pair (`overlap_pairs`), each member alone or in exactly one chosen pair;
  3. precedences with latency, and the weight-update barrier between iterations;
  4. memory (`model_memory`): per device a cumulative over activation lifetimes (from F's start
     to the end of each op that frees part of it, by `Problem.memory_delta`), or a reservoir of
     the same allocations and releases; with recomputation or offload allowed, a choice per stage
     and microbatch: kept (those lifetimes), recomputed (an optional R interval after F and before
     B, the checkpoint held from F's start to R's, the activation from R's start) or offloaded
     (optional O and L intervals on the device's copy lanes, F -> O -> L -> B, the activation held
     from F's start to O's end and from L's start);
  5. symmetry breaking: ops of one kind on one stage run in microbatch order (safe: see Notes),
     and with it the memory precedences and disjunctions it implies (`implied.memory_precedences`,
     `implied.memory_disjunctions`): redundant given the memory constraint, but they let the solver
     prove memory-bound optima; with recomputation, offload or pairs allowed, only each route's
     first stage's forwards (see `implied.symmetric_successors`);
  6. objective: the makespan (or the longest device span) with the independent lower bound; in
     the driver's second phase, the highest peak memory with the objective capped;
  7. with the iteration's ends (`model_ends`): per device and iteration its reductions and
     optimizer step, a later iteration's forwards after the step, FSDP's gathered parameters and,
     where it may pay, a stage's re-gather (G) per iteration; the makespan objective is then the
     last step's end.

Notes
-----
Symmetry breaking is safe because microbatches are identical: in any valid schedule, relabel the
ops of each (kind, stage) so that their microbatch numbers follow their start times. Every edge
type links column (kind, stage) to another with one constant delay (duration + latency), and for
any pairing a_j <= b_j the sorted values also satisfy a_(k) <= b_(k); so every dependency still
holds, and memory, which counts started and finished ops per column, is unchanged (so is the peak).
Within an iteration only, when iterations are separated by a flush. Once some activations may be
recomputed or offloaded, microbatches differ in the memory they hold, and relabelling one column
apart could pair a recomputed (or offloaded) forward with a kept backward; relabelling whole
microbatches (their choice travels with them) is still a symmetry, and orders the first stage's
forwards. So with overlapped pairs: an FBW pair's B and W must be one microbatch's, and sorting
the B and W columns apart could split them (a W deferred past a later microbatch's paired W).
With the bidirectional placement microbatches are identical within a route: the same holds per
route.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import networkx as nx
from ortools.sat.python import cp_model

from zbopt.core.dag import op_graph
from zbopt.core.errors import ZboptError
from zbopt.core.kinds import OFFLOAD, RECOMPUTE, RELOAD, WEIGHT
from zbopt.core.ops import Op, op_table
from zbopt.core.problem import Problem
from zbopt.core.simulation import simulate
from zbopt.core.ticks import TickScale, ceil_ticks, gradients_wait, tick_problem, tick_scale
from zbopt.solvers.answer import objective_value, start_times
from zbopt.solvers.cp_parts import OpVars, limit, solve_stoppable, task_stopped
from zbopt.solvers.implied import heads_and_tails, implied_graph, memory_disjunctions
from zbopt.solvers.model_ends import fsdp_lifetimes, placed_ends
from zbopt.solvers.model_memory import activation_choice_literals, limited_lifetimes, peak_memory
from zbopt.solvers.overlap_pairs import PairChoice, as_paired, candidate_window, least_duration, pair_choices
from zbopt.solvers.task import Found, SearchTask

__all__ = ["MEMORY_MODELS", "refusal", "search"]

MEMORY_MODELS = ("cumulative", "reservoir")
_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
           cp_model.MODEL_INVALID: "unknown", cp_model.UNKNOWN: "unknown"}


@dataclass(frozen=True)
class _Frame:
    """What the model is built from: the problem in integer ticks, its graph (3. and 5. as edges)
    with heads and tails, the horizon, and the warm start's starts and objective in ticks (None
    without a warm start)."""

    scale: TickScale
    integral: Problem
    graph: nx.DiGraph
    heads: dict[Op, float]
    tails: dict[Op, float]
    ops: list[Op]  # the problem's own, in table order (not the optional R, O and L)
    horizon: int
    hint: dict[Op, int] | None
    warm_goal: int | None


class _Progress(cp_model.CpSolverSolutionCallback):
    """Hands each new incumbent and the solver's bound (problem units) to the driver's live line,
    and keeps the incumbent's schedule in `task.kept`: where CP-SAT does not stop in time
    after its deadline (its LP worker, on long runs) the driver leaves the search behind and
    answers with that, not with the warm start (a 600 s run at p = 4, m = 16 lost its answer so)."""

    def __init__(self, task: SearchTask, scale: TickScale, read):
        super().__init__()
        self.task, self.scale, self.read = task, scale, read

    def on_solution_callback(self) -> None:
        units = self.scale.units
        self.task.kept["incumbent"] = self.read(self, "feasible", 0.0)
        self.task.report(units(self.ObjectiveValue()), units(self.BestObjectiveBound()) - self.scale.error_bound)


def refusal(problem: Problem) -> str | None:
    """Why this backend cannot model `problem`, or None."""
    if problem.pairs is not None and problem.mechanisms_matter:
        return "overlapped pairs together with recomputation or offload are not in its model"
    return None


def search(problem: Problem, task: SearchTask, *, memory_model: str = "cumulative",
           symmetry_breaking: bool = True, pair_window: int | None = None) -> Found:
    """Build the model (see the module docstring) in integer ticks and solve it until the deadline.

    memory_model : "cumulative" or "reservoir".
    symmetry_breaking : order ops of one kind and stage by microbatch, with the memory precedences
        that follow (see Notes).
    pair_window : with overlapped pairs (`Problem.overlap_times`), the candidate pairs: a forward
        and a backward on one device whose microbatches are at most this far apart in their
        stages' microbatch order. Default: every pair while they number at most
        `overlap_pairs.MAX_PAIR_CANDIDATES`, else the stages a microbatch visits (then the candidates grow as m
        times the window rather than m squared). A window that leaves pairs out makes the model
        a restriction: its answers stand, but it proves nothing (no bound, never "optimal").
    """
    _check_options(problem, memory_model, pair_window)
    solver = cp_model.CpSolver()
    task.on_stop(solver.StopSearch)  # the driver's stop at once; `solve_stoppable`'s watcher also polls
    frame = _frame(problem, task, symmetry_breaking)
    if task.remaining() <= 0:  # the graph took all the time (a model too large): no model, the hint stands
        return _hinted_only(task, frame.scale)
    integral, horizon = frame.integral, frame.horizon
    model = cp_model.CpModel()
    ops = _intervals(model, frame, task.objective == "makespan")  # 1.
    pairs: list[PairChoice] = []  # candidate overlapped pairs, each run as one op when its literal holds
    restricted = False  # some pairs left out: the model proves nothing about the problem
    if integral.pairs is not None:  # 2. (the pairs)
        window, restricted = candidate_window(integral, pair_window)
        pairs, members = pair_choices(model, integral, ops, horizon, window)
        ops.update(members)
    choices = None  # per stage and microbatch, kept, recomputed or offloaded, where memory can make it pay
    if problem.mechanisms_matter:  # 4. (the choices)
        choices, optional = activation_choice_literals(model, integral, ops, horizon)
        ops.update(optional)
    _no_overlap(model, problem, ops, pairs)  # 2.
    _precedences(model, frame.graph, ops, pairs)  # 3. (and 5.: the symmetry-breaking and memory precedences)
    memory_counts = problem.memory_limit is not None or task.peak_cap is not None  # a limit, or the second phase
    placed = None  # 7. (per device and iteration, its optimizer step's end; per stage, its reduction's)
    if integral.iteration_ends is not None:
        placed = placed_ends(model, integral, ops, horizon, memory_counts)
    lifetimes, regathers = None, {}  # 4. (where memory counts; 7.'s re-gathers)
    if memory_counts:
        gathered, regathers = fsdp_lifetimes(model, integral, ops, horizon, placed)
        lifetimes = limited_lifetimes(model, problem, frame.ops, ops, horizon, choices, memory_model, gathered)
    if symmetry_breaking:  # 5. (the memory disjunctions; the precedences are edges of the implied graph)
        _memory_disjunctions(model, problem, frame.ops, ops)
    goal = _objective(model, task, frame, ops)  # 6.
    if placed is not None and task.objective == "makespan":  # 7. (the iteration ends with the last step)
        for device_steps in placed.steps_done:
            model.Add(goal >= device_steps[-1])
    _minimise(model, task, frame, goal, lifetimes)
    chosen = _optional_literals(choices, regathers)
    if frame.hint is not None:
        _hint(model, frame.hint, ops, chosen, pairs, task)
    if task.stopped.is_set():  # stopped before the search: the hint is its incumbent
        return _hinted_only(task, frame.scale)
    return _solve(solver, model, task, frame.scale, ops, chosen, pairs, goal, restricted)


def _check_options(problem: Problem, memory_model: str, pair_window: int | None) -> None:
    if memory_model not in MEMORY_MODELS:
        raise ValueError(f"memory_model must be one of {MEMORY_MODELS}")
    if pair_window is not None and (isinstance(pair_window, bool) or not isinstance(pair_window, int)
                                    or pair_window < 0):
        raise ZboptError(f"pair_window {pair_window!r}: expected a whole number >= 0")
    if pair_window is not None and problem.pairs is None:
        raise ZboptError("pair_window applies to overlapped pairs: the problem gives no overlap_times")


def _frame(problem: Problem, task: SearchTask, symmetry_breaking: bool) -> _Frame:
    """The problem in ticks, its graph, heads and tails, the horizon (everything in a row: always
    feasible; or the warm start's makespan) and the warm start's hint."""
    scale = tick_scale(problem)
    integral = tick_problem(problem, scale)
    table = op_table(integral)
    graph = implied_graph(integral) if symmetry_breaking else op_graph(integral)
    heads, tails = heads_and_tails(as_paired(graph, integral) if integral.pairs is not None else graph)
    # without a limit a recompute only adds work and an offload saves nothing
    optional = [RECOMPUTE] * problem.recomputation_matters + [OFFLOAD, RELOAD] * problem.offload_matters
    optional_work = sum(integral.cost(kind, stage, microbatch) for kind in optional
                        for stage in range(integral.num_stages) for microbatch in integral.microbatches_of(stage))
    ends = integral.iteration_ends
    regathers = sum(ends.unshard_times) if integral.reshard_matters else 0  # at most one per stage and iteration
    end_work = 0 if ends is None else integral.iterations * (ends.time + regathers)
    horizon = int(sum(table.duration) + sum(table.latency) + optional_work + end_work)
    hint = warm_goal = None
    if task.warm is not None:
        hint, warm_goal, ticked = _warm_hint(problem, integral, scale, task)
        if ticked and task.objective == "makespan":
            horizon = warm_goal
    return _Frame(scale, integral, graph, heads, tails, table.ops(), horizon, hint, warm_goal)


def _warm_hint(problem: Problem, integral: Problem, scale: TickScale,
               task: SearchTask) -> tuple[dict[Op, int], int, bool]:
    """(start of every op, objective, whether they are the order's own times in ticks) of the warm
    start: its own times where memory decides them (a wait for memory, or which copy goes first
    on a shared link, is not in its order; timed as soon as possible, it may break the limit: the
    horizon stays whole), else its order re-timed in ticks (which may cap the horizon)."""
    warm = task.warm
    if problem.mechanisms_matter or gradients_wait(problem) or warm.table.recomputed or warm.table.offloaded or \
            warm.table.regathered:
        hint = {op: scale.ticks(time) for op, time in start_times(warm).items()}
        rounding = 0 if scale.exact else math.ceil(scale.error_bound * scale.ticks_per_unit)
        return hint, scale.ticks(objective_value(warm, task.objective)) + rounding, False
    hinted = simulate(integral.replace(comm_slowdown=1.0), warm.schedule.without_times())  # the model's durations
    hint = {op: round(hinted.times_of(op)[0]) for op in hinted.table.ops()}
    goal = round(objective_value(hinted, task.objective))
    return hint, goal, True


def _intervals(model, frame: _Frame, makespan_goal: bool) -> dict[Op, OpVars]:
    """1. One fixed-size interval per op, its start between its head and the horizon less its
    least duration and (for the makespan) its tail."""
    integral, heads, horizon = frame.integral, frame.heads, frame.horizon
    table = op_table(integral)
    ops = {}
    for index, op in enumerate(frame.ops):
        size = int(table.duration[index])
        latest = horizon - least_duration(integral, op) - (int(frame.tails[op]) if makespan_goal else 0)
        start = model.NewIntVar(int(heads[op]), max(int(heads[op]), latest), f"start_{op}")
        ops[op] = OpVars(start, start + size, model.NewFixedSizeIntervalVar(start, size, f"op_{op}"))
    return ops


def _no_overlap(model, problem: Problem, ops: dict[Op, OpVars], pairs: list[PairChoice]) -> None:
    """2. No overlap per device, and per copy lane (shared by a pair of devices with a shared host link)."""
    lanes: dict[tuple, list] = {}  # ("compute", device) or (copy kind, host link) -> its intervals
    for op, variables in ops.items():
        device = problem.device_of(op.stage)
        key = (op.kind, problem.host_link(device)) if op.kind in (OFFLOAD, RELOAD) else ("compute", device)
        lanes.setdefault(key, []).append(variables.interval)
    for pair in pairs:
        lanes[("compute", problem.device_of(pair.members[0].stage))].append(pair.interval)
    for intervals in lanes.values():
        model.AddNoOverlap(intervals)


def _precedences(model, graph: nx.DiGraph, ops: dict[Op, OpVars], pairs: list[PairChoice]) -> None:
    """3. Every edge of the graph with its latency (the iteration barriers and, with symmetry
    breaking, 5.'s precedences among them); a B and its W in one chosen pair start together."""
    whole_backward = {pair.members[1]: pair.whole_backward for pair in pairs if pair.whole_backward is not None}
    for source, target, data in graph.edges(data=True):
        precedence = model.Add(ops[target].start >= ops[source].end + int(data["latency"]))
        if source in whole_backward and target.kind == WEIGHT and target.microbatch == source.microbatch:
            precedence.OnlyEnforceIf(whole_backward[source].Not())  # else B and W are one pair's


def _memory_disjunctions(model, problem: Problem, table_ops: list[Op], ops: dict[Op, OpVars]) -> None:
    """5. Of a B and an older W, one has ended before the forward starts (`implied.memory_disjunctions`)."""
    for backward, weight, forward in memory_disjunctions(problem, table_ops):
        backward_ended = model.NewBoolVar(f"ended_{backward}_{forward}")
        model.Add(ops[forward].start >= ops[backward].end).OnlyEnforceIf(backward_ended)
        model.Add(ops[forward].start >= ops[weight].end).OnlyEnforceIf(backward_ended.Not())


def _objective(model, task: SearchTask, frame: _Frame, ops: dict[Op, OpVars]):
    """6. The makespan (end of every op without a tail) or the longest device span, as one variable."""
    horizon = frame.horizon
    goal = model.NewIntVar(min(ceil_ticks(task.independent_bound, frame.scale), horizon), horizon, task.objective)
    if task.objective == "makespan":
        for op in frame.ops:
            if frame.tails[op] == 0:
                model.Add(goal >= ops[op].end)
        return goal
    for device, stages in enumerate(frame.integral.stages_of_device):
        mine = [op for op in frame.ops if op.stage in stages]
        first = model.NewIntVar(0, horizon, f"first_{device}")
        last = model.NewIntVar(0, horizon, f"last_{device}")
        model.AddMinEquality(first, [ops[op].start for op in mine])
        model.AddMaxEquality(last, [ops[op].end for op in mine])
        model.Add(goal >= last - first)
    return goal


def _minimise(model, task: SearchTask, frame: _Frame, goal, lifetimes) -> None:
    """6. The objective; in the driver's second phase, the least peak memory with the objective at
    most the warm start's."""
    if task.peak_cap is None:
        model.Minimize(goal)
        return
    model.Add(goal <= frame.warm_goal)
    model.Minimize(peak_memory(model, lifetimes))


def _optional_literals(choices, regathers: dict[Op, object]) -> dict[Op, object]:
    """Each optional op's literal: an R, O and L by its activation's `Choice`, a G its own."""
    chosen = dict(regathers)
    for (stage, microbatch), choice in (choices or {}).items():
        for literal, kinds in ((choice.recomputed, (RECOMPUTE,)), (choice.offloaded, (OFFLOAD, RELOAD))):
            if literal is not None:
                chosen.update((Op(kind, stage, microbatch), literal) for kind in kinds)
    return chosen


def _hint(model, hint: dict[Op, int], ops: dict[Op, OpVars], chosen: dict[Op, object], pairs: list[PairChoice],
          task: SearchTask) -> None:
    """The warm start as the search's first incumbent: its starts, its recomputes, offloads and
    re-gathers, its pairs."""
    for op, value in hint.items():
        if op in ops:
            model.AddHint(ops[op].start, value)
    for op, literal in chosen.items():
        if op.kind != RELOAD:  # one hint per literal: an offload's O and L share theirs
            model.AddHint(literal, op in hint)
    warm_pairs = set(task.warm.schedule.pairs)
    for pair in pairs:
        model.AddHint(pair.chosen, pair.members in warm_pairs)


def _solve(solver: cp_model.CpSolver, model, task: SearchTask, scale: TickScale, ops: dict[Op, OpVars],
           chosen: dict[Op, object], pairs: list[PairChoice], goal, restricted: bool) -> Found:
    """Solve until the deadline (or a stop) and read the answer in problem units."""
    limit(solver, task.remaining(), task.workers, task.seed)
    if task.peak_cap is not None:  # the second phase stops on work done, so one worker and a seed repeat
        solver.parameters.max_deterministic_time = max(0.01, task.remaining())
    if task.peak_cap is None:
        solver.best_bound_callback = lambda bound: task.report(None, scale.units(bound) - scale.error_bound)
    read = partial(_answer, scale=scale, ops=ops, chosen=chosen, pairs=pairs, goal=goal)
    code = solve_stoppable(solver, model, _Progress(task, scale, read) if task.peak_cap is None else None,
                           stop_when=task_stopped(task))
    status = _STATUS[code]
    if restricted:
        status = {"optimal": "feasible", "infeasible": "unknown"}.get(status, status)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if task.stopped.is_set():
            return _hinted_only(task, scale)
        return Found(status, None, _proved(solver, task, scale, status, restricted), None, scale.resolution,
                     error_bound=scale.error_bound, exact=scale.exact)
    return read(solver, status, _proved(solver, task, scale, status, restricted))


def _proved(solver: cp_model.CpSolver, task: SearchTask, scale: TickScale, status: str, restricted: bool) -> float:
    """CP-SAT's bound on the objective (problem units, the rounding taken off), where it is one."""
    proves = task.peak_cap is None and status != "infeasible" and not restricted
    return scale.units(solver.BestObjectiveBound()) - scale.error_bound if proves else 0.0


def _answer(source, status: str, bound: float, *, scale: TickScale, ops: dict[Op, OpVars],
            chosen: dict[Op, object], pairs: list[PairChoice], goal) -> Found:
    """The schedule `source` holds (the solver after its search, or the callback on a solution):
    every op but the optional ones (`chosen`) the model left out."""
    starts = {op: scale.units(source.Value(variables.start)) for op, variables in ops.items()
              if op not in chosen or source.BooleanValue(chosen[op])}
    return Found(pairs=tuple(pair.members for pair in pairs if source.BooleanValue(pair.chosen)), status=status,
                 starts=starts, bound=bound, modelled=scale.units(source.Value(goal)), resolution=scale.resolution,
                 error_bound=scale.error_bound, exact=scale.exact)


def _hinted_only(task: SearchTask, scale: TickScale) -> Found:
    """The answer of a search stopped before it found a schedule of its own: the warm start it was
    hinted with (its incumbent from the start), nothing proven."""
    starts = None if task.warm is None else start_times(task.warm)
    return Found("feasible" if starts else "unknown", starts, 0.0, None, scale.resolution,
                 error_bound=scale.error_bound, exact=scale.exact,
                 pairs=() if task.warm is None else task.warm.schedule.pairs)
