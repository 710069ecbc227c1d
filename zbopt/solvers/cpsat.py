"""The exact optimizer as a constraint program (OR-Tools CP-SAT): a backend of `zbopt.solvers.solve`.

The model, built in named steps like OR-Tools' job-shop example:
  1. one fixed-size interval per op, its start bounded by its head and tail;
  2. no overlap on a device; with overlapped pairs (`Problem.overlap_times`), an optional interval
     per candidate pair (`_pair_choices`), each member alone or in exactly one chosen pair;
  3. precedences with latency, and the weight-update barrier between iterations;
  4. memory: per device a cumulative over activation lifetimes (from F's start to the end of each
     op that frees part of it, by `Problem.memory_delta`), or a reservoir of the same allocations
     and releases; with recomputation or offload allowed, a choice per stage and microbatch: kept
     (those lifetimes), recomputed (an optional R interval after F and before B, the checkpoint
     held from F's start to R's, the activation from R's start) or offloaded (optional O and L
     intervals on the device's copy lanes, F -> O -> L -> B, the activation held from F's start to
     O's end and from L's start);
  5. symmetry breaking: ops of one kind on one stage run in microbatch order (safe: see Notes),
     and with it the memory precedences and disjunctions it implies (`bounds.memory_precedences`,
     `bounds.memory_disjunctions`): redundant given the memory constraint, but they let the solver
     prove memory-bound optima; with recomputation, offload or pairs allowed, only each route's
     first stage's forwards (see `bounds.symmetric_successors`);
  6. objective: the makespan (or the longest device span) with the independent lower bound; in
     the driver's second phase, the highest peak memory with the objective capped.

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

import itertools
import math
import threading
from typing import NamedTuple

from ortools.sat.python import cp_model

from zbopt.errors import ZboptError
from zbopt.ops import Op, op_graph, op_table
from zbopt.problem import BACKWARD, FORWARD, OFFLOAD, PAIR_MEMBERS, RECOMPUTE, RELOAD, WEIGHT, Problem
from zbopt.simulation import simulate
from zbopt.solvers.api import Found, SearchTask
from zbopt.solvers.bounds import heads_and_tails, implied_graph, memory_disjunctions
from zbopt.solvers.result import objective_value, start_times
from zbopt.ticks import ceil_ticks, memory_scale, tick_problem, tick_scale

MEMORY_MODELS = ("cumulative", "reservoir")
MAX_PAIR_CANDIDATES = 20_000  # every candidate pair up to this many (p = 4, m = 32 both ways: 4,096 per kind)
STOP_POLL_S = 0.05  # how often a running solve checks for the deadline and Ctrl-C
_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
           cp_model.MODEL_INVALID: "unknown", cp_model.UNKNOWN: "unknown"}


class Lifetime(NamedTuple):
    """A part of an activation held on a device: from `allocated` to `released` (model variables),
    `amount` memory ticks, as `interval`; held only when `presence` (a literal) holds, or always
    when it is None."""

    allocated: object
    released: object
    amount: int
    interval: object
    presence: object = None


class Choice(NamedTuple):
    """How the model holds one activation: one literal per way (None where not allowed; exactly
    one holds)."""

    kept: object
    recomputed: object = None
    offloaded: object = None


class _Progress(cp_model.CpSolverSolutionCallback):
    """Hands each new incumbent and the solver's bound (problem units) to the driver's live line."""

    def __init__(self, scale, report):
        super().__init__()
        self.scale, self.report = scale, report

    def on_solution_callback(self) -> None:
        units = self.scale.units
        self.report(units(self.ObjectiveValue()), units(self.BestObjectiveBound()) - self.scale.error_bound)


def refusal(problem: Problem) -> str | None:
    """Why this backend cannot model `problem`, or None."""
    if problem.overlap_times and problem.mechanisms_matter:
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
        MAX_PAIR_CANDIDATES, else the stages a microbatch visits (then the candidates grow as m
        times the window rather than m squared). A window that leaves pairs out makes the model
        a restriction: its answers stand, but it proves nothing (no bound, never "optimal").
    """
    if memory_model not in MEMORY_MODELS:
        raise ValueError(f"memory_model must be one of {MEMORY_MODELS}")
    if pair_window is not None and (isinstance(pair_window, bool) or not isinstance(pair_window, int)
                                    or pair_window < 0):
        raise ZboptError(f"pair_window {pair_window!r}: expected a whole number >= 0")
    if pair_window is not None and not problem.overlap_times:
        raise ZboptError("pair_window applies to overlapped pairs: the problem gives no overlap_times")
    solver = cp_model.CpSolver()
    task.on_stop(solver.StopSearch)  # marks this backend stoppable; `_stop_at_deadline_or_ctrl_c` does the stopping
    scale = tick_scale(problem)
    integral = tick_problem(problem, scale)
    table = op_table(integral)
    graph = implied_graph(integral) if symmetry_breaking else op_graph(integral)  # 3. and 5. as edges
    heads, tails = heads_and_tails(_as_paired(graph, integral) if integral.overlap_times else graph)
    ops = table.ops()
    duration = table.duration
    ops_of_device = [[op for op in ops if op.stage in stages] for stages in problem.stages_of_device]
    makespan_goal = task.objective == "makespan"
    # without a limit a recompute only adds work and an offload saves nothing
    optional_work = sum(len(integral.microbatches_of(stage)) * sum(
        [*((integral.recompute_times[stage],) if problem.recomputation_matters else ()),
         *((integral.offload_times[stage], integral.reload_times[stage]) if problem.offload_matters else ())])
        for stage in range(integral.num_stages))
    horizon = int(sum(duration) + sum(table.latency) + optional_work)  # everything in a row: always feasible
    hint = warm_goal = None  # the warm start's starts and objective, in ticks
    warm_table = None if task.warm is None else task.warm.table
    if task.warm is not None and (problem.mechanisms_matter or warm_table.recomputed or warm_table.offloaded):
        # its own times: a wait for memory, or which copy goes first on a shared link, is not in
        # its order (timed as soon as possible, it may break the limit: the horizon stays whole)
        hint = {op: scale.ticks(time) for op, time in start_times(task.warm).items()}
        rounding = 0 if scale.exact else math.ceil(scale.error_bound * scale.ticks_per_unit)
        warm_goal = scale.ticks(objective_value(task.warm, task.objective)) + rounding
    elif task.warm is not None:
        hinted = simulate(integral, task.warm.schedule.without_times())
        hint = {op: round(hinted.times_of(op)[0]) for op in hinted.table.ops()}
        warm_goal = round(hinted.makespan) if makespan_goal else max(round(s) for s in hinted.span)
        if makespan_goal:
            horizon = warm_goal

    model = cp_model.CpModel()
    # 1. intervals
    start, end, interval = {}, {}, {}
    for index, op in enumerate(ops):
        size = int(duration[index])
        latest = horizon - _least_duration(integral, op) - (int(tails[op]) if makespan_goal else 0)
        start[op] = model.NewIntVar(int(heads[op]), max(int(heads[op]), latest), f"start_{op}")
        end[op] = start[op] + size
        interval[op] = model.NewFixedSizeIntervalVar(start[op], size, f"op_{op}")
    pairs = []  # candidate overlapped pairs, each run as one op when its literal holds
    restricted = False  # some pairs left out: the model proves nothing about the problem
    if integral.overlap_times:
        window, restricted = _pair_window(integral, pair_window)
        pairs = _pair_choices(model, integral, ops, start, end, interval, horizon, window)
    choices = None  # per stage and microbatch, kept, recomputed or offloaded, where memory can make it pay
    if problem.mechanisms_matter:
        choices = _activation_choices(model, integral, ops, start, end, interval, horizon)
    # 2. no overlap per device, and per copy lane (shared by a pair of devices with a shared host link)
    lanes: dict[tuple, list] = {}  # ("compute", device) or (copy kind, host link) -> its intervals
    for op, op_interval in interval.items():
        device = problem.device_of(op.stage)
        key = (op.kind, problem.host_link(device)) if op.kind in (OFFLOAD, RELOAD) else ("compute", device)
        lanes.setdefault(key, []).append(op_interval)
    for pair in pairs:
        lanes[("compute", problem.device_of(pair.members[0].stage))].append(pair.interval)
    for intervals in lanes.values():
        model.AddNoOverlap(intervals)
    # 3. precedences and iteration barriers (and 5., the symmetry-breaking and memory precedences)
    whole_backward = {pair.members[1]: pair.whole_backward for pair in pairs if pair.whole_backward is not None}
    for source, target, data in graph.edges(data=True):
        precedence = model.Add(start[target] >= end[source] + int(data["latency"]))
        if source in whole_backward and target.kind == WEIGHT and target.microbatch == source.microbatch:
            precedence.OnlyEnforceIf(whole_backward[source].Not())  # else B and W are one pair's
    # 4. memory
    lifetimes = None
    if problem.memory_limit is not None or task.peak_cap is not None:
        lifetimes = lifetime_intervals(model, problem, ops, start, end, horizon, choices=choices)
    if problem.memory_limit is not None:
        _limit_memory(model, problem, lifetimes, memory_model)
    # 5. the memory disjunctions (the precedences are edges of the implied graph)
    if symmetry_breaking:
        for backward, weight, forward in memory_disjunctions(problem, ops):
            backward_ended = model.NewBoolVar(f"ended_{backward}_{forward}")
            model.Add(start[forward] >= end[backward]).OnlyEnforceIf(backward_ended)
            model.Add(start[forward] >= end[weight]).OnlyEnforceIf(backward_ended.Not())
    # 6. objective
    goal = _objective(model, task, scale, ops, ops_of_device, start, end, tails, horizon)
    if task.peak_cap is None:
        model.Minimize(goal)
    else:  # the second phase: the warm start's objective at most, the least peak memory
        model.Add(goal <= warm_goal)
        peak = _peak(model, problem, lifetimes)
        model.Minimize(peak)
    if hint is not None:
        for op, value in hint.items():
            if op in start:
                model.AddHint(start[op], value)
        for (stage, microbatch), choice in (choices or {}).items():
            for literal, kind in ((choice.recomputed, RECOMPUTE), (choice.offloaded, OFFLOAD)):
                if literal is not None:
                    model.AddHint(literal, Op(kind, stage, microbatch) in hint)
        warm_pairs = set() if task.warm is None else set(task.warm.schedule.pairs)
        for pair in pairs:
            model.AddHint(pair.chosen, pair.members in warm_pairs)

    if task.stopped.is_set():  # stopped before the search: the hint is its incumbent
        return _hinted_only(task, scale)
    solver.parameters.max_time_in_seconds = max(0.01, task.remaining())
    if task.peak_cap is not None:  # the second phase stops on work done, so one worker and a seed repeat
        solver.parameters.max_deterministic_time = max(0.01, task.remaining())
    solver.parameters.num_workers = task.workers
    solver.parameters.random_seed = task.seed
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is the driver's: it calls StopSearch
    if task.peak_cap is None:
        solver.best_bound_callback = lambda bound: task.report(None, scale.units(bound) - scale.error_bound)
    solving = threading.Event()
    threading.Thread(target=_stop_at_deadline_or_ctrl_c, args=(solver, task, solving), daemon=True).start()
    try:
        code = solver.Solve(model, _Progress(scale, task.report) if task.peak_cap is None else None)
    finally:
        solving.set()
    status = _STATUS[code]
    if restricted:
        status = {"optimal": "feasible", "infeasible": "unknown"}.get(status, status)
    found = code in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if not found and task.stopped.is_set():
        return _hinted_only(task, scale)
    exact_objective = task.peak_cap is None
    starts = None
    if found:
        starts = {op: scale.units(solver.Value(start[op])) for op in start
                  if op.kind not in (RECOMPUTE, OFFLOAD, RELOAD) or solver.BooleanValue(_chosen(choices, op))}
    return Found(
        pairs=tuple(pair.members for pair in pairs if found and solver.BooleanValue(pair.chosen)),
        status=status,
        starts=starts,
        bound=scale.units(solver.BestObjectiveBound()) - scale.error_bound
        if exact_objective and status != "infeasible" and not restricted else 0.0,
        modelled=scale.units(solver.Value(goal)) if found else None,
        resolution=scale.resolution, error_bound=scale.error_bound, exact=scale.exact,
    )


