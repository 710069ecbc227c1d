"""Lower bounds on the makespan of any valid schedule, computed apart from every solver.

Each bound is a relaxation of the scheduling problem, so each is <= the optimum; the solvers'
answers are checked against them, and `lower_bounds` gives them all and the best:

- critical path: the longest chain of dependencies and latencies (in the implied graph, `implied`);
- device load: per device, the earliest any of its ops can start + its total work + the least
  time any of its ops still needs after it ends;
- one-machine relaxation: per device, its ops on one machine with heads and tails, preemption
  allowed (`sequencing.jackson_preemptive`);
- memory: per device, the memory-time its activations must hold, over its memory limit
  (`memory_bounds.memory_bound`);
- device sequencing: per device, its ops alone on one machine, without preemption, each a
  round trip after the op before it in its microbatch's chain, within the memory limit
  (`sequencing.device_sequencing`, a dynamic program);
- device relaxation (v >= 2): one device's ops alone with everything the device sees (heads and
  tails, the round trips, memory), solved by CP-SAT (`cross_device` with one device);
- cross device: the same for two devices that a microbatch's route links, with the exact
  dependencies between them (`cross_device`): the one bound here that sees a device wait for its
  busy neighbour;
- pair count (with overlapped pairs): per device, its work less what the pairs it can form by the
  makespan save (`pair_relaxation.pair_count_bound`);
- heaviest microbatches (where they differ): the whole pipeline with only the k heaviest, by the
  full CP-SAT model (`heaviest`): large microbatches queueing behind each other on every device;
- iteration ends (where the problem has them): the reductions and steps after the pipeline
  (`ends_bound`); every other bound, on the makespan, bounds the iteration time too.

On the span objective (the longest device span) `span_bounds` gives the busiest device's work and
`span_bound.span_bound`, which reasons from heads and tails relative to a device's first and last op.

With recomputation allowed, the memory bound prices it (`memory_bounds`); the device bounds are
0 then and with the both-ways placement (see `lower_bounds`). With overlapped pairs every other
bound is that of `pair_relaxation.pair_relaxed` (every op shortened as if it paired).

Notes
-----
Heads (earliest starts) and tails (the time still needed after an op ends) come from
`implied.implied_graph`: the op DAG plus the precedences that every schedule with ops of one kind
and stage in microbatch order obeys (same-device order, and the memory precedences). Some optimal
schedule has that order (see `full_model`), so bounds computed on the implied graph still bound
the optimum.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import networkx as nx

from zbopt.core import interrupt
from zbopt.core.dag import critical_path, device_work
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.problem.mechanisms import ITERATION_END_KEYS
from zbopt.solvers.bound_records import BOUND_NAMES, Bound, LowerBounds, on_device
from zbopt.solvers.cross_device import cross_device_bound, device_groups
from zbopt.solvers.ends_bound import iteration_ends_bound, repeated_bound
from zbopt.solvers.gap import meets
from zbopt.solvers.heaviest import heaviest_microbatches_bound, selectable
from zbopt.solvers.implied import heads_and_tails, implied_graph
from zbopt.solvers.memory_bounds import activation_lifetimes, memory_bound, microbatch_memory_bound
from zbopt.solvers.pair_relaxation import pair_count_bound, pair_relaxed
from zbopt.solvers.sequencing import device_sequencing, jackson_preemptive, order_value
from zbopt.solvers.span_bound import span_bound

__all__ = ["BOUND_NAMES", "CROSS_SHARE", "GRAPH_SECONDS_PER_OP", "HEAVIEST_SHARE", "RELAXATION_MAX_S",
           "SEQUENCING_SHARE", "Bound", "LowerBounds", "lower_bounds", "span_bounds"]

RELAXATION_MAX_S = 20.0  # the device bounds' total time (v >= 2 or mechanisms), or less if the deadline says so
SEQUENCING_SHARE = 0.4  # of it, for the device sequencing dynamic program before the CP-SAT relaxations
CROSS_SHARE = 0.2  # of it, for the two-device relaxation last (it proves more on small problems only)
GRAPH_SECONDS_PER_OP = 1e-4  # building the implied graph and its heads and tails (measured: 4 s for 49k ops)
_UNKNOWN_GAIN = 0.1  # what a device whose reach is infinite (`order_value`) may gain, relative to the best bound
HEAVIEST_SHARE = 0.25  # of the device bounds' time, where microbatches differ: the heaviest microbatches first


class _GraphBounds(NamedTuple):
    """The bounds read from the implied graph's heads and tails, and each device's preemptive
    one-machine bound."""

    bounds: tuple[Bound, ...]
    preemptive: list[float]

    @property
    def best(self) -> float:
        return max(bound.value for bound in self.bounds)


def lower_bounds(problem: Problem, deadline: float = math.inf) -> LowerBounds:
    """All lower bounds of `problem` (see the module docstring) within `deadline`.

    The graph bounds cost about GRAPH_SECONDS_PER_OP per op; where that does not fit, only the
    critical path and the busiest device's work are computed (`complete` False). With one stage per
    device, every activation kept and one route, the device sequencing bound stops at the deadline,
    device by device (0 where it did not finish); with recomputation, offload or both ways, none.
    Otherwise the device bounds share the time left, at most RELAXATION_MAX_S: the sequencing
    (SEQUENCING_SHARE), then CP-SAT on each device alone, then on two linked ones (CROSS_SHARE), each
    from the best bound so far, the time going to the devices that can still raise it
    (`_share_by_gain`). With overlapped pairs, the bounds of `pair_relaxed(problem)` and the pair count.

    Parameters
    ----------
    problem : the problem bounded.
    deadline : an `interrupt.now()` moment by which the call returns (inf: every bound in full).

    Returns
    -------
    LowerBounds : the named `Bound` records (value, seconds, the device each binds on), `best`,
        `binding_bound`, and whether every bound was computed in full (`complete`).

    Examples
    --------
    p = 4, m = 8, F = 1, BW = 2: the last device cannot start before 3 and works 24, and 1F1B's
    33 meets that bound.

    >>> from zbopt import Problem
    >>> bounds = lower_bounds(Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2))
    >>> bounds.best, bounds.binding_bound.describe()
    (33.0, 'device_load on device 3')
    """
    if problem.iteration_ends is not None and any(problem.iteration_ends.gradient_memory):
        # a relaxation: no bound models the gradients held until their reduction, and the heaviest
        # microbatches' subsets may reorder the reductions (earlier ready times can end one later)
        problem = problem.replace(gradient_memory=None)
    found = _pipeline_bounds(problem, deadline)
    if problem.iteration_ends is None:
        return found
    began = interrupt.now()
    # on the makespan: every bound but the heaviest microbatches', whose full model includes the ends already
    makespan = max((bound.value for bound in found.bounds if bound.name != "heaviest_microbatches"), default=0.0)
    per_device = interrupt.deterministic() or began + problem.num_ops * GRAPH_SECONDS_PER_OP <= deadline
    relaxed, complete = pair_relaxed(problem), found.complete and per_device
    value, device = iteration_ends_bound(relaxed, makespan, per_device)
    if problem.iterations > 1 and per_device:  # several: the first stage's device cycles, then one pipeline
        bare = relaxed.replace(iterations=1, allow_reshard=False, comm_slowdown=1.0,
                               **dict.fromkeys(ITERATION_END_KEYS))
        one = _pipeline_bounds(bare, deadline)
        repeated = repeated_bound(relaxed, bare, one.best, deadline)
        complete = complete and one.complete
        if repeated > value:
            value, device = repeated, problem.device_of(0)
    ends = Bound("iteration_ends", value, interrupt.now() - began, () if device is None else (device,))
    return LowerBounds((*found.bounds, ends), complete)


def _pipeline_bounds(problem: Problem, deadline: float) -> LowerBounds:
    """The bounds on the pipeline's makespan (`lower_bounds` without the iteration's ends)."""
    original, problem = problem, pair_relaxed(problem)
    began = interrupt.now()
    # the pair count builds a graph of its own: twice the graph's time with pairs
    if not interrupt.deterministic() and \
            began + (2 if original.pairs is not None else 1) * problem.num_ops * GRAPH_SECONDS_PER_OP > deadline:
        return LowerBounds((Bound("critical_path", critical_path(problem)),
                            on_device("device_load", device_work(problem), 0.0)), complete=False)
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(graph)
    uniform = _Uniform.of(problem, graph, heads, tails)
    found = _graph_bounds(problem, graph, heads, tails, began, uniform)
    paired = _pair_count(original)
    if paired is not None:
        found = found._replace(bounds=(*found.bounds, paired))
    if selectable(original):
        began = interrupt.now()
        until = began + HEAVIEST_SHARE * (min(began + interrupt.span(RELAXATION_MAX_S), deadline) - began)
        value = heaviest_microbatches_bound(original, until, found.best)
        found = found._replace(bounds=(*found.bounds, Bound("heaviest_microbatches", value, interrupt.now() - began)))
    if problem.mechanisms_matter or problem.bidirectional:
        # the relaxations hold with the mechanisms and the bidirectional placement (`cross_device`),
        # but proved nothing above these bounds at issue 30's sizes (recomputation p = 4, m = 8,
        # limit 1.5: 491.0 either way) while costing their whole budget on small problems, where
        # CP-SAT rarely closes them
        return LowerBounds(found.bounds)
    if problem.chunks_per_device == 1:
        return _sequenced_devices(uniform.problem, uniform.heads, uniform.tails, found, deadline)
    return _device_relaxations(problem, graph, heads, tails, found, deadline, uniform)


class _Uniform(NamedTuple):
    """The problem the bounds that take interchangeable microbatches read (the memory bound's
    lifetimes and prices, the device sequencing dynamic program): the problem itself, or where
    microbatches differ its `uniform_relaxation`, whose bounds hold for it; with its implied graph,
    heads and tails."""

    problem: Problem
    graph: nx.DiGraph
    heads: dict[Op, float]
    tails: dict[Op, float]

    @classmethod
    def of(cls, problem: Problem, graph: nx.DiGraph, heads: dict[Op, float], tails: dict[Op, float]) -> _Uniform:
        if problem.microbatches_equal:
            return cls(problem, graph, heads, tails)
        relaxed = problem.uniform_relaxation()
        relaxed_graph = implied_graph(relaxed)
        return cls(relaxed, relaxed_graph, *heads_and_tails(relaxed_graph))

    def device_load(self) -> list[float]:
        """Per device, its least head + its work + its least tail (the device load bound's values)."""
        return _device_load(_device_jobs(self.problem.num_devices, self.graph, self.heads, self.tails))


def _device_jobs(devices: int, graph: nx.DiGraph, heads: dict[Op, float],
                 tails: dict[Op, float]) -> list[list[tuple[float, float, float]]]:
    """Per device, its ops as (head, duration, tail) jobs."""
    per_device: list[list[tuple[float, float, float]]] = [[] for _ in range(devices)]
    for op, data in graph.nodes(data=True):
        per_device[data["device"]].append((heads[op], data["duration"], tails[op]))
    return per_device


def _device_load(per_device: list[list[tuple[float, float, float]]]) -> list[float]:
    """Per device, its least head + its work + its least tail."""
    return [min(j[0] for j in jobs) + sum(j[1] for j in jobs) + min(j[2] for j in jobs) for jobs in per_device]


def _pair_count(problem: Problem) -> Bound | None:
    """With overlapped pairs, the bound that prices how many pairs a device can form
    (`pair_relaxation.pair_count_bound`); None without."""
    if problem.pairs is None:
        return None
    began = interrupt.now()
    return Bound("pair_count", pair_count_bound(problem), interrupt.now() - began)


def span_bounds(problem: Problem, deadline: float = math.inf) -> LowerBounds:
    """Lower bounds on the span objective (the longest device span): the busiest device's own work,
    and `span_bound.span_bound` within `deadline`, which is at least that."""
    began = interrupt.now()
    busiest = on_device("device_work", device_work(pair_relaxed(problem)), interrupt.now() - began)
    # its graph walks: a few per op; with recomputation or offload (only the first stage's forwards
    # in order) one per microbatch from each candidate first and last op
    walks = 3 * (problem.num_microbatches if problem.mechanisms_matter else 1)
    if not interrupt.deterministic() and began + walks * problem.num_ops * GRAPH_SECONDS_PER_OP > deadline:
        return LowerBounds((busiest,), complete=False)
    began = interrupt.now()
    relative = Bound("span", span_bound(problem, deadline), interrupt.now() - began)
    return LowerBounds((busiest, relative), complete=not interrupt.past(deadline))


def _graph_bounds(problem: Problem, graph: nx.DiGraph, heads: dict[Op, float], tails: dict[Op, float],
                  began: float, uniform: _Uniform) -> _GraphBounds:
    """The critical path, device load, one-machine and memory bounds (see the module docstring);
    the memory bound's lifetimes and prices on `uniform`, and where microbatches differ also
    each microbatch's own (`memory_bounds.microbatch_memory_bound`)."""
    critical = max(heads[op] + graph.nodes[op]["duration"] + tails[op] for op in graph)
    graph_done = interrupt.now()
    per_device = _device_jobs(problem.num_devices, graph, heads, tails)
    device_load = _device_load(per_device)
    load_done = interrupt.now()
    preemptive = [jackson_preemptive(jobs) for jobs in per_device]
    preemptive_done = interrupt.now()
    memory = memory_bound(uniform.problem, activation_lifetimes(uniform.problem),
                          device_load if uniform.problem is problem else uniform.device_load())
    if uniform.problem is not problem:
        memory = max(memory, microbatch_memory_bound(problem))
    return _GraphBounds((Bound("critical_path", critical, graph_done - began),
                         on_device("device_load", device_load, load_done - graph_done),
                         on_device("one_machine", preemptive, preemptive_done - load_done),
                         Bound("memory", memory, interrupt.now() - preemptive_done)), preemptive)


def _sequenced_devices(problem: Problem, heads: dict[Op, float], tails: dict[Op, float], found: _GraphBounds,
                       deadline: float) -> LowerBounds:
    """With one stage per device: the device sequencing bound, device by device until the deadline."""
    began = interrupt.now()
    sequencing, where = 0.0, ()
    complete = True
    for device in range(problem.num_devices):
        if interrupt.past(deadline):
            complete = False
            break
        value = device_sequencing(problem, device, heads, tails, max(found.best, sequencing), deadline)
        if value > sequencing:
            sequencing, where = value, (device,)
    complete = complete and not interrupt.past(deadline)
    bound = Bound("device_sequencing", sequencing, interrupt.now() - began, where)
    return LowerBounds((*found.bounds, bound), complete)


def _device_relaxations(problem: Problem, graph: nx.DiGraph, heads: dict[Op, float], tails: dict[Op, float],
                        found: _GraphBounds, deadline: float, uniform: _Uniform) -> LowerBounds:
    """The device sequencing (SEQUENCING_SHARE of the time, on `uniform`), the CP-SAT relaxation of
    each device alone, then that of two linked devices (CROSS_SHARE), sharing the time left (at
    most RELAXATION_MAX_S; see `lower_bounds`)."""
    until = min(interrupt.now() + interrupt.span(RELAXATION_MAX_S), deadline)
    # what a device's single-device bounds can reach at most: one order of its ops (`order_value`;
    # not known where microbatches differ: the CP-SAT relaxations read each one's own costs)
    reach = [order_value(uniform.problem, device, uniform.heads, uniform.tails) if not interrupt.past(until)
             else math.inf for device in range(problem.num_devices)]
    relaxation_reach = reach if uniform.problem is problem else [math.inf] * problem.num_devices
    bounds = list(found.bounds)
    complete = True

    def relaxed(devices: tuple[int, ...], best: float, seconds: float) -> float:
        return cross_device_bound(problem, devices, graph, heads, tails, seconds, floor=best)

    phases = (("device_sequencing", SEQUENCING_SHARE, reach,
               lambda device, best, seconds: device_sequencing(uniform.problem, device, uniform.heads, uniform.tails,
                                                               best, interrupt.now() + seconds)),
              ("device_relaxation", 1.0 - CROSS_SHARE / (1.0 - SEQUENCING_SHARE), relaxation_reach,
               lambda device, best, seconds: relaxed((device,), best, seconds)))
    for name, share, reaches, method in phases:
        ends = interrupt.now() + share * (until - interrupt.now())
        bound, finished = _share_by_gain(name, reaches, found.preemptive, max(bound.value for bound in bounds), ends,
                                         method)
        bounds.append(bound)
        complete = complete and finished
    bounds.append(_linked_devices(problem, found.preemptive, max(bound.value for bound in bounds), until, relaxed))
    return LowerBounds(tuple(bounds), complete)


def _linked_devices(problem: Problem, scores: list[float], best: float, until: float, relaxed) -> Bound:
    """The CP-SAT relaxation of two devices a microbatch's route links (`cross_device`), from the
    best bound so far, on the most promising pair first (`device_groups` by `scores`), each with
    the time left until `until`; where a pair proves its optimum early, the next."""
    began = interrupt.now()
    value, where = 0.0, ()
    for group in device_groups(problem, 2, scores) if problem.num_devices > 1 else []:
        seconds = until - interrupt.now()
        if seconds <= 0.01 or interrupt.requested.is_set():
            break
        found = relaxed(group, best, seconds)
        if found > value and not meets(found, best):  # it proved more than it started from
            value, where = found, group
    return Bound("cross_device", value, interrupt.now() - began, where)


def _share_by_gain(name: str, reach: list[float], preemptive: list[float], best: float, ends: float,
                   method) -> tuple[Bound, bool]:
    """(the bound, whether every device that could raise it had its whole turn) of `method(device, best,
    seconds)` run on the devices that can still raise `best` (`reach` above it), in decreasing order
    of their `preemptive` one-machine bound (which put the binding device first in every case
    measured: V shapes at V-Min's memory, the last device; interleaved, the first; where the
    reach is infinite, the earliest-start order deadlocking, it cannot rank them), each with the
    time left before `ends` in proportion to what it can gain, but at least half of it (the last
    all of it); a device done early leaves its time to the rest, and one whose reach the bound
    has meanwhile passed is skipped."""
    began = interrupt.now()
    value, where = 0.0, ()
    finished = True

    def gain(device: int) -> float:  # what the device can still add to the best bound
        return min(reach[device] - best, _UNKNOWN_GAIN * max(1.0, best))

    waiting = sorted((device for device in range(len(reach)) if not meets(reach[device], best)),
                     key=lambda device: -preemptive[device])
    while waiting:
        gains = [max(0.0, gain(device)) for device in waiting]
        device = waiting.pop(0)
        if gains[0] <= 0 or meets(reach[device], best):
            continue
        # at least half of the time left: a dynamic program cut short proves nothing at all
        seconds = (ends - interrupt.now()) * max(0.5 if waiting else 1.0, gains[0] / sum(gains))
        if seconds <= 0.01 or interrupt.requested.is_set():
            return Bound(name, value, interrupt.now() - began, where), False
        share_ends = interrupt.now() + seconds
        found = method(device, best, seconds)
        # still running when its share ran out: cut short, it may have proved less than it could
        finished = finished and not interrupt.past(share_ends)
        if found > value and not meets(found, best):  # a relaxation started from `best` proved more
            value, where = found, (device,)
        best = max(best, found)
    return Bound(name, value, interrupt.now() - began, where), finished
