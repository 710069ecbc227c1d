"""The parent's side of a run: check the CSV, start one process per rank, wait for them (or the
first failure, or the timeout), and assemble the report."""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

from zbopt.core.errors import ZboptError
from zbopt.core.problem import Problem
from zbopt.core.simulation import simulate
from zbopt.interfaces.runtime.check import CheckedCsv, check_csv
from zbopt.interfaces.runtime.model import CutModel, ToyModel
from zbopt.interfaces.runtime.rank import RankJob, rank_main
from zbopt.interfaces.runtime.run_report import (
    ATOL,
    OP_KINDS,
    RTOL,
    OpTime,
    StageReport,
    TorchRunReport,
    compare_gradients,
)
from zbopt.io.torch_format import torch_comms_csv
from zbopt.io.write import write_file

__all__ = ["LOWERINGS", "run_torch"]

LOWERINGS = ("torch", "zbopt")  # who adds the sends, receives and REDUCE_GRAD to the compute-only CSV


def _context():
    """forkserver: torch is imported once in the fork server, not in every rank (~4 s each on a
    small machine); fork itself is unsafe once torch's thread pools run, spawn re-imports torch."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch.distributed.pipelining", rank_main.__module__])
    return context


def _describe_progress(schedule: CheckedCsv, progress, ranks, replicas: int) -> str:
    parts = []
    for rank in ranks:
        step, done = progress[2 * rank], progress[2 * rank + 1]
        actions = schedule.order.actions[rank // replicas]
        if step < 0:
            parts.append(f"rank {rank} (starting up)")
        elif done < len(actions):
            parts.append(f"rank {rank} (step {step}, waiting to run {actions[done]})")
        else:
            parts.append(f"rank {rank} (step {step}, after its last action)")
    return ", ".join(parts)


def _launch(schedule: CheckedCsv, model: ToyModel | CutModel, steps: int, timeout_s: float,
            result_dir: str, replicas: int = 1, lowered: str | None = None) -> list[dict]:
    """Start one process per rank of each of the `replicas` pipelines, wait for all of them (or the
    first failure, or the timeout), and return their results in process order (pipeline rank *
    replicas + replica). The ranks run the CSV, or `lowered` (a compute_comms CSV of it) where
    given. Workers are killed on any way out."""
    import torch
    import torch.distributed as dist

    # The parent hosts the rendezvous store on a port the OS picks: no race for a free port.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    context = _context()
    world = schedule.problem.num_devices * replicas
    progress = context.Array("i", [-1, 0] * world, lock=False)
    # An absolute path: the ranks start in the fork server's working directory, not the caller's.
    path = os.path.abspath(lowered or schedule.path)
    job = RankJob(path, schedule.problem.stages_of_device, model, steps, store.port, timeout_s, result_dir,
                  replicas, "compute_only" if lowered is None else "compute_comms")
    workers = [
        context.Process(target=rank_main, args=(rank, job, progress), name=f"zbopt-rank-{rank}", daemon=True)
        for rank in range(world)
    ]
    deadline = time.monotonic() + timeout_s
    try:
        for worker in workers:
            worker.start()
        while True:
            running = [rank for rank, worker in enumerate(workers) if worker.exitcode is None]
            remaining = deadline - time.monotonic()
            if running and remaining <= 0:  # first: past the deadline, the ranks' own timeouts fire too
                raise ZboptError(
                    f"{schedule.path}: no result within {timeout_s:g} s, ranks killed; still running: "
                    f"{_describe_progress(schedule, progress, running, replicas)}"
                )
            failed = [rank for rank, worker in enumerate(workers) if worker.exitcode not in (None, 0)]
            if failed:
                raise ZboptError(f"{schedule.path}: {_failure(failed, workers, result_dir)}")
            if not running:
                break
            wait([workers[rank].sentinel for rank in running], timeout=remaining)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
            if worker.pid is not None:
                worker.join()
    return [torch.load(Path(result_dir) / f"rank{rank}.pt") for rank in range(world)]


def _failure(failed: list[int], workers: list, result_dir: str) -> str:
    """The first failed rank with an error message of its own (others often fail because of it)."""
    for rank in failed:
        message = Path(result_dir) / f"rank{rank}.error"
        if message.exists():
            return f"rank {rank} failed: {message.read_text()}"
    rank = failed[0]
    return f"rank {rank} died (exit code {workers[rank].exitcode})"


def run_torch(
    path: str | Path,
    *,
    steps: int = 3,
    microbatch_size: int = 8,
    hidden: int = 128,
    layers_per_stage: int = 2,
    seed: int = 0,
    timeout_s: float = 120.0,
    rtol: float = RTOL,
    atol: float = ATOL,
    model: str | None = None,
    split: Sequence[int] | None = None,
    folder: str | None = None,
    data_parallel: int = 1,
    lowering: str = "torch",
) -> TorchRunReport:
    """Run a compute-only schedule CSV in torch.distributed.pipelining and check its gradients.

    One CPU process per CSV row (rank), gloo over 127.0.0.1, one thread each. The model is a
    `ToyModel` cut into the CSV's stages (a rank holds the stages its row names, in loop or V
    placement); n_microbatches is the CSV's. `steps` training steps run with the
    gradients zeroed before each (no optimizer: every step's gradients are compared exactly);
    step 0 is a warm-up (torch's stage set-up, activation sizes) and not timed, so steps >= 2.

    The ranks are forked from a multiprocessing fork server (started once, torch preloaded), which
    imports the caller's main module: in a script, call this under `if __name__ == "__main__":`.

    Parameters
    ----------
    path : the CSV, torch's "compute_only" format (one row per rank, cells like "2I1").
    steps : training steps, the first untimed.
    microbatch_size, hidden, layers_per_stage, seed : the `ToyModel`; `seed` also a user's model's.
    model, split, folder : instead of the toy model, the user's model `PACKAGE.MODULE:FACTORY`
        (its module looked for in `folder`, default the working folder) cut into virtual stages of
        `split[s]` layers (`CutModel`; the toy model's sizes are then not used).
    data_parallel : replicas of the pipeline (toy model only), each on its own share of a batch that
        many times as large, their stages replicated over a data-parallel group (torch's
        `replicate`): the gradients must still be the single-process reference's, on every replica.
    lowering : "torch" (its runtime lowers the compute-only CSV itself) or "zbopt": the ranks run
        zbopt's compute_comms CSV of the same order (`torch_comms_csv`, from the CSV's order
        simulated at unit costs), sends, receives and REDUCE_GRAD placed by zbopt.
    timeout_s : the whole run's limit; past it every rank is killed.
    rtol, atol : torch.allclose tolerances of the gradient check (defaults: torch.testing's for float32).

    Returns
    -------
    TorchRunReport: per parameter passed/failed with its largest |difference| from the
    single-process reference, per stage the op times and saved-activation bytes, per rank the
    median step time, and the measured one-way p2p time.

    Raises
    ------
    ZboptError (or its ScheduleError / DeadlockError) with one line naming the culprit: the file,
    a cell, a rank or stage, the actions a deadlock waits on, a rank's own error, or the ranks
    still running at the timeout.
    """
    _check_options(steps, {"microbatch_size": microbatch_size, "hidden": hidden, "layers_per_stage": layers_per_stage,
                           "data_parallel": data_parallel}, timeout_s, {"rtol": rtol, "atol": atol})
    if lowering not in LOWERINGS:
        raise ZboptError(f"lowering = {lowering!r}: expected one of {', '.join(LOWERINGS)}")
    schedule = check_csv(path)
    problem = schedule.problem
    if model is None:
        trained = ToyModel(problem.num_stages, problem.num_microbatches, microbatch_size, hidden, layers_per_stage,
                           seed, data_parallel)
    else:
        trained = _own_model(path, problem, model, split, folder, seed, data_parallel)
    with tempfile.TemporaryDirectory(prefix="zbopt-torch-") as result_dir:
        lowered = None
        if lowering == "zbopt":
            lowered = str(Path(result_dir) / "lowered.csv")
            write_file(lowered, torch_comms_csv(simulate(problem, schedule.order.to_schedule(problem))))
        results = _launch(schedule, trained, steps, timeout_s, result_dir, data_parallel, lowered)
    return _report(str(path), problem, trained, steps, results, rtol, atol, data_parallel)


def _own_model(path, problem, model: str, split: Sequence[int] | None, folder: str | None, seed: int,
               data_parallel: int) -> CutModel:
    """The user's model `model` cut into the CSV's stages by `split`, checked before any rank starts."""
    if data_parallel > 1:
        raise ZboptError(f"data_parallel = {data_parallel}: runs the toy model only (a model of your own runs one "
                         "pipeline)")
    if split is None or len(split) != problem.num_stages:
        raise ZboptError(f"{path}: {problem.num_stages} stages, but the split has "
                         f"{'none' if split is None else len(split)} (layers per stage)")
    trained = CutModel(model, tuple(split), problem.num_microbatches, seed, os.path.abspath(folder or os.getcwd()))
    trained.check()
    return trained


def _check_options(steps: int, sizes: dict[str, int], timeout_s: float, tolerances: dict[str, float]) -> None:
    """Each option in its range, before any rank starts (a wrong tolerance would fail only after the run)."""
    if steps < 2:
        raise ZboptError(f"steps = {steps}: need at least 2 (step 0 is an untimed warm-up)")
    for name, value in sizes.items():
        if value < 1:
            raise ZboptError(f"{name} = {value}: expected a positive integer")
    if not timeout_s > 0:
        raise ZboptError(f"timeout_s = {timeout_s}: expected a positive number of seconds")
    for name, value in tolerances.items():
        if not value >= 0:  # torch.allclose would fail inside the check, after the whole run
            raise ZboptError(f"{name} = {value}: expected a tolerance >= 0")


def _stage_reports(problem: Problem, results: list[dict]) -> tuple[StageReport, ...]:
    """Per stage, from its rank's samples: each kind of op's count, mean and median time, and the
    bytes one microbatch's forward saved."""
    stages = []
    for stage in range(problem.num_stages):
        rank = problem.device_of(stage)
        samples = results[rank]["samples"]
        times = {
            kind: OpTime(len(values), statistics.fmean(values), statistics.median(values))
            for kind in OP_KINDS
            if (values := samples.get((stage, kind)))
        }
        stages.append(StageReport(stage, rank, times, results[rank]["activation_bytes"][stage]))
    return tuple(stages)


def _report(path: str, problem: Problem, model: ToyModel | CutModel, steps: int, processes: list[dict], rtol: float,
            atol: float, replicas: int = 1) -> TorchRunReport:
    """The processes' results (in process order) as one report: the first replica's ranks' times and
    gradients, every replica's gradients checked against the reference (a later replica's
    parameters named "replica{k}/stage...")."""
    results = processes[::replicas]
    gradients = [
        {name: gradient for result in results for name, gradient in result["gradients"][step].items()}
        for step in range(steps)
    ]
    checked = [
        {f"replica{process % replicas}/" * (process % replicas > 0) + name: gradient
         for process, result in enumerate(processes) for name, gradient in result["gradients"][step].items()}
        for step in range(steps)
    ]
    reference = model.reference_gradients(steps)
    expected = [{f"replica{k}/" * (k > 0) + name: value for k in range(replicas) for name, value in step.items()}
                for step in reference]
    return TorchRunReport(
        path=path,
        num_ranks=problem.num_devices,
        num_stages=problem.num_stages,
        num_microbatches=problem.num_microbatches,
        placement=problem.placement,
        steps=steps,
        model=model,
        rtol=rtol,
        atol=atol,
        stages=_stage_reports(problem, results),
        parameters=compare_gradients(checked, expected, rtol, atol),
        step_time_s=tuple(result["step_time_s"] for result in results),
        p2p_time_s=results[0]["p2p_time_s"],
        gradients=gradients,
        intervals=tuple((rank, *interval) for rank, result in enumerate(results) for interval in result["intervals"]),
    )
