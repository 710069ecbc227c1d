"""Independent reference computations the tests compare zbopt against.

They share no code with zbopt's simulator: times come from networkx shortest paths with negated
weights, memory from a brute-force scan of every op.
"""

from __future__ import annotations

import functools
import random
from itertools import pairwise

import networkx as nx
from hypothesis import strategies as st

from zbopt import Op, Problem, Schedule, op_graph

SOURCE = "source"


def longest_path_starts(problem: Problem, schedule: Schedule) -> dict[Op, float]:
    """Earliest start of each op given the device orders: the longest path from a source in the op
    DAG plus one edge between consecutive ops of each device (weight = duration + latency)."""
    graph = op_graph(problem)
    timed = nx.DiGraph()
    for u, v, data in graph.edges(data=True):
        timed.add_edge(u, v, weight=-(graph.nodes[u]["duration"] + data["latency"]))
    for order in schedule.orders:
        for u, v in pairwise(order):
            weight = -graph.nodes[u]["duration"]
            if timed.has_edge(u, v):
                weight = min(weight, timed[u][v]["weight"])
            timed.add_edge(u, v, weight=weight)
    for node in graph.nodes:
        timed.add_edge(SOURCE, node, weight=0.0)
    distance = nx.single_source_bellman_ford_path_length(timed, SOURCE)
    return {node: -distance[node] for node in graph.nodes}


def brute_force_peak_memory(problem: Problem, schedule: Schedule, start: dict[Op, float]) -> list[float]:
    """Per device, the most memory held at any F start (the only moments memory rises), counting
    every op one by one: F holds from its start, B/W/BW release at their ends."""
    peaks = []
    for order in schedule.orders:
        ends = {op: start[op] + problem.cost(op.kind, op.stage) for op in order}
        peak = 0.0
        for moment in (start[op] for op in order if op.kind == "F"):
            level = sum(
                problem.memory_delta(op.kind, op.stage)
                for op in order
                if (op.kind == "F" and start[op] <= moment) or (op.kind != "F" and ends[op] <= moment)
            )
            peak = max(peak, level)
        peaks.append(peak)
    return peaks


def order_peak_memory(problem: Problem, schedule: Schedule) -> list[float]:
    """Per device, the most memory its order ever holds, counted op by op along the order from the
    documented memory model (no times needed: one compute lane runs the order, so every earlier op
    has ended when the next starts): F takes M_B (only the checkpoint when the schedule recomputes
    that activation), R the rest, B frees M_B - M_W and W frees M_W (split), BW frees M_B. Not for
    schedules with copies (O, L), which run beside compute."""
    recomputed = {(op.stage, op.microbatch) for order in schedule.orders for op in order if op.kind == "R"}
    peaks = []
    for order in schedule.orders:
        held = peak = 0.0
        for op in order:
            activation = problem.activation_memory[op.stage]
            kept = problem.weight_memory[op.stage] if problem.split_backward else 0.0
            checkpoint = problem.checkpoint_memory[op.stage] if recomputed else 0.0
            if op.kind in "OL":
                raise ValueError(f"{op}: copies run beside compute; count them in time")
            held += {"F": checkpoint if (op.stage, op.microbatch) in recomputed else activation,
                     "R": activation - checkpoint, "B": -(activation - kept), "W": -kept, "BW": -activation}[op.kind]
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def _per_device(problem: Problem, activations) -> list[float]:
    """Per device d, `activations(d)` activations of its largest stage."""
    return [activations(d) * max(problem.activation_memory[s] for s in problem.stages_of_device[d])
            for d in range(problem.num_devices)]


def _everything(problem: Problem) -> list[float]:
    return [problem.num_microbatches * sum(problem.activation_memory[s] for s in stages)
            for stages in problem.stages_of_device]


def _in_flight(count, across_iterations: bool = False):
    """v = 1: device d holds `count(p, d)` activations of its stage, at most every microbatch of an
    iteration (of all iterations, for a schedule that streams them without flushes)."""
    def peaks(problem: Problem) -> list[float]:
        most = problem.total_microbatches if across_iterations else problem.num_microbatches
        return [min(count(problem.num_devices, d), most) * problem.activation_memory[d]
                for d in range(problem.num_devices)]
    return peaks


def _torch_group(problem: Problem) -> int:
    """torch 2.13's microbatches_per_round (ScheduleInterleaved1F1B): m over max(1, m // p) rounds."""
    return problem.num_microbatches // max(1, problem.num_microbatches // problem.num_devices)


