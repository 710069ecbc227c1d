"""A CP-SAT model whose variables are a split: the boundaries between virtual stages.

Boundary b_s is the index of stage s's first layer (b_0 = 0, b_S = the layer count, each stage at
least one layer). A per-stage sum of a layer quantity (its time, its parameters, ...) is read off
the quantity's prefix sums at two boundaries by element constraints, so every split is one
assignment and a bound over all splits is one minimisation. Quantities are integers, each layer's
value rounded down (times in SCALE ticks per ms, memory in SCALE per GB): a sum over the model
is then never above the true sum, which keeps a minimised lower bound a lower bound.
"""

from __future__ import annotations

import itertools
import math

from zbopt.planning.model import Layer, Model, Training
from zbopt.planning.model.collectives import gathered_gb
from zbopt.planning.planner.split import Pipeline, Split

__all__ = ["MEMORY_SLACK", "SCALE", "BoundaryModel"]

SCALE = 1000  # ticks per ms (microseconds) and per GB (MB)
MEMORY_SLACK = 1e-6  # ticks: a device memory written in decimal GB (4.1 GB) is not floored a tick short


def _quantities(layer: Layer, training: Training) -> dict[str, int]:
    """A layer's integer quantities: its amounts in SCALE ticks, rounded down (with FSDP, its
    gathered weights too), and whether it takes any F, B, W time (a stage needs one layer of
    each: zbopt's Problem needs every time above 0)."""
    weight = layer.weight_ms or 0.0
    amounts = {"forward": layer.forward_ms, "backward": layer.backward_ms, "weight": weight,
               "gradient": layer.backward_ms + weight, "time": layer.forward_ms + layer.backward_ms + weight,
               "parameters": layer.parameters_gb, "activation": layer.activation_gb,
               "kept": layer.weight_activation_gb or 0.0, "gathered": gathered_gb(training, [layer])}
    counts = {"timed forward": layer.forward_ms > 0, "timed backward": layer.backward_ms > 0,
              "timed weight": weight > 0}
    return {**{name: math.floor(value * SCALE) for name, value in amounts.items()},
            **{name: int(flag) for name, flag in counts.items()}}


class BoundaryModel:
    """CP-SAT's model of the boundaries of a split of `model` on `pipeline`, with the stage sums a
    caller asks for (`stage_sum`) built once each."""

    def __init__(self, model: Model, pipeline: Pipeline):
        from ortools.sat.python import cp_model

        self.pipeline, self.layer_count = pipeline, len(model.layers)
        self.prefix: dict[str, list[int]] = {}
        for layer in model.layers:
            for name, value in _quantities(layer, model.training).items():
                sums = self.prefix.setdefault(name, [0])
                sums.append(sums[-1] + value)
        self.horizon = max(sum(sums[-1] for sums in self.prefix.values()), 1) * max(pipeline.num_microbatches, 1)
        self.model = cp_model.CpModel()
        stages, count = pipeline.num_stages, self.layer_count
        self.boundaries = [self.model.NewConstant(0)]
        for stage in range(1, stages):
            self.boundaries.append(self.model.NewIntVar(stage, count - (stages - stage), f"b{stage}"))
        self.boundaries.append(self.model.NewConstant(count))
        for before, after in itertools.pairwise(self.boundaries):
            self.model.Add(after >= before + 1)
        self._at: dict[tuple[str, int], object] = {}
        self._sums: dict[tuple[str, int], object] = {}

    def at(self, quantity: str, boundary: int):
        """The quantity's prefix sum at boundary `boundary` (a variable; a constant at the ends)."""
        key = (quantity, boundary)
        if key not in self._at:
            sums = self.prefix[quantity]
            if boundary in (0, len(self.boundaries) - 1):
                self._at[key] = sums[0] if boundary == 0 else sums[-1]
            else:
                value = self.model.NewIntVar(0, sums[-1], f"{quantity}@{boundary}")
                self.model.AddElement(self.boundaries[boundary], sums, value)
                self._at[key] = value
        return self._at[key]

    def stage_sum(self, quantity: str, stage: int):
        """The quantity summed over stage `stage`'s layers (a linear expression)."""
        return self.at(quantity, stage + 1) - self.at(quantity, stage)

    def exclude(self, split: Split) -> None:
        """No assignment may be `split` again (a no-good: some boundary differs)."""
        differs = []
        start = 0
        for stage, count in enumerate(split[:-1]):
            start += count
            literal = self.model.NewBoolVar(f"not{stage}")
            self.model.Add(self.boundaries[stage + 1] != start).OnlyEnforceIf(literal)
            differs.append(literal)
        self.model.AddBoolOr(differs)

    def solve(self, seconds: float, workers: int = 1) -> Split | None:
        """The best split CP-SAT finds in `seconds` (None if none); `self.bound` is then the
        objective bound it proved, `self.proven` whether it is the optimum."""
        from ortools.sat.python import cp_model

        from zbopt.solvers.cp_parts import limit, solve_stoppable

        solver = cp_model.CpSolver()
        limit(solver, seconds, workers)  # Ctrl-C is `zbopt.core.interrupt`'s (a step lasts 5 s at most)
        # one presolve pass, no probing: full presolve took 2-4 s of a 5 s step on 80-layer models
        # (element constraints over 83 prefix sums), none at all left bounds unproven; measured on
        # the 32- and 82-layer models at p = 4, 8, v = 1, 2: every first step proven in 0.05-1.8 s
        solver.parameters.max_presolve_iterations = 1
        solver.parameters.cp_model_probing_level = 0
        status = solve_stoppable(solver, self.model)
        self.proven = status == cp_model.OPTIMAL
        self.infeasible = status == cp_model.INFEASIBLE
        # CP-SAT's bound holds whenever it did not prove the model infeasible, a split found or not
        self.bound = None if self.infeasible else solver.BestObjectiveBound()
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        cuts = [solver.Value(boundary) for boundary in self.boundaries]
        return tuple(after - before for before, after in itertools.pairwise(cuts))
