"""The single-device relaxation: one device's ops alone, solved exactly (CP-SAT), as a lower bound.

Where a device holds several stages (v >= 2) this complements the device sequencing bound (a
dynamic program over the same device, `sequencing.device_sequencing`, which merges orders and so can
be weaker, but needs no solver and is often far faster). It is the k-device relaxation of
`cross_device` with one device: each op after its head and followed by its tail, the round trips
of each microbatch's chain through the other devices, the implied graph's edges among the device's
ops, one op at a time and the memory limit.
"""

from __future__ import annotations

import networkx as nx

from zbopt.ops import Op
from zbopt.problem import Problem
from zbopt.solvers.cross_device import cross_device_bound


def device_relaxation(problem: Problem, device: int, graph: nx.DiGraph, heads: dict[Op, float],
                      tails: dict[Op, float], seconds: float) -> float:
    """A lower bound on the makespan from `device` alone, proven by CP-SAT within `seconds` (its
    best bound when it does not finish): `cross_device.cross_device_bound` of the one device."""
    return cross_device_bound(problem, (device,), graph, heads, tails, seconds)
