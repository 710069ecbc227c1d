"""A lower bound on the makespan of every split at once, and the splits in the order it ranks them.

For a split, virtual stage s costs F_s, B_s, W_s per microbatch (its layers' sums); latency ℓ
joins consecutive stages on different devices. Whatever the schedule and the memory, device d
with stages first(d) < ... < last(d):
- starts nothing before the first microbatch's forward reaches first(d), then runs all its work:
  makespan >= ΣF_{s<first(d)} + ℓ·(device changes before first(d)) + m·Σ_{s on d}(F_s + B_s + W_s);
- starts no B or W before the first microbatch's forward has gone through every stage and its
  backward back to last(d), then runs all its B's and W's:
  makespan >= ΣF + ΣB_{s>last(d)} + ℓ·(device changes on that path) + m·Σ_{s on d}(B_s + W_s).
The split's bound is the largest over devices and both; a split whose parameters and one
microbatch's activations do not fit a device cannot run. `SplitFamily` minimises this bound over
every split not yet excluded (CP-SAT, `split_model`): the least value is a bound on every split
left, and the split reaching it is the most promising one to solve next.
"""

from __future__ import annotations

import math

from zbopt.model import Device, Model
from zbopt.planner.split import Pipeline, Split
from zbopt.planner.split_model import MEMORY_SLACK, SCALE, BoundaryModel


def _changes(pipeline: Pipeline, first: int, last: int) -> int:
    """How many of the edges stage k -> k+1, first <= k < last, join two devices."""
    return sum(pipeline.device_of(stage) != pipeline.device_of(stage + 1) for stage in range(first, last))


def split_bound(model: Model, device: Device, pipeline: Pipeline, split: Split) -> float:
    """The module docstring's bound of one split, in ms (exact sums, no rounding)."""
    sums = {"forward": [], "backward": [], "time": [], "gradient": []}
    start = 0
    for count in split:
        layers = model.layers[start:start + count]
        start += count
        forward, backward = sum(x.forward_ms for x in layers), sum(x.backward_ms for x in layers)
        weight = sum(x.weight_ms or 0.0 for x in layers)
        for key, value in (("forward", forward), ("backward", backward), ("time", forward + backward + weight),
                           ("gradient", backward + weight)):
            sums[key].append(value)
    stages, latency, m = pipeline.num_stages, device.p2p_ms, pipeline.num_microbatches
    best = 0.0
    for index in range(pipeline.num_devices):
        own = pipeline.stages_on(index)
        first, last = own[0], own[-1]
        head = sum(sums["forward"][:first]) + latency * _changes(pipeline, 0, first)
        turn = (sum(sums["forward"]) + sum(sums["backward"][last + 1:])
                + latency * (_changes(pipeline, 0, stages - 1) + _changes(pipeline, last, stages - 1)))
        best = max(best, head + m * sum(sums["time"][s] for s in own),
                   turn + m * sum(sums["gradient"][s] for s in own))
    return best


class SplitFamily:
    """Every split of the model that could fit the device, as one CP-SAT model minimising the
    module docstring's bound (times rounded down to SCALE ticks per ms, so it stays a bound)."""

    def __init__(self, model: Model, device: Device, pipeline: Pipeline):
        self.boundaries = BoundaryModel(model, pipeline)
        cp, stages, m = self.boundaries.model, pipeline.num_stages, pipeline.num_microbatches
        latency = math.floor(device.p2p_ms * SCALE)
        total_forward = self.boundaries.prefix["forward"][-1]
        terms = []
        for index in range(pipeline.num_devices):
            own = pipeline.stages_on(index)
            first, last = own[0], own[-1]
            work = sum(self.boundaries.stage_sum("time", stage) for stage in own)
            gradients = sum(self.boundaries.stage_sum("gradient", stage) for stage in own)
            head = self.boundaries.at("forward", first) + latency * _changes(pipeline, 0, first)
            after = self.boundaries.prefix["backward"][-1] - self.boundaries.at("backward", last + 1)
            turn = total_forward + after + latency * (_changes(pipeline, 0, stages - 1)
                                                      + _changes(pipeline, last, stages - 1))
            terms += [head + m * work, turn + m * gradients]
            if device.memory_gb is not None:
                held = sum(self.boundaries.stage_sum(quantity, stage) for stage in own
                           for quantity in ("parameters", "activation"))
                cp.Add(held <= math.floor(device.memory_gb * SCALE + MEMORY_SLACK))
        # above every term: the work counted m + 1 times over, and every latency on both paths
        upper = self.boundaries.horizon * 4 + latency * 4 * stages
        self.objective = cp.NewIntVar(0, upper, "bound")
        cp.AddMaxEquality(self.objective, terms)
        cp.Minimize(self.objective)
        self.exhausted = False
        self.floor = 0.0  # a bound on every split left: each step's holds for the fewer left after it

    def next_split(self, seconds: float) -> tuple[Split | None, float]:
        """(the split with the least bound among those left, a bound in ms on every split left):
        (None, inf) once none is left (the no-goods and the memory leave none); (None, the bound
        so far) when CP-SAT finds none in time."""
        split = self.boundaries.solve(seconds)
        if self.boundaries.infeasible:
            self.exhausted = True
            self.floor = math.inf
            return None, math.inf
        if self.boundaries.bound is not None:
            self.floor = max(self.floor, self.boundaries.bound / SCALE)
        return split, self.floor

    def exclude(self, split: Split) -> None:
        self.boundaries.exclude(split)


def least_memory(model: Model, pipeline: Pipeline, seconds: float = 10.0) -> float:
    """The least device memory (GB) any split needs on its fullest device: the parameters it holds
    plus one microbatch's activations on its stages (a schedule runs each microbatch's forwards on
    a device before its backwards there). Below it no split can run."""
    boundaries = BoundaryModel(model, pipeline)
    need = [sum(boundaries.stage_sum(quantity, stage) for stage in pipeline.stages_on(index)
                for quantity in ("parameters", "activation")) for index in range(pipeline.num_devices)]
    fullest = boundaries.model.NewIntVar(0, boundaries.horizon, "fullest")
    boundaries.model.AddMaxEquality(fullest, need)
    boundaries.model.Minimize(fullest)
    boundaries.solve(seconds)
    return math.inf if boundaries.infeasible else (boundaries.bound or 0.0) / SCALE
