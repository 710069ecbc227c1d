"""Inside one rank's process: build its stages, run the CSV with torch's own runtime, time every
op, and hand the gradients and times back to the parent through a file."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from zbopt.core.errors import described
from zbopt.interfaces.runtime.model import CutModel, ToyModel, named_gradients
from zbopt.io.torch_format import TORCH_FORWARD, TORCH_FULL_BACKWARD, TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD

__all__ = ["P2P_ROUNDS", "RankJob", "rank_main"]

# A one-way p2p time is the median of this many ping-pong round trips (after 3 untimed ones), halved.
P2P_ROUNDS = 20


@dataclass(frozen=True)
class RankJob:
    """What every rank needs; pickled to the worker processes."""

    path: str
    stages_of_rank: tuple[tuple[int, ...], ...]  # per pipeline rank
    model: ToyModel | CutModel
    steps: int
    store_port: int
    timeout_s: float
    result_dir: str
    replicas: int = 1  # data-parallel replicas of the pipeline: process = pipeline rank * replicas + replica
    csv_format: str = "compute_only"  # or "compute_comms": the file is already lowered


def _schedule_runtime_class():
    """torch's `_PipelineScheduleRuntime`, the class that runs a CSV: torch 2.13 defines it in
    pipelining/schedules.py, torch's main branch (2026) moved it to pipelining/runtime.py."""
    try:
        from torch.distributed.pipelining.runtime import _PipelineScheduleRuntime
    except ImportError:
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    return _PipelineScheduleRuntime


class _OpRecorder:
    """Wraps a rank's PipelineStage methods: op times (timed steps), saved-activation bytes (step 0),
    and the rank's progress (step, ops done) in shared memory for the parent's timeout message."""

    def __init__(self, modules: list, progress, rank: int, last_step: int):
        self.samples: dict[tuple[int, str], list[float]] = defaultdict(list)
        self.activation_bytes: dict[int, int] = {}
        # the last step's ops as (stage, kind, microbatch, start, end), on time.perf_counter's clock,
        # which is CLOCK_MONOTONIC on Linux: one clock for every rank's process on the machine
        self.intervals: list[tuple[int, str, int, float, float]] = []
        self.modules, self.progress, self.rank, self.last_step = modules, progress, rank, last_step
        self.step = 0

    def start_step(self, step: int) -> None:
        self.step = step
        self.progress[2 * self.rank], self.progress[2 * self.rank + 1] = step, 0

    def _timed(self, stage: int, kind: str, function, *args, **kwargs):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        end = time.perf_counter()
        if self.step > 0:
            self.samples[stage, kind].append(end - start)
        if self.step == self.last_step:  # the chunk id comes first, as torch's runtime passes it
            chunk = args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id"))
            self.intervals.append((stage, kind, chunk, start, end))
        self.progress[2 * self.rank + 1] += 1
        return result

    def _forward_saving(self, stage: int, forward, *args, **kwargs):
        """forward_one_chunk, counting the bytes of the non-parameter tensors autograd saves."""
        import torch

        parameters = {p.data_ptr() for p in self.modules[stage].parameters()}
        saved: dict[tuple, int] = {}

        def pack(tensor):
            if tensor.data_ptr() not in parameters:
                saved[tensor.data_ptr(), tuple(tensor.shape)] = tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            result = self._timed(stage, TORCH_FORWARD, forward, *args, **kwargs)
        self.activation_bytes[stage] = max(self.activation_bytes.get(stage, 0), sum(saved.values()))
        return result

    def instrument(self, pipeline_stage) -> None:
        stage = pipeline_stage.stage_index
        forward = pipeline_stage.forward_one_chunk
        backward = pipeline_stage.backward_one_chunk
        weight = pipeline_stage.backward_weight_one_chunk

        def timed_forward(*args, **kwargs):
            if self.step == 0:
                return self._forward_saving(stage, forward, *args, **kwargs)
            return self._timed(stage, TORCH_FORWARD, forward, *args, **kwargs)

        def timed_backward(*args, **kwargs):
            kind = TORCH_FULL_BACKWARD if kwargs.get("full_backward", True) else TORCH_INPUT_BACKWARD
            return self._timed(stage, kind, backward, *args, **kwargs)

        def timed_weight(*args, **kwargs):
            return self._timed(stage, TORCH_WEIGHT_BACKWARD, weight, *args, **kwargs)

        pipeline_stage.forward_one_chunk = timed_forward
        pipeline_stage.backward_one_chunk = timed_backward
        pipeline_stage.backward_weight_one_chunk = timed_weight

    def timed_loss(self, loss_fn, last_stage: int):
        """The loss, its time added to the last stage's forward: torch computes it right after that
        forward (`_maybe_compute_loss`), for the same microbatch."""

        def loss(output, target):
            start = time.perf_counter()
            value = loss_fn(output, target)
            end = time.perf_counter()
            if self.step > 0:
                self.samples[last_stage, TORCH_FORWARD][-1] += end - start
            if self.step == self.last_step:  # the forward's interval runs on to the loss's end
                stage, kind, microbatch, began, _ = self.intervals[-1]
                self.intervals[-1] = (stage, kind, microbatch, began, end)
            return value

        return loss


