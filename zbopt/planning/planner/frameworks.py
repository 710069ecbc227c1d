"""What each training framework runs of a plan, and what it costs there.

- torch.distributed.pipelining runs any plan's schedule as printed: torch's compute-only CSV
  (`plan --export plan.csv`) is what its `_PipelineScheduleRuntime._load_csv` reads (`zbopt
  run-torch` runs it on your model).
- torchtitan runs the same CSV: given `pipeline_parallel_schedule_csv`, its
  `build_pipeline_schedule` (torchtitan/distributed/pipeline_parallel.py) loads it into
  `_PipelineScheduleRuntime`, with the split as `module_fqns_per_model_part` (one list of module
  FQNs per virtual stage). The schedule *name* it is also given still places the stages:
  a `PipelineScheduleSingle` class means one stage per rank, `ZBVZeroBubble` the V (stages r and
  2p-1-r on rank r), any other multi-stage class loop order. Option names as in torchtitan's TOML
  `JobConfig` ([parallelism], torchtitan/config/job_config.py); its newer Python config (the
  "TOML to Python Dataclass Registry" refactor) renames `module_fqns_per_model_part` to
  `pipeline_parallel_module_fqns_per_model_part`.
- Megatron-LM runs only its own schedules, each with the backward fused (no weight-gradient step):
  1F1B with one chunk per device, interleaved 1F1B with several in loop order, and combined 1F1B,
  which overlaps pairs (a plan has none). A plan whose schedule is not one of these does not run
  there as printed; Megatron-LM's best is its schedule simulated on each split the plan shows with
  every stage's B and W fused into one backward, at the same device memory, the shortest kept, with
  `--pipeline-model-parallel-size` and `--pipeline-model-parallel-layout` (which gives the virtual
  stages too: docs/api-guide/pipeline_parallel_layout.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from zbopt.core.errors import ZboptError
from zbopt.core.kinds import WEIGHT
from zbopt.core.simulation import Simulation, simulate
from zbopt.planning.model import Device, Model
from zbopt.planning.planner.exports import megatron_layout, torchtitan_modules
from zbopt.planning.planner.split import Pipeline, Split, split_problem

__all__ = ["MEGATRON_SCHEDULES", "TORCHTITAN_SCHEDULES", "framework_support", "fused_model", "megatron_best",
           "torchtitan_config"]

MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")  # zbopt's names of Megatron-LM's own (no pairs in a plan)
# torchtitan's schedule name for the stage placement, by (chunks per device == 1, placement)
TORCHTITAN_SCHEDULES = {(True, "loop"): "PipelineScheduleSingle", (False, "loop"): "PipelineScheduleMulti",
                        (False, "v"): "ZBVZeroBubble"}


def fused_model(model: Model) -> Model:
    """The model with each layer's B and W as one backward (what Megatron-LM runs)."""
    if all(layer.weight_ms is None for layer in model.layers):
        return model
    return Model(tuple(dataclasses.replace(layer, backward_ms=layer.backward_ms + (layer.weight_ms or 0.0),
                                           weight_ms=None, weight_activation_gb=None) for layer in model.layers),
                 model.groups, model.training)


def megatron_schedule(pipeline: Pipeline) -> str | None:
    """Megatron-LM's schedule for the pipeline: 1F1B, interleaved 1F1B in loop order, else none."""
    if pipeline.chunks_per_device == 1:
        return MEGATRON_SCHEDULES[0]
    return MEGATRON_SCHEDULES[1] if pipeline.placement == "loop" else None


def megatron_best(model: Model, device: Device, pipeline: Pipeline, splits: Iterable[Split]) -> dict | str:
    """Megatron-LM's own schedule on the best of `splits` with the backward fused (module
    docstring): {schedule, split, makespan_ms, iteration_ms, flags}, or why there is none: the best by
    iteration time (the makespan where the plan has no iteration ends)."""
    from zbopt.schedules import generate

    name = megatron_schedule(pipeline)
    if name is None:
        return (f"no Megatron-LM schedule: its virtual stages sit in loop order only (this pipeline is "
                f"{pipeline.placement})")
    fused, best = fused_model(model), None
    for split in dict.fromkeys(tuple(split) for split in splits):
        try:
            problem = split_problem(fused, device, pipeline, split)
            simulation = simulate(problem, generate(name, problem))
        except ZboptError:  # a split Megatron's schedule does not take, or that does not fit
            continue
        if simulation.valid and (best is None or simulation.iteration_time < best[1].iteration_time):
            best = (split, simulation)
    if best is None:
        return f"{name} with the backward fused fits the device memory on none of the plan's splits"
    split, simulation = best
    try:
        layout = megatron_layout(model, list(split), pipeline.num_devices, pipeline.chunks_per_device,
                                 pipeline.placement)
        flags = [f"--pipeline-model-parallel-size {pipeline.num_devices}",
                 f'--pipeline-model-parallel-layout "{layout}"']
    except ZboptError as error:
        flags = [f"--pipeline-model-parallel-size {pipeline.num_devices}", f"(no layout string: {error})"]
    return {"schedule": name, "split": list(split), "makespan_ms": simulation.makespan,
            "iteration_ms": simulation.iteration_time, "flags": flags}


def torchtitan_config(model: Model, pipeline: Pipeline, split: Split, csv: str = "plan.csv") -> list[str] | str:
    """The TOML lines that run the plan in torchtitan (module docstring), or why it cannot."""
    schedule = TORCHTITAN_SCHEDULES.get((pipeline.chunks_per_device == 1, pipeline.placement))
    if schedule is None or (pipeline.placement == "v" and pipeline.chunks_per_device != 2):
        return (f"torchtitan places stages in loop order or, for its V schedules, two per rank: not "
                f"{pipeline.chunks_per_device} chunks in {pipeline.placement} order")
    try:
        modules = torchtitan_modules(model, list(split), pipeline.num_devices, pipeline.chunks_per_device,
                                     pipeline.placement)
    except ZboptError as error:
        return f"no module lists: {error}"
    return ["[parallelism]", f"pipeline_parallel_degree = {pipeline.num_devices}",
            f'pipeline_parallel_schedule = "{schedule}"', f'pipeline_parallel_schedule_csv = "{csv}"',
            "module_fqns_per_model_part = [" + ", ".join(
                "[" + ", ".join(f'"{name}"' for name in names) + "]" for names in modules) + "]",
            f"# and pipeline_parallel_microbatch_size = local_batch_size / {pipeline.num_microbatches}"]


def framework_support(model: Model, device: Device, pipeline: Pipeline, split: Split, simulation: Simulation,
                      schedule: str, other_splits: Iterable[Split] = ()) -> dict:
    """Per framework whether it runs the plan's schedule as printed, and how: torch (always, its
    CSV), torchtitan (its config lines), Megatron-LM (as printed only for its own fused schedules;
    its best on the plan's splits beside)."""
    split_backward = any(op.kind == WEIGHT for order in simulation.schedule.orders for op in order)
    own = schedule in MEGATRON_SCHEDULES and not split_backward and megatron_schedule(pipeline) == schedule
    if own:
        why = None
    elif split_backward:
        why = "the schedule splits the backward (B and W); Megatron-LM's fuse it"
    else:
        why = f"{schedule} is not Megatron-LM's own schedule (1F1B, interleaved 1F1B, combined 1F1B)"
    return {"torch": "as printed: torch's CSV (plan --export plan.csv), run by torch.distributed.pipelining",
            "torchtitan": torchtitan_config(model, pipeline, split),
            "megatron": {"as_printed": own, "why_not": why,
                         "best": megatron_best(model, device, pipeline, [split, *other_splits])}}