def timed_solver(seconds: float, workers: int, seed: int) -> cp_model.CpSolver:
    """A CP-SAT solver limited to `seconds` (at least 0.01) with `workers` threads and `seed`, for
    the small models solved many times over (block search, LNS windows)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, seconds)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    return solver


def _stop_at_deadline_or_ctrl_c(solver, task: SearchTask, solved: threading.Event) -> None:
    """Until the solve ends, stop it once the deadline passes (CP-SAT's workers can run past
    max_time_in_seconds on a busy machine) or Ctrl-C came; StopSearch is repeated because it has no
    effect before Solve has started."""
    while not solved.wait(STOP_POLL_S):
        if task.stopped.is_set() or task.remaining() <= 0:
            solver.StopSearch()


def _hinted_only(task: SearchTask, scale) -> Found:
    """The answer of a search stopped before it found a schedule of its own: the warm start it was
    hinted with (its incumbent from the start), nothing proven."""
    starts = None if task.warm is None else start_times(task.warm)
    return Found("feasible" if starts else "unknown", starts, 0.0, None, scale.resolution,
                 error_bound=scale.error_bound, exact=scale.exact,
                 pairs=() if task.warm is None else task.warm.schedule.pairs)


def _objective(model, task: SearchTask, scale, ops, ops_of_device, start, end, tails, horizon: int):
    """The makespan (end of every op without a tail) or the longest device span, as one variable."""
    goal = model.NewIntVar(min(ceil_ticks(task.independent_bound, scale), horizon), horizon, task.objective)
    if task.objective == "makespan":
        for op in ops:
            if tails[op] == 0:
                model.Add(goal >= end[op])
        return goal
    for device, mine in enumerate(ops_of_device):
        first = model.NewIntVar(0, horizon, f"first_{device}")
        last = model.NewIntVar(0, horizon, f"last_{device}")
        model.AddMinEquality(first, [start[op] for op in mine])
        model.AddMaxEquality(last, [end[op] for op in mine])
        model.Add(goal >= last - first)
    return goal


def _chosen(choices: dict, op: Op):
    """The literal under which optional op `op` (an R, O or L) runs."""
    choice = choices[op.stage, op.microbatch]
    return choice.recomputed if op.kind == RECOMPUTE else choice.offloaded


def _activation_choices(model, problem: Problem, ops, start, end, interval, horizon: int) -> dict:
    """Per (stage, microbatch), its `Choice` of the ways the problem allows: recomputed, an optional
    R interval on the compute lane after F and before the input gradient; offloaded, optional O
    and L intervals on the copy lanes, F -> O -> L -> input gradient. Adds the optional ops' starts
    and intervals to `start`, `end` and `interval`."""
    backward = problem.input_gradient_kind
    choices = {}

    def optional(kind, stage, microbatch, chosen, after):
        op = Op(kind, stage, microbatch)
        size = int(problem.cost(kind, stage))
        start[op] = model.NewIntVar(0, horizon, f"start_{op}")
        end[op] = start[op] + size
        interval[op] = model.NewOptionalFixedSizeIntervalVar(start[op], size, chosen, f"op_{op}")
        model.Add(start[op] >= end[after]).OnlyEnforceIf(chosen)
        return op

    for forward in (op for op in ops if op.kind == FORWARD):
        stage, microbatch = forward.stage, forward.microbatch
        gradient = Op(backward, stage, microbatch)
        recomputed = offloaded = None
        if problem.recomputation_matters:
            recomputed = model.NewBoolVar(f"recompute_{stage}_{microbatch}")
            recompute = optional(RECOMPUTE, stage, microbatch, recomputed, forward)
            model.Add(start[gradient] >= end[recompute]).OnlyEnforceIf(recomputed)
        if problem.offload_matters:
            offloaded = model.NewBoolVar(f"offload_{stage}_{microbatch}")
            offload = optional(OFFLOAD, stage, microbatch, offloaded, forward)
            reload = optional(RELOAD, stage, microbatch, offloaded, offload)
            model.Add(start[gradient] >= end[reload]).OnlyEnforceIf(offloaded)
        ways = [literal for literal in (recomputed, offloaded) if literal is not None]
        if len(ways) == 1:
            kept = ways[0].Not()
        else:
            kept = model.NewBoolVar(f"keep_{stage}_{microbatch}")
            model.AddExactlyOne([kept, *ways])
        choices[stage, microbatch] = Choice(kept, recomputed, offloaded)
    return choices


class PairChoice(NamedTuple):
    """A candidate overlapped pair: its members (the forward first), the literal under which they
    run as one op, that op's interval, and for a pair with a whole backward (FBW, split) the
    literal under which its B is in any such pair (W then starts with B, not after it)."""

    members: tuple[Op, ...]
    chosen: object
    interval: object
    whole_backward: object = None


def _least_duration(problem: Problem, op: Op) -> int:
    """The least time `op` can take: its own cost, or less in a pair of a cheaper cost (where the
    problem has pairs, `Problem.overlap_times`)."""
    size = int(problem.cost(op.kind, op.stage))
    if op.kind not in problem.kinds or not problem.overlap_times:
        return size
    device = problem.device_of(op.stage)
    return min([size, *(int(problem.overlap_cost(kind, device)) for kind, _ in problem.overlap_times
                        if op.kind in PAIR_MEMBERS[kind, problem.split_backward])])


def _as_paired(graph, problem: Problem):
    """The graph for heads and tails where ops may pair: each op at its least duration
    (`_least_duration`), and W free to start with its B (in an FBW pair they start together)."""
    paired = graph.copy()
    for op in paired:
        paired.nodes[op]["duration"] = _least_duration(problem, op)
    whole = problem.split_backward and any(kind == "FBW" for kind, _ in problem.overlap_times)
    for source, target in paired.edges():
        if whole and source.kind == BACKWARD and target == Op(WEIGHT, source.stage, source.microbatch):
            paired.edges[source, target]["latency"] = -paired.nodes[source]["duration"]
    return paired


def _pair_window(problem: Problem, given: int | None) -> tuple[int, bool]:
    """(window, whether it leaves pairs out) for `_pair_choices`: `given`, or every pair while
    they number at most MAX_PAIR_CANDIDATES, else the stages a microbatch visits."""
    full = max(len(microbatches) for _, microbatches in problem.routes) - 1
    if given is None:
        given = full if _pair_count(problem, full) <= MAX_PAIR_CANDIDATES else problem.route_length
    return given, given < full


def _pair_count(problem: Problem, window: int) -> int:
    """How many candidate pairs `_pair_choices` makes with `window` (at most; same-microbatch ones
    are left out there)."""
    count = 0
    for stages in problem.stages_of_device:
        for forward_stage, backward_stage in itertools.product(stages, stages):
            backwards = len(problem.microbatches_of(backward_stage))
            count += sum(min(backwards, place + window + 1) - max(0, place - window)
                         for place in range(len(problem.microbatches_of(forward_stage))))
    return count * len(problem.overlap_times)


def _pair_choices(model, problem: Problem, ops, start, end, interval, horizon: int, window: int) -> list[PairChoice]:
    """The candidate overlapped pairs (`Problem.overlap_times`): on each device, a forward and a
    backward of another microbatch whose positions in their stages' microbatch order are at most
    `window` apart, for each pair kind. A member runs alone (its own interval) or in exactly one
    chosen pair (starting with it, ending when it ends): its interval becomes optional and its end
    a variable in `interval` and `end`."""
    present = set(ops)
    candidates: dict[Op, list] = {}
    pairs = []
    for device, stages in enumerate(problem.stages_of_device):
        for kind, costs in problem.overlap_times:
            cost = int(costs[device])
            kinds = PAIR_MEMBERS[kind, problem.split_backward]
            for forward_stage, backward_stage in itertools.product(stages, stages):
                forwards, backwards = problem.microbatches_of(forward_stage), problem.microbatches_of(backward_stage)
                for place, first in enumerate(forwards):
                    for other in backwards[max(0, place - window):place + window + 1]:
                        members = (Op(FORWARD, forward_stage, first),
                                   *(Op(member, backward_stage, other) for member in kinds[1:]))
                        if first == other or not set(members) <= present:
                            continue  # one microbatch's backward waits for its own forward
                        chosen = model.NewBoolVar(f"pair_{'_'.join(map(str, members))}")
                        begin = model.NewIntVar(0, horizon, f"pair_start_{'_'.join(map(str, members))}")
                        for member in members:
                            model.Add(start[member] == begin).OnlyEnforceIf(chosen)
                            candidates.setdefault(member, []).append((chosen, begin + cost))
                        pairs.append(PairChoice(members, chosen,
                                                model.NewOptionalFixedSizeIntervalVar(begin, cost, chosen,
                                                                                      f"pair_{len(pairs)}")))
    for op, options in candidates.items():
        alone = model.NewBoolVar(f"alone_{op}")
        model.AddExactlyOne([alone, *(chosen for chosen, _ in options)])
        size = int(problem.cost(op.kind, op.stage))
        finish = model.NewIntVar(0, horizon, f"end_{op}")
        model.Add(finish == start[op] + size).OnlyEnforceIf(alone)
        for chosen, pair_end in options:
            model.Add(finish == pair_end).OnlyEnforceIf(chosen)
        end[op] = finish
        interval[op] = model.NewOptionalFixedSizeIntervalVar(start[op], size, alone, f"op_{op}")
    with_weight: dict[Op, list[int]] = {}  # B -> the pairs of F, B and W it is in (its W starts with it)
    for number, pair in enumerate(pairs):
        if len(pair.members) == 3:
            with_weight.setdefault(pair.members[1], []).append(number)
    for backward, numbers in with_weight.items():
        whole = model.NewBoolVar(f"whole_{backward}")  # B is in one of them
        chosen = [pairs[number].chosen for number in numbers]
        model.AddBoolOr(chosen).OnlyEnforceIf(whole)
        for literal in chosen:
            model.AddImplication(literal, whole)
        for number in numbers:
            pairs[number] = pairs[number]._replace(whole_backward=whole)
    return pairs


def lifetime_intervals(model, problem: Problem, ops, start, end, horizon: int, amount=round,
                       choices: dict | None = None) -> list[list[Lifetime]]:
    """Per device, the `Lifetime` of every part of an activation among `ops`: F allocates its
    stage's activation, each op with a negative `Problem.memory_delta` frees its part (B and W
    when split, BW when fused). Always held, unless `choices` (from `_activation_choices`) gives
    a choice: then the kept lifetimes hold when kept; when recomputed, the checkpoint from F's
    start to R's and each part from R's start; when offloaded, the activation from F's start to
    O's end and each part from L's start. `amount` turns a memory amount in `memory_scale` units
    into a whole number (the relaxation rounds down)."""
    unit = memory_scale(problem)
    per_device: list[list[Lifetime]] = [[] for _ in range(problem.num_devices)]

    def hold(device, allocated, released, memory, name, presence=None):
        size = model.NewIntVar(0, horizon, f"held_{name}")
        if presence is None:
            life = model.NewIntervalVar(allocated, size, released, f"life_{name}")
        else:
            life = model.NewOptionalIntervalVar(allocated, size, released, presence, f"life_{name}")
        per_device[device].append(Lifetime(allocated, released, amount(memory * unit), life, presence))

    for forward in (op for op in ops if op.kind == FORWARD):
        stage, microbatch = forward.stage, forward.microbatch
        device = problem.device_of(stage)
        choice = None if choices is None else choices[stage, microbatch]
        for kind, freed in problem.releases(stage):
            release = Op(kind, stage, microbatch)
            hold(device, start[forward], end[release], freed, release, None if choice is None else choice.kept)
            if choice is not None and choice.recomputed is not None:
                hold(device, start[Op(RECOMPUTE, stage, microbatch)], end[release], freed, f"{release}_recomputed",
                     choice.recomputed)
            if choice is not None and choice.offloaded is not None:
                hold(device, start[Op(RELOAD, stage, microbatch)], end[release], freed, f"{release}_reloaded",
                     choice.offloaded)
        if choice is not None and choice.recomputed is not None:
            hold(device, start[forward], start[Op(RECOMPUTE, stage, microbatch)], problem.checkpoint_memory[stage],
                 f"checkpoint_{forward}", choice.recomputed)
        if choice is not None and choice.offloaded is not None:
            hold(device, start[forward], end[Op(OFFLOAD, stage, microbatch)], problem.activation_memory[stage],
                 f"offloading_{forward}", choice.offloaded)
    return per_device


def _limit_memory(model, problem: Problem, lifetimes, memory_model: str) -> None:
    """Per device, the activations held at any moment within its limit."""
    unit = memory_scale(problem)
    for device, held in enumerate(lifetimes):
        capacity = int(problem.memory_limit[device] * unit + 1e-6)
        if capacity >= sum(life.amount for life in held):
            continue  # the limit can never bind on this device
        if memory_model == "cumulative":
            model.AddCumulative([life.interval for life in held], [life.amount for life in held], capacity)
        else:
            times = [moment for life in held for moment in (life.allocated, life.released)]
            changes = [change for life in held for change in (life.amount, -life.amount)]
            always = model.NewConstant(1)
            active = [always if life.presence is None else life.presence for life in held for _ in range(2)]
            model.AddReservoirConstraintWithActive(times, changes, active, 0, capacity)


def _peak(model, problem: Problem, lifetimes):
    """The highest memory any device holds, as a variable bounding every device's cumulative."""
    peak = model.NewIntVar(0, max(sum(life.amount for life in held) for held in lifetimes), "peak")
    for held in lifetimes:
        model.AddCumulative([life.interval for life in held], [life.amount for life in held], peak)
    return peak
