"""A lower bound on the makespan of every split at once, and the splits in the order it ranks them.

For a split, virtual stage s costs F_s, B_s, W_s per microbatch (its layers' sums); latency ℓ
joins consecutive stages on different devices. Whatever the schedule and the memory, device d
with stages first(d) < ... < last(d):
- starts nothing before the first microbatch's forward reaches first(d), then runs all its work:
  makespan >= ΣF_{s<first(d)} + ℓ·(device changes before first(d)) + m·Σ_{s on d}(F_s + B_s + W_s);
- starts no B or W before the first microbatch's forward has gone through every stage and its
  backward back to last(d), then runs all its B's and W's:
  makespan >= ΣF + ΣB_{s>last(d)} + ℓ·(device changes on that path) + m·Σ_{s on d}(B_s + W_s).
With a device memory, each stage's activations are held for a round trip each, at most as many at
once as fit beside the device's parameters (`SplitFamily._memory_terms`). The split's bound is the
largest over devices of these; a split whose parameters and one microbatch's activations do not
fit a device cannot run. `SplitFamily` minimises this bound over
every split not yet excluded (CP-SAT, `split_model`): the least value is a bound on every split
left, and the split reaching it is the most promising one to solve next.
"""

from __future__ import annotations

import math

from zbopt.core.errors import ZboptError
from zbopt.planning.model import Device, Model
from zbopt.planning.planner.split import Pipeline, Split, stage_layers
from zbopt.planning.planner.split_model import MEMORY_SLACK, SCALE, BoundaryModel

__all__ = ["MAX_MODEL_INTEGER", "SplitFamily", "least_memory", "split_bound"]

MAX_MODEL_INTEGER = 2**62  # CP-SAT's integers are 64-bit: its products and sums keep a factor of 2


def _changes(pipeline: Pipeline, first: int, last: int) -> int:
    """How many of the edges stage k -> k+1, first <= k < last, join two devices."""
    return sum(pipeline.device_of(stage) != pipeline.device_of(stage + 1) for stage in range(first, last))


def split_bound(model: Model, device: Device, pipeline: Pipeline, split: Split) -> float:
    """The module docstring's bound of one split, in ms (exact sums, no rounding)."""
    sums = {"forward": [], "backward": [], "time": [], "gradient": []}
    for indices in stage_layers(split):
        layers = [model.layers[index] for index in indices]
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
        self.device, self.pipeline = device, pipeline
        self.latency = math.floor(device.p2p_ms * SCALE)
        # above every term: the work counted m + 1 times over, and every latency on both paths
        upper = self.boundaries.horizon * 4 + self.latency * 4 * pipeline.num_stages
        if upper * max(pipeline.num_microbatches, 1) > MAX_MODEL_INTEGER:  # the memory terms' products
            raise ZboptError(f"plan: over m = {pipeline.num_microbatches} microbatches the model's work is beyond the "
                             "split bound's model (its memory terms count m x 4 x the work in microseconds, past "
                             "2^62); give fewer microbatches or lighter layers")
        self.upper = upper
        self.objective = self.boundaries.model.NewIntVar(0, upper, "bound")
        for index in range(pipeline.num_devices):
            for term in self._time_terms(index):
                self.boundaries.model.Add(self.objective >= term)
            if device.usable_gb is not None:
                self._memory_terms(index)
        self.boundaries.model.Minimize(self.objective)
        self.exhausted = False
        self.floor = 0.0  # a bound on every split left: each step's holds for the fewer left after it

    def _time_terms(self, index: int) -> list:
        """Device `index`'s two bounds of the module docstring (head + all work, turn + B and W)."""
        boundaries, pipeline, m = self.boundaries, self.pipeline, self.pipeline.num_microbatches
        stages, own = pipeline.num_stages, pipeline.stages_on(index)
        first, last = own[0], own[-1]
        work = sum(boundaries.stage_sum("time", stage) for stage in own)
        gradients = sum(boundaries.stage_sum("gradient", stage) for stage in own)
        head = boundaries.at("forward", first) + self.latency * _changes(pipeline, 0, first)
        after = boundaries.prefix["backward"][-1] - boundaries.at("backward", last + 1)
        turn = (boundaries.prefix["forward"][-1] + after
                + self.latency * (_changes(pipeline, 0, stages - 1) + _changes(pipeline, last, stages - 1)))
        return [head + m * work, turn + m * gradients]

    def _memory_terms(self, index: int) -> None:
        """Device `index` holds its parameters and one microbatch's activations, and its memory
        bounds the makespan: stage s's activation of a microbatch (M_B) is held from its F to its
        B at least, a round trip R_s = Σ_{s' >= s}(F + B) + latency; at most k = floor(L / M_B) are
        held at once (L: the device's memory less its parameters), so makespan >= m·R_s / k."""
        boundaries, pipeline, m = self.boundaries, self.pipeline, self.pipeline.num_microbatches
        cp, stages, own = boundaries.model, pipeline.num_stages, pipeline.stages_on(index)
        memory = math.floor(self.device.usable_gb * SCALE + MEMORY_SLACK)
        room = memory - sum(boundaries.stage_sum("parameters", stage) for stage in own)
        cp.Add(room >= sum(boundaries.stage_sum("activation", stage) for stage in own))
        for stage in own:
            activation = cp.NewIntVar(0, boundaries.prefix["activation"][-1], f"activation{stage}")
            cp.Add(activation == boundaries.stage_sum("activation", stage))
            held = cp.NewIntVar(1, max(m, 1), f"held{stage}")  # activations of this stage held at once
            used = cp.NewIntVar(0, max(m, 1) * boundaries.prefix["activation"][-1], f"used{stage}")
            cp.AddMultiplicationEquality(used, [held, activation])
            cp.Add(used <= room)
            trip = (boundaries.prefix["forward"][-1] - boundaries.at("forward", stage)
                    + boundaries.prefix["backward"][-1] - boundaries.at("backward", stage)
                    + 2 * self.latency * _changes(pipeline, stage, stages - 1))
            spent = cp.NewIntVar(0, self.upper * max(m, 1), f"spent{stage}")
            cp.AddMultiplicationEquality(spent, [self.objective, held])
            cp.Add(spent >= m * trip)

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
    (with FSDP, its stages' gathered weights too) plus one microbatch's activations on its stages
    (a schedule runs each microbatch's forwards on a device before its backwards there). Below it
    no split can run."""
    boundaries = BoundaryModel(model, pipeline)
    need = [sum(boundaries.stage_sum(quantity, stage) for stage in pipeline.stages_on(index)
                for quantity in ("parameters", "activation", "gathered")) for index in range(pipeline.num_devices)]
    fullest = boundaries.model.NewIntVar(0, boundaries.horizon, "fullest")
    boundaries.model.AddMaxEquality(fullest, need)
    boundaries.model.Minimize(fullest)
    boundaries.solve(seconds)
    return math.inf if boundaries.infeasible else (boundaries.bound or 0.0) / SCALE
