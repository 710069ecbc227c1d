"""A plan's answer: per pipeline the rows of rule × schedule, the best split found and the
certificate; over the pipelines, the best and a bound over all of them. Times in ms, memory in GB
(the model's units); `to_dict` gives the JSON `zbopt plan --json` prints."""

from __future__ import annotations

import math
from dataclasses import dataclass

from zbopt.core.simulation import Simulation
from zbopt.planning.model import Device, Model
from zbopt.planning.planner.split import Pipeline, Split, device_parameters, stage_names
from zbopt.solvers.gap import relative_gap

__all__ = ["OPTIMAL", "OVER_THE_LIMIT", "Outcome", "PipelinePlan", "Plan", "PlanRow", "device_peaks", "schedule_orders",
           "split_exports"]

OPTIMAL = "optimal"  # the optimizer's row, beside the heuristics' names
OVER_THE_LIMIT = "over the memory limit"  # the note of a heuristic's row whose schedule breaks the device memory


@dataclass(frozen=True)
class Outcome:
    """One split solved: its best schedule's simulation (None if none fits) and a lower bound on
    every schedule of that split."""

    split: Split
    simulation: Simulation | None
    lower_bound: float
    schedule: str

    @property
    def makespan(self) -> float:
        """The pipeline's makespan; inf without a schedule."""
        return math.inf if self.simulation is None else self.simulation.makespan

    @property
    def iteration_time(self) -> float:
        """What a plan minimises: the pipeline's makespan and the iteration's ends (the makespan
        without ends); inf without a schedule."""
        return math.inf if self.simulation is None else self.simulation.iteration_time


@dataclass(frozen=True)
class PlanRow:
    """One rule's split under one schedule; `note` says why there is no makespan."""

    rule: str
    schedule: str
    split: Split | None
    simulation: Simulation | None
    note: str | None = None

    @property
    def makespan(self) -> float | None:
        return None if self.simulation is None else self.simulation.makespan

    @property
    def iteration_time(self) -> float | None:
        """The makespan and the iteration's ends (the makespan without ends); None without a schedule."""
        return None if self.simulation is None else self.simulation.iteration_time

    def to_dict(self, model: Model, pipeline: Pipeline, lower_bound: float) -> dict:
        """The row in JSON: `makespan_ms` the pipeline's, `iteration_ms` with the iteration's ends
        (equal without); `peak_gb` each device's whole peak (its parameters and its activations'
        peak); `gap` of the iteration against its pipeline's bound over every split; `orders` its
        schedule."""
        simulation = self.simulation
        return {"rule": self.rule, "schedule": self.schedule, "chunks": pipeline.chunks_per_device,
                "placement": pipeline.placement, "split": None if self.split is None else list(self.split),
                "makespan_ms": self.makespan, "iteration_ms": self.iteration_time,
                "bubble": None if simulation is None else simulation.bubble_rate,
                "peak_gb": None if simulation is None else device_peaks(model, pipeline, self.split, simulation),
                "gap": None if simulation is None else relative_gap(simulation.iteration_time, lower_bound),
                "note": self.note, "orders": None if simulation is None else schedule_orders(simulation)}


@dataclass(frozen=True)
class PipelinePlan:
    """One pipeline's answer: its rows, the best split and schedule found, and the certificate
    over every split of it (`lower_bound`; `pruned`: the splits left all bound at least the best;
    `explored`: how many splits were solved)."""

    pipeline: Pipeline
    rows: tuple[PlanRow, ...]
    best: Outcome | None
    lower_bound: float
    explored: int
    pruned: bool