def _one_way_p2p_s(rank: int, world: int, shape: tuple[int, ...]) -> float | None:
    """Ranks 0 and 1 ping-pong an activation-sized tensor; rank 0 returns half the median round trip."""
    import torch
    import torch.distributed as dist

    if world < 2 or rank > 1:
        return None
    buffer = torch.zeros(shape)
    rounds = []
    for _ in range(3 + P2P_ROUNDS):
        start = time.perf_counter()
        if rank == 0:
            dist.send(buffer, dst=1)
            dist.recv(buffer, src=1)
        else:
            dist.recv(buffer, src=0)
            dist.send(buffer, dst=0)
        rounds.append(time.perf_counter() - start)
    return statistics.median(rounds[3:]) / 2 if rank == 0 else None


def _run_rank(rank: int, job: RankJob, progress) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    torch.set_num_threads(1)  # one core per rank at most: ranks share the machine's cores
    world = len(job.stages_of_rank) * job.replicas
    timeout = timedelta(seconds=job.timeout_s)
    store = dist.TCPStore("127.0.0.1", job.store_port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        pipeline_rank, replica = divmod(rank, job.replicas)
        model, mine = job.model, job.stages_of_rank[pipeline_rank]
        last = model.num_stages - 1
        modules = model.stage_modules()
        recorder = _OpRecorder(modules, progress, rank, job.steps - 1)
        pipeline_group = _replicated(modules, mine, len(job.stages_of_rank), job.replicas)
        stages = []
        for stage in mine:
            # Static shapes (no inference round at the first step); requires_grad marks what gets a gradient.
            inputs, outputs = model.stage_examples(stage)
            pipeline_stage = PipelineStage(modules[stage], stage, model.num_stages, torch.device("cpu"),
                                           input_args=inputs, output_args=outputs, group=pipeline_group)
            recorder.instrument(pipeline_stage)
            stages.append(pipeline_stage)
        loss_fn = recorder.timed_loss(model.loss_fn, last)
        schedule = _schedule_runtime_class()(stages, model.num_microbatches, loss_fn=loss_fn)
        schedule._load_csv(job.path, format=job.csv_format)
        inputs, targets = model.batches(job.steps)
        gradients, step_times = [], []
        for step in range(job.steps):
            for stage in mine:
                modules[stage].zero_grad(set_to_none=True)
            recorder.start_step(step)
            start = time.perf_counter()
            share = (inputs[step][0].tensor_split(job.replicas)[replica],) if 0 in mine else ()
            target = targets[step].tensor_split(job.replicas)[replica] if last in mine else None
            schedule.step(*share, target=target, return_outputs=False)
            step_times.append(time.perf_counter() - start)
            gradients.append(named_gradients(modules, mine))
        p2p = _one_way_p2p_s(rank, world, model.stage_examples(0)[1][0].shape)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {
        "gradients": gradients,
        "samples": dict(recorder.samples),
        "intervals": recorder.intervals,
        "activation_bytes": recorder.activation_bytes,
        "step_time_s": statistics.median(step_times[1:]),
        "p2p_time_s": p2p,
    }


def _replicated(modules: list, mine: tuple[int, ...], pipeline_ranks: int, replicas: int):
    """With several replicas, this rank's stage modules replicated over its data-parallel group
    (`replicate`, the FSDP-based one torch's pipelining reduces at REDUCE_GRAD) and its pipeline's
    process group; None (the default group) with one."""
    if replicas == 1:
        return None
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (pipeline_ranks, replicas), mesh_dim_names=("pipeline", "data"))
    for stage in mine:
        replicate(modules[stage], mesh=mesh["data"])
    return mesh["pipeline"].get_group()


def rank_main(rank: int, job: RankJob, progress) -> None:
    """Worker process entry: the result (or a one-line error) goes to a file the parent reads.
    The rank's own output (gloo's connection retries, torch's warnings) goes to a log file, so that
    a failed run is one line from the parent, not four ranks' interleaved stderr."""
    import torch

    directory = Path(job.result_dir)
    with open(directory / f"rank{rank}.log", "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        torch.save(_run_rank(rank, job, progress), directory / f"rank{rank}.pt")
    except Exception as error:
        (directory / f"rank{rank}.error").write_text(described(error))
        sys.exit(1)
