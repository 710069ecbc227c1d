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
- device relaxation (v >= 2): the same single device solved by CP-SAT (`relaxation`).

With recomputation allowed, the memory bound prices it (a recomputed activation holds less for
more work, `memory_bounds`, and where a device holds one whole activation at a time,
`whole_activations_bound`), and the two single-device bounds, which assume every activation kept,
are 0 (a relaxation choosing what to recompute was tried: with 5 s per device CP-SAT proved no
more than the device's work, p = 4, m = 8, 1.5B costs). They are 0 too with the bidirectional
placement, where a microbatch visits only some of a device's stages. With overlapped pairs every
bound is that of `pair_relaxation.pair_relaxed`.

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
import time
from dataclasses import dataclass, fields
from typing import NamedTuple

import networkx as nx

from zbopt import interrupt
from zbopt.ops import Op, critical_path, device_work
from zbopt.problem import Problem
from zbopt.solvers.implied import heads_and_tails, implied_graph
from zbopt.solvers.memory_bounds import activation_lifetimes, memory_bound
from zbopt.solvers.pair_relaxation import pair_relaxed
from zbopt.solvers.relaxation import device_relaxation
from zbopt.solvers.sequencing import device_sequencing, jackson_preemptive

RELAXATION_MAX_S = 20.0  # the single-device bounds' total time (v >= 2), or less if the deadline says so
SEQUENCING_SHARE = 0.3  # of it, for the device sequencing dynamic program before the CP-SAT relaxation
GRAPH_SECONDS_PER_OP = 1e-4  # building the implied graph and its heads and tails (measured: 4 s for 49k ops)


@dataclass(frozen=True)
class LowerBounds:
    """Every bound (problem units) and the best of them. device_sequencing is 0 where it was
    skipped because it could not beat the others (see `device_sequencing`)."""

    critical_path: float
    device_load: float
    one_machine: float
    memory: float
    device_sequencing: float
    device_relaxation: float = 0.0
    complete: bool = True  # False when a deadline cut some bounds short (those report 0 or less)

    def by_name(self) -> dict[str, float]:
        """Every bound by its name (the dataclass fields but `complete`)."""
        return {item.name: getattr(self, item.name) for item in fields(self) if item.name != "complete"}

    @property
    def best(self) -> float:
        return max(self.by_name().values())

    @property
    def binding(self) -> str:
        """The name of the bound that gives `best` (the first, on a tie)."""
        values = self.by_name()
        return max(values, key=values.__getitem__)

    def as_dict(self) -> dict[str, float]:
        return {**self.by_name(), "best": self.best}


class _GraphBounds(NamedTuple):
    """The bounds read from the implied graph's heads and tails, and each device's preemptive
    one-machine bound (the order in which the single-device bounds take the devices)."""

    critical_path: float
    device_load: float
    one_machine: float
    memory: float
    preemptive: list[float]

    @property
    def values(self) -> tuple[float, float, float, float]:
        return self.critical_path, self.device_load, self.one_machine, self.memory


def lower_bounds(problem: Problem, deadline: float = math.inf) -> LowerBounds:
    """All lower bounds of `problem` (see the module docstring), within `deadline`
    (`time.perf_counter()`) where one is given.

    The bounds on the op graph cost about GRAPH_SECONDS_PER_OP per op (networkx); when that does
    not fit before the deadline only the two that need no graph are computed (the longest
    microbatch's critical path, the busiest device's work) and `complete` is False. With
    recomputation allowed, or the bidirectional placement, the single-device bounds are 0 (see the
    module docstring). With one stage per device the
    device sequencing bound stops at the deadline, device by device (0 where it did not finish).
    With more, the single-device bounds share the time left before the deadline, at most
    RELAXATION_MAX_S: first the device sequencing (SEQUENCING_SHARE of it; 0 on a device that did
    not finish in its share), then the CP-SAT relaxations (`relaxation.device_relaxation`), each
    reporting the bound CP-SAT proved. The devices go in decreasing order of their preemptive
    one-machine bound, each with half of the phase's time left (the last with all of it), so a
    device done early leaves its time to the next; `complete` is False when some device had no
    time left. With overlapped pairs allowed, the bounds of `pair_relaxed(problem)`.
    """
    problem = pair_relaxed(problem)
    if time.perf_counter() + problem.num_ops * GRAPH_SECONDS_PER_OP > deadline:
        return LowerBounds(critical_path(problem), max(device_work(problem)), 0.0, 0.0, 0.0, complete=False)
    graph = implied_graph(problem)
    heads, tails = heads_and_tails(graph)
    found = _graph_bounds(problem, graph, heads, tails)
    if problem.mechanisms_matter or problem.bidirectional:  # the single-device bounds assume kept
        # activations in microbatch order, and every microbatch through every stage of the device
        return LowerBounds(*found.values, 0.0)
    if problem.chunks_per_device == 1:
        return _sequenced_devices(problem, heads, tails, found, deadline)
    return _single_device_bounds(problem, graph, heads, tails, found, deadline)


def _graph_bounds(problem: Problem, graph: nx.DiGraph, heads: dict[Op, float], tails: dict[Op, float]) -> _GraphBounds:
    """The critical path, device load, one-machine and memory bounds (see the module docstring)."""
    critical = max(heads[op] + graph.nodes[op]["duration"] + tails[op] for op in graph)
    per_device: list[list[tuple[float, float, float]]] = [[] for _ in range(problem.num_devices)]
    for op, data in graph.nodes(data=True):
        per_device[data["device"]].append((heads[op], data["duration"], tails[op]))
    device_load = [min(j[0] for j in jobs) + sum(j[1] for j in jobs) + min(j[2] for j in jobs) for jobs in per_device]
    preemptive = [jackson_preemptive(jobs) for jobs in per_device]
    memory = memory_bound(problem, activation_lifetimes(problem), device_load)
    return _GraphBounds(critical, max(device_load), max(preemptive), memory, preemptive)


def _sequenced_devices(problem: Problem, heads: dict[Op, float], tails: dict[Op, float], found: _GraphBounds,
                       deadline: float) -> LowerBounds:
    """With one stage per device: the device sequencing bound, device by device until the deadline."""
    sequencing = 0.0
    for device in range(problem.num_devices):
        if interrupt.past(deadline):
            return LowerBounds(*found.values, sequencing, complete=False)
        needed = max(*found.values, sequencing)
        sequencing = max(sequencing, device_sequencing(problem, device, heads, tails, needed, deadline))
    return LowerBounds(*found.values, sequencing, complete=not interrupt.past(deadline))


def _single_device_bounds(problem: Problem, graph: nx.DiGraph, heads: dict[Op, float], tails: dict[Op, float],
                          found: _GraphBounds, deadline: float) -> LowerBounds:
    """With several stages per device: the device sequencing, then the CP-SAT relaxation, sharing the
    time left (at most RELAXATION_MAX_S; see `lower_bounds`)."""
    sequencing = relaxed = 0.0
    until = min(time.perf_counter() + RELAXATION_MAX_S, deadline)
    # the device whose preemptive one-machine bound is highest first, with half of the time left: it
    # binds in most cases measured (V shapes at V-Min's memory: the last device; interleaved: the first;
    # not interleaved p = 8, memory 8, where device 0 binds with 819.7 and comes last, 735.1 preemptive)
    devices = sorted(range(problem.num_devices), key=lambda device: -found.preemptive[device])
    complete = True
    for share, method in ((SEQUENCING_SHARE, "sequencing"), (1.0, "relaxation")):
        ends = time.perf_counter() + share * (until - time.perf_counter())
        for turn, device in enumerate(devices):  # a device done early leaves its time to the rest
            seconds = (ends - time.perf_counter()) / min(2, problem.num_devices - turn)
            if seconds <= 0.01 or interrupt.requested.is_set():
                complete = False
                break
            if method == "sequencing":
                needed = max(*found.values, sequencing)
                sequencing = max(sequencing, device_sequencing(problem, device, heads, tails, needed,
                                                               time.perf_counter() + seconds))
            else:
                relaxed = max(relaxed, device_relaxation(problem, device, graph, heads, tails, seconds))
    return LowerBounds(*found.values, sequencing, relaxed, complete=complete)