@dataclass(frozen=True)
class Plan:
    """The answer over every pipeline tried (chunks per device, placement): the best of them, and
    a lower bound over every split of every one of them."""

    model: Model
    device: Device
    pipelines: tuple[PipelinePlan, ...]

    @property
    def best(self) -> PipelinePlan:
        return min(self.pipelines, key=lambda each: math.inf if each.best is None else each.best.iteration_time)

    @property
    def makespan(self) -> float:
        """The best plan's pipeline makespan (the plan is chosen by `iteration_time`)."""
        return math.inf if self.best.best is None else self.best.best.makespan

    @property
    def iteration_time(self) -> float:
        """The best plan's iteration time (its makespan where the problem has no iteration ends)."""
        return math.inf if self.best.best is None else self.best.best.iteration_time

    @property
    def lower_bound(self) -> float:
        return min(self.iteration_time, *(each.lower_bound for each in self.pipelines))

    @property
    def gap(self) -> float | None:
        return relative_gap(self.iteration_time, self.lower_bound) if self.iteration_time < math.inf else None

    def frameworks(self) -> dict:
        """What each framework runs of the best plan (`frameworks.framework_support`): Megatron-LM's
        best is sought on every split this pipeline's rows show."""
        from zbopt.planning.planner.frameworks import framework_support

        chosen, outcome = self.best, self.best.best
        return framework_support(self.model, self.device, chosen.pipeline, outcome.split, outcome.simulation,
                                 outcome.schedule, [row.split for row in chosen.rows if row.split is not None])

    def to_dict(self) -> dict:
        """`best` (the split as layers per virtual stage in model order, ends counted as layers, and
        each stage's layer names; the schedule; makespan and the bound over every split, in ms;
        the gap), `pipelines` (each one's bound, solved and pruned splits) and `rows`."""
        chosen, outcome = self.best, self.best.best
        best = None if outcome is None else {
            "split": list(outcome.split), "stages": stage_names(self.model, outcome.split),
            "chunks": chosen.pipeline.chunks_per_device, "placement": chosen.pipeline.placement,
            "schedule": outcome.schedule, "makespan_ms": outcome.makespan,
            "iteration_ms": outcome.iteration_time, "lower_bound_ms": self.lower_bound,
            "gap": self.gap, "peak_gb": device_peaks(self.model, chosen.pipeline, outcome.split, outcome.simulation),
            "device_memory_gb": self.device.memory_gb, "reserve_gb": self.device.reserve,
            "usable_gb": self.device.usable_gb,
            "exports": split_exports(self.model, chosen.pipeline, outcome.split),
            "frameworks": self.frameworks(), "orders": schedule_orders(outcome.simulation)}
        return {"best": best,
                "pipelines": [{"devices": each.pipeline.num_devices, "chunks": each.pipeline.chunks_per_device,
                               "placement": each.pipeline.placement, "microbatches": each.pipeline.num_microbatches,
                               "lower_bound_ms": each.lower_bound, "splits_solved": each.explored,
                               "rest_pruned": each.pruned} for each in self.pipelines],
                "rows": [row.to_dict(self.model, each.pipeline, each.lower_bound) for each in self.pipelines
                         for row in each.rows]}


def schedule_orders(simulation: Simulation) -> list[list[str]]:
    """Each device's ops in order as text ("3F1"): what `run-torch` runs from a plan's JSON."""
    return [[str(op) for op in order] for order in simulation.schedule.orders]


def split_exports(model: Model, pipeline: Pipeline, split: Split) -> dict:
    """The split in the frameworks' words (`exports`): Megatron-LM's layout string and its
    first/last-stage counts, torchtitan's modules per model chunk; where a framework cannot express
    it (say, Megatron and the V placement), the reason in its place."""
    from zbopt.core.errors import ZboptError
    from zbopt.planning.planner import exports

    found = {}
    for key, export in (("megatron_layout", exports.megatron_layout),
                        ("megatron_first_last", exports.megatron_first_last),
                        ("torchtitan_modules", exports.torchtitan_modules)):
        try:
            found[key] = export(model, list(split), pipeline.num_devices, pipeline.chunks_per_device,
                                pipeline.placement)
        except ZboptError as error:
            found[key] = f"not expressible: {error}"
    return found


def device_peaks(model: Model, pipeline: Pipeline, split: Split, simulation: Simulation) -> list[float]:
    """Each device's peak in GB as a GPU holds it: its parameters (with gradients and optimizer
    state) and its activations' peak (the schedule's)."""
    return [held + peak for held, peak in zip(device_parameters(model, pipeline, split), simulation.peak_memory,
                                               strict=True)]