# Peak memory per device from the papers: (exact, per-device value), exact False for an upper bound.
# GPipe (Huang et al., 2019, sec. 2.2) and breadth-first looped (Lamy-Poirier, 2023) run every forward
# of an iteration before its backwards: m activations of every stage. 1F1B (PipeDream-Flush, Narayanan
# et al., SC 2021, sec. 2.2) has p - d warm-up-plus-one forwards in flight on device d; eager 1F1B
# 2(p - d) - 1 (its 2(p - d - 1) warm-up forwards plus one); PipeDream-2BW (Narayanan et al., ICML
# 2021) the same across iterations. Zero Bubble (Qi et al., ICLR 2024, sec. 3 and Table 5's memory
# column): ZB-H1 p·M_B, ZB-H2 (2p - 1)·M_B, ZB-1p p·M_B and ZB-2p 2p·M_B with M_B the largest stage's.
# V shapes (Qi et al., ICLR 2024, sec. 6; Controllable Memory, NeurIPS 2024, Table 1): ZB-V / V-ZB 2p
# chunk activations (1F1B's p·M_B), V-Min 2·floor((p + 4)/3), V-Half 2·floor((p + 2)/2). Megatron's
# interleaved 1F1B (Narayanan et al., SC 2021, sec. 2.2): 2(p - d - 1) + (v - 1)p warm-up chunk
# forwards plus one, at most all m·v; p is torch's group (`_torch_group`) when p does not divide m.
PAPER_PEAKS = {
    "gpipe": (True, _everything),
    "looped-bfs": (True, _everything),
    "1f1b": (True, _in_flight(lambda p, d: p - d)),
    "block-1f1b": (False, _in_flight(lambda p, d: p - d)),  # its block at uneven costs may hold fewer
    "eager-1f1b": (True, _in_flight(lambda p, d: 2 * (p - d) - 1)),
    "1f1b-2bw": (True, _in_flight(lambda p, d: p - d, across_iterations=True)),
    "eager-1f1b-2bw": (True, _in_flight(lambda p, d: 2 * (p - d) - 1, across_iterations=True)),
    "zb-h1": (False, lambda problem: _per_device(problem, lambda d: problem.num_devices)),
    "block-zb-h1": (False, lambda problem: _per_device(problem, lambda d: problem.num_devices)),
    "zb-h2": (False, lambda problem: _per_device(problem, lambda d: 2 * problem.num_devices - 1)),
    "zb-1p": (False, lambda problem: [problem.num_devices * max(problem.activation_memory)] * problem.num_devices),
    "zb-2p": (False, lambda problem: [2 * problem.num_devices * max(problem.activation_memory)] * problem.num_devices),
    "zb-v": (False, lambda problem: _per_device(problem, lambda d: 2 * problem.num_devices)),
    "torch-zbv": (False, lambda problem: _per_device(problem, lambda d: 2 * problem.num_devices)),
    "v-zb": (False, lambda problem: _per_device(problem, lambda d: 2 * problem.num_devices)),
    "block-v-zb": (False, lambda problem: _per_device(problem, lambda d: 2 * problem.num_devices)),
    "v-min": (False, lambda problem: _per_device(problem, lambda d: 2 * ((problem.num_devices + 4) // 3))),
    "block-v-min": (False, lambda problem: _per_device(problem, lambda d: 2 * ((problem.num_devices + 4) // 3))),
    "v-half": (False, lambda problem: _per_device(problem, lambda d: 2 * ((problem.num_devices + 2) // 2))),
    "v-half-squeezed": (False, lambda problem: _per_device(problem, lambda d: 2 * ((problem.num_devices + 2) // 2))),
    "block-v-half": (False, lambda problem: _per_device(problem, lambda d: 2 * ((problem.num_devices + 2) // 2))),
    "interleaved-1f1b": (False, lambda problem: _per_device(problem, lambda d: min(
        2 * (problem.num_devices - d - 1) + (problem.chunks_per_device - 1) * _torch_group(problem) + 1,
        problem.num_microbatches * problem.chunks_per_device))),
}


def assert_paper_peak(name: str, problem: Problem, peaks) -> None:
    """`peaks` (a simulation's per-device peak memory) equal, or stay within, PAPER_PEAKS[name]."""
    exact, expected = PAPER_PEAKS[name]
    want = expected(problem)
    if exact:
        assert all(abs(peak - value) <= 1e-9 for peak, value in zip(peaks, want, strict=True)), (name, peaks, want)
    else:
        assert all(peak <= value + 1e-9 for peak, value in zip(peaks, want, strict=True)), (name, peaks, want)


def random_topological_schedule(problem: Problem, seed: int, microbatch_order: bool = False) -> Schedule:
    """A valid (deadlock-free) schedule: a random topological order of the DAG, split by device.
    With `microbatch_order`, ops of one kind and stage also run in microbatch order (within an
    iteration when iterations are separated by a flush)."""
    graph = op_graph(problem)
    if microbatch_order:
        m = problem.num_microbatches
        for op in list(graph.nodes):
            following = Op(op.kind, op.stage, op.microbatch + 1)
            if following in graph and (not problem.flush or following.microbatch % m):
                graph.add_edge(op, following)
    rng = random.Random(seed)
    indegree = {node: graph.in_degree(node) for node in graph.nodes}
    ready = [node for node, degree in indegree.items() if degree == 0]
    orders: list[list[Op]] = [[] for _ in range(problem.num_devices)]
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        orders[graph.nodes[node]["device"]].append(node)
        for successor in graph.successors(node):
            indegree[successor] -= 1
            if indegree[successor] == 0:
                ready.append(successor)
    return Schedule(orders)


costs = st.floats(min_value=0.1, max_value=5.0, allow_nan=False).map(lambda x: round(x, 3))


@st.composite
def problems(draw, max_devices=5, max_microbatches=8, chunks=(1,), iterations=(1,), memory=False, recompute=False):
    """Random small problems: heterogeneous costs, latency, split or fused, any placement; with
    `recompute`, recomputation allowed or not (random checkpoints and recompute costs)."""
    p = draw(st.integers(1, max_devices))
    v = draw(st.sampled_from(chunks))
    stages = p * v
    split = draw(st.booleans())
    activation = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=stages, max_size=stages))
    parameters = dict(
        num_devices=p,
        num_microbatches=draw(st.integers(1, max_microbatches)),
        chunks_per_device=v,
        placement=draw(st.sampled_from(["loop", "v"])),
        forward_times=draw(st.lists(costs, min_size=stages, max_size=stages)),
        backward_times=draw(st.lists(costs, min_size=stages, max_size=stages)),
        p2p_time=draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])),
        activation_memory=activation,
        iterations=draw(st.sampled_from(iterations)),
    )
    if split:
        parameters["weight_times"] = draw(st.lists(costs, min_size=stages, max_size=stages))
        parameters["weight_memory"] = [a * draw(st.sampled_from([0.0, 0.3, 1.0])) for a in activation]
    if recompute and draw(st.booleans()):
        parameters["allow_recompute"] = True
        parameters["checkpoint_memory"] = [a * draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])) for a in activation]
        parameters["recompute_times"] = draw(st.lists(costs, min_size=stages, max_size=stages))
    return Problem(**parameters)


def device_linear_extensions(problem: Problem, device: int, recomputed=()) -> list[list[Op]]:
    """Every order of one device's ops (with R of each (stage, microbatch) in `recomputed`, after
    its F and before its backward) that respects the dependencies among them."""
    graph = op_graph(problem)
    for stage, microbatch in recomputed:
        recompute = Op("R", stage, microbatch)
        graph.add_node(recompute, device=problem.device_of(stage))
        graph.add_edge(Op("F", stage, microbatch), recompute)
        graph.add_edge(recompute, Op(problem.kinds[1], stage, microbatch))
    mine = [op for op in graph if graph.nodes[op]["device"] == device]
    closure = nx.transitive_closure_dag(graph)
    before = {op: {other for other in mine if closure.has_edge(other, op)} for op in mine}
    orders: list[list[Op]] = []

    def extend(prefix: list[Op], left: set[Op]) -> None:
        if not left:
            orders.append(list(prefix))
            return
        for op in sorted(left):
            if not (before[op] & left):
                prefix.append(op)
                extend(prefix, left - {op})
                prefix.pop()

    extend([], set(mine))
    return orders


def _valid_simulations(problem: Problem):
    """Every combination of per-device orders that runs (deadlocks skipped) within the memory
    limit, timed as early as possible, for every choice of recomputed activations when allowed.
    That loses nothing: a device's memory level after each of its events depends only on its
    order, not on the times."""
    import itertools

    from zbopt import DeadlockError, simulate

    activations = list(itertools.product(range(problem.num_stages), range(problem.total_microbatches)))
    choices = [()]
    if problem.allow_recompute:
        choices = [chosen for size in range(len(activations) + 1)
                   for chosen in itertools.combinations(activations, size)]
    for recomputed in choices:
        extensions = [device_linear_extensions(problem, d, recomputed) for d in range(problem.num_devices)]
        for orders in itertools.product(*extensions):
            try:
                result = simulate(problem, Schedule(orders))
            except DeadlockError:
                continue
            if result.valid:
                yield result


@functools.cache
def brute_force_optimum(problem: Problem) -> float:
    """The least makespan (the iteration time, where the problem has the iteration's ends: ASAP
    times end every op, so every reduction and step, no later) over every valid combination of
    per-device orders (kept per problem: several test modules ask for the same tiny problems)."""
    return min((result.iteration_time for result in _valid_simulations(problem)), default=float("inf"))


def brute_force_least_peak(problem: Problem, makespan: float) -> float:
    """The least highest peak memory over every valid schedule with at most `makespan`."""
    return min(max(result.peak_memory) for result in _valid_simulations(problem)
               if result.makespan <= makespan + 1e-9)


def mechanism_schedules() -> set[str]:
    """Names of the registered schedules that recompute or offload (their schedules hold R, O or
    L ops, which torch's formats cannot express), found by generating every schedule with both
    mechanisms allowed."""
    from zbopt.schedules import generate_applicable

    names = set()
    for chunks in (1, 2):
        problem = Problem(num_devices=4, num_microbatches=8, chunks_per_device=chunks, weight_times=1,
                          allow_recompute=True, checkpoint_memory=0.1, allow_offload=True, offload_times=0.1)
        names |= {name for name, schedule in generate_applicable(problem)[0].items()
                  if any(op.kind in "ROL" for order in schedule.orders for op in order)}
    return names


def timed_search_optimum(problem: Problem) -> float:
    """The least makespan over every schedule in which each activation is kept, recomputed or
    offloaded (as the problem allows), found by trying, at every moment something ends, every
    way of starting ready ops on the free lanes (one op per device's compute lane and per copy
    lane; a shared host link is one copy lane per pair of devices) within the memory limit.

    Exact for integer costs and latency: in a schedule with the least starts for its order of
    events, every op starts at 0 or when some op ends (plus latency), the only moments tried.
    Independent of zbopt's simulator and op table: lanes, dependencies and memory are spelled out
    here from the problem's documented semantics. For tiny problems only."""
    import itertools
    import math

    graph = op_graph(problem)
    stages, microbatches = problem.num_stages, problem.total_microbatches
    activations = list(itertools.product(range(stages), range(microbatches)))
    ways = ["keep"] + (["R"] if problem.allow_recompute else []) + (["O"] if problem.allow_offload else [])
    limits = [math.inf] * problem.num_devices if problem.memory_limit is None else list(problem.memory_limit)
    backward = problem.kinds[1]
    best = math.inf

    def link(device):
        return device // 2 if problem.shared_host_link else device

    for choice in itertools.product(ways, repeat=len(activations)):
        way = dict(zip(activations, choice, strict=True))
        needs = {op: [(pred, data["latency"]) for pred, _, data in graph.in_edges(op, data=True)] for op in graph}
        lane = {op: ("compute", graph.nodes[op]["device"]) for op in graph}
        cost = {op: graph.nodes[op]["duration"] for op in graph}
        grows = {op: 0.0 for op in graph}  # memory taken at the start
        frees = {op: 0.0 for op in graph}  # memory given back at the end
        for (stage, microbatch), how in way.items():
            device = problem.device_of(stage)
            activation = problem.memory_delta("F", stage, microbatch=microbatch)  # each microbatch's own
            checkpoint = problem.memory_delta("F", stage, recomputed=True, microbatch=microbatch) \
                if problem.allow_recompute else 0.0
            forward = Op("F", stage, microbatch)
            gradient = Op(backward, stage, microbatch)
            grows[forward] = activation
            if problem.split_backward:
                kept = -problem.memory_delta("W", stage, microbatch=microbatch)
                frees[gradient], frees[Op("W", stage, microbatch)] = activation - kept, kept
            else:
                frees[gradient] = activation
            if how == "R":
                recompute = Op("R", stage, microbatch)
                grows[forward] = checkpoint
                grows[recompute], frees[recompute] = activation - checkpoint, 0.0
                lane[recompute], cost[recompute] = ("compute", device), problem.cost("R", stage, microbatch)
                needs[recompute] = [(forward, 0.0)]
                needs[gradient] = needs[gradient] + [(recompute, 0.0)]
            elif how == "O":
                offload, reload = Op("O", stage, microbatch), Op("L", stage, microbatch)
                grows[offload], frees[offload] = 0.0, activation
                grows[reload], frees[reload] = activation, 0.0
                lane[offload], cost[offload] = ("out", link(device)), problem.cost("O", stage, microbatch)
                lane[reload], cost[reload] = ("in", link(device)), problem.cost("L", stage, microbatch)
                needs[offload], needs[reload] = [(forward, 0.0)], [(offload, 0.0)]
                needs[gradient] = needs[gradient] + [(reload, 0.0)]
        device_of = {op: problem.device_of(op.stage) for op in cost}
        work = [sum(cost[op] for op in cost if lane[op][0] == "compute" and device_of[op] == d)
                for d in range(problem.num_devices)]
        best = min(best, _search_in_time(cost, needs, lane, grows, frees, device_of, limits, work, best))
    return best


def _search_in_time(cost, needs, lane, grows, frees, device_of, limits, work, best):
    """The least makespan below `best` (else `best`) for fixed choices: see `timed_search_optimum`."""
    import itertools

    ops = sorted(cost)
    seen = set()

    def visit(now, end, lane_free, left_work, best):
        if len(end) == len(ops):
            return min(best, max(end.values()))
        if now + max(left_work) >= best:
            return best
        # what matters from here: which ops started, and how long until the recent ones (or their
        # latency) are over
        horizon = max((latency for links in needs.values() for _, latency in links), default=0.0)
        key = (now, frozenset(end), frozenset((op, e - now) for op, e in end.items() if e > now - horizon))
        if key in seen:
            return best
        seen.add(key)
        level = [0.0] * len(limits)
        for op, e in end.items():
            level[device_of[op]] += grows[op] - (frees[op] if e <= now else 0.0)
        ready = {}
        for op in ops:
            if op not in end and lane_free.get(lane[op], 0.0) <= now and \
                    all(pred in end and end[pred] + latency <= now for pred, latency in needs[op]):
                ready.setdefault(lane[op], []).append(op)
        lanes = list(ready)
        for picks in itertools.product(*[ready[key] + [None] for key in lanes]):
            started = [op for op in picks if op is not None]
            taken = list(level)
            for op in started:
                taken[device_of[op]] += grows[op]
            if any(taken[d] > limits[d] + 1e-9 for d in range(len(limits))):
                continue
            new_end = dict(end)
            new_free = dict(lane_free)
            new_left = list(left_work)
            for op in started:
                new_end[op] = new_free[lane[op]] = now + cost[op]
                if lane[op][0] == "compute":
                    new_left[device_of[op]] -= cost[op]
            moments = {e + latency for op in ops for pred, latency in needs[op] if (e := new_end.get(pred)) is not None}
            moments |= set(new_end.values())
            later = [moment for moment in moments if moment > now]
            if not later and len(new_end) < len(ops):
                continue
            best = visit(min(later) if later else now, new_end, new_free, new_left, best)
        return best

    return visit(0.0, {}, {}, list(work), best)


def assert_cpsat_proves(problem: Problem, expected: float) -> None:
    """CP-SAT proves `expected` (an independent search's optimum) optimal, its lower bound below it."""
    from zbopt import solve

    result = solve(problem, time_limit=20, lower_peak=False)
    assert result.status == "optimal"
    assert abs(result.objective - expected) <= 1e-9 * max(1.0, expected), (result.objective, expected)
    assert result.lower_bound <= expected + 1e-9


def timed_search_with_gradients(problem: Problem) -> float:
    """The least iteration time of a one-iteration problem whose ends are reductions, steps and
    gradients held until their reduction (`gradient_memory`; no unshards, no recomputation or
    offload), over every timed schedule within the memory limit, waits included: at every moment
    something ends, every way of starting ready ops on the free compute lanes. Spelled out from the
    documented semantics: a stage's gradients are taken when its first gradient op (W, or BW)
    starts and given back when its reduction ends; each device's stream runs its reductions one
    at a time, each once its stage's last gradient op has ended, earliest ready first (the lower
    stage at a tie), as soon as it can; the step follows the device's compute and reductions.

    Exact for integer costs and latency: memory rises only when an op starts, and in a schedule
    with the least starts for its order of events every op starts at 0 or when an op or a
    reduction ends (plus latency), the moments tried. For tiny problems only."""
    import itertools
    import math

    ends = problem.iteration_ends
    assert problem.iterations == 1 and not any(ends.unshard_times) and not any(ends.unshard_memory)
    assert problem.recomputation is None and problem.offload is None
    graph = op_graph(problem)
    ops = sorted(graph)
    device_of = {op: graph.nodes[op]["device"] for op in ops}
    cost = {op: graph.nodes[op]["duration"] for op in ops}
    needs = {op: [(pred, data["latency"]) for pred, _, data in graph.in_edges(op, data=True)] for op in ops}
    delta = {op: problem.memory_delta(op.kind, op.stage, microbatch=op.microbatch) for op in ops}
    gradient_ops = {stage: [op for op in ops if op.kind == problem.gradient_kind and op.stage == stage]
                    for stage in range(problem.num_stages)}
    limits = [math.inf] * problem.num_devices if problem.memory_limit is None else list(problem.memory_limit)
    latency = max((lag for links in needs.values() for _, lag in links), default=0.0)

    def reductions(end, now):
        """stage -> (start, end) of each reduction whose stage's gradient ops have all ended by `now`."""
        windows = {}
        for stages in problem.stages_of_device:
            ready = {stage: max(end[op] for op in gradient_ops[stage]) for stage in stages
                     if all(op in end and end[op] <= now for op in gradient_ops[stage])}
            free = 0.0
            for stage in sorted(ready, key=lambda s: (ready[s], s)):
                begin = max(free, ready[stage])
                windows[stage] = (begin, free := begin + ends.reduce_times[stage])
        return windows

    def level(end, now, windows):
        held = [0.0] * problem.num_devices
        for op, finish in end.items():
            held[device_of[op]] += delta[op] if (delta[op] > 0 or finish <= now) else 0.0
        for stage, gradients in enumerate(ends.gradient_memory):
            if any(op in end for op in gradient_ops[stage]) and not (stage in windows and windows[stage][1] <= now):
                held[problem.device_of(stage)] += gradients
        return held

    def iteration(end):
        windows = reductions(end, math.inf)
        return max(max([end[op] for op in ops if device_of[op] == device]
                       + [windows[stage][1] for stage in stages]) + ends.step_times[device]
                   for device, stages in enumerate(problem.stages_of_device))

    seen = set()

    def visit(now, end, best):
        if len(end) == len(ops):
            return min(best, iteration(end))
        windows = reductions(end, now)
        key = (now, frozenset(end), frozenset((op, e - now) for op, e in end.items() if e > now - latency),
               frozenset((stage, finish - now) for stage, (_, finish) in windows.items() if finish > now))
        left = [sum(cost[op] for op in ops if op not in end and device_of[op] == d) for d in range(problem.num_devices)]
        if key in seen or now + max(left) >= best:
            return best
        seen.add(key)
        held = level(end, now, windows)
        busy = {device_of[op] for op, finish in end.items() if finish > now}
        ready = {}
        for op in ops:
            if op not in end and device_of[op] not in busy and \
                    all(pred in end and end[pred] + lag <= now for pred, lag in needs[op]):
                ready.setdefault(device_of[op], []).append(op)
        for picks in itertools.product(*[[*choices, None] for choices in ready.values()]):
            started = [op for op in picks if op is not None]
            taken = list(held)
            for op in started:
                taken[device_of[op]] += max(delta[op], 0.0)
                if op.kind == problem.gradient_kind and not any(other in end for other in gradient_ops[op.stage]):
                    taken[device_of[op]] += ends.gradient_memory[op.stage]
            if any(taken[d] > limits[d] + 1e-9 for d in range(problem.num_devices)):
                continue
            new_end = {**end, **{op: now + cost[op] for op in started}}
            moments = {finish + lag for op in ops for pred, lag in needs[op]
                       if (finish := new_end.get(pred)) is not None}
            moments |= set(new_end.values()) | {finish for _, finish in reductions(new_end, math.inf).values()}
            later = [moment for moment in moments if moment > now]
            if later:
                best = visit(min(later), new_end, best)
            elif len(new_end) == len(ops):
                best = visit(now, new_end, best)
        return best

    return visit(0.0, {}, math.inf)
