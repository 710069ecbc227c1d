"""Run a torch.distributed.pipelining schedule for real, check its gradients, and profile its ops.

A schedule arrives as torch's "compute_only" CSV: row r lists rank r's actions in order, each
"{stage}{kind}{microbatch}" with kind F (forward), I (input-gradient backward), W (weight-gradient
backward) or B (full backward); an empty cell is an idle slot. zbopt.io.torch_format reads and
checks it and zbopt's simulator looks for a deadlock, before any rank starts. `run_torch` starts
one CPU process per rank (gloo over loopback), cuts a small MLP into the schedule's stages, runs
the CSV with torch's own `_PipelineScheduleRuntime`, times every op inside the ranks, and checks
every gradient against the same model trained in one process. `profile_config` turns the
measured times into a zbopt config, so `zbopt solve` can optimize a schedule for the measured costs.

torch is imported inside the functions that need it, so `import zbopt` works without it
(install the optional extra: pip install 'zbopt[torch]').
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

from zbopt.errors import DeadlockError, ScheduleError, ZboptError
from zbopt.io.torch_format import TORCH_KIND, TorchOrder, read_torch_csv
from zbopt.problem import FUSED_KINDS, SPLIT_KINDS, Problem
from zbopt.simulate import simulate

# torch's action letters for zbopt's F, B, W and fused BW
FORWARD, INPUT_BACKWARD, WEIGHT_BACKWARD, FULL_BACKWARD = (TORCH_KIND[kind] for kind in SPLIT_KINDS + FUSED_KINDS[1:])
KINDS = (FORWARD, INPUT_BACKWARD, WEIGHT_BACKWARD, FULL_BACKWARD)
# torch.testing.assert_close's defaults for float32: the pipelined and the single-process sums of
# microbatch gradients differ only by float rounding order.
RTOL, ATOL = 1.3e-6, 1e-5
# A one-way p2p time is the median of this many ping-pong round trips (after 3 untimed ones), halved.
P2P_ROUNDS = 20
MIB = 2**20


# ---------------------------------------------------------------------------- the schedule file
@dataclass(frozen=True)
class _CheckedCsv:
    """A schedule CSV that passed every check: the file as given, its actions per rank as
    zbopt.io.torch_format reads them, and the Problem of its layout (unit costs: only the order
    was checked, and it is the CSV itself, not the Problem, that the ranks run)."""

    path: str
    order: TorchOrder
    problem: Problem


def _require_torch() -> None:
    try:
        import torch.distributed.pipelining  # noqa: F401
    except ImportError:
        raise ZboptError("running a schedule in torch needs torch: pip install 'zbopt[torch]'") from None


def _zbopt_names(order: TorchOrder) -> str:
    """How the simulator's op names map to the CSV's, for a deadlock message."""
    kinds = {action.kind for actions in order.actions for action in actions}
    names = ["B is torch's I"] if "I" in kinds else []
    if "B" in kinds:
        names.append("B then W is torch's B" if order.split_backward else "BW is torch's B")
    return f" (zbopt's op names: {', '.join(names)})" if names else ""


def _check_csv(path: str | Path) -> _CheckedCsv:
    """Read a compute-only CSV and check it before any rank starts, each error one line naming the
    file and the culprit.

    `read_torch_csv` parses it and infers its layout (ZboptError when the file cannot be read,
    ScheduleError for a malformed cell, a rank without actions, a stage on two ranks or without
    actions, or stages in neither loop nor V placement); `to_schedule` checks that every op comes
    exactly once; torch's own `_validate_schedule` gives a second opinion (it names the rank and
    step where a stage's backward comes before its forward, or its W before its I); the simulator
    raises DeadlockError naming every stuck rank (device) and the op it waits for.
    """
    _require_torch()
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _validate_schedule

    order = read_torch_csv(path)
    problem = order.problem(weight_times=1 if order.split_backward else None)
    schedule = order.to_schedule(problem)
    actions = {
        rank: [_Action(action.stage, _ComputationType(action.kind), action.microbatch) for action in rank_actions]
        for rank, rank_actions in enumerate(order.actions)
    }
    try:
        _validate_schedule(actions, problem.num_devices, problem.num_stages, problem.num_microbatches)
    except AssertionError as error:
        raise ScheduleError(f"{order.source}: torch rejects the schedule: {str(error).splitlines()[0]}") from None
    try:
        simulate(problem, schedule)
    except DeadlockError as error:
        raise DeadlockError(f"{order.source}: {error}{_zbopt_names(order)}") from None
    return _CheckedCsv(str(path), order, problem)


# ---------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ToyModel:
    """The MLP a run trains: `num_stages` stages of `layers_per_stage` (Linear(hidden, hidden), Tanh).

    Weights come from `seed` (torch.manual_seed, then stage by stage), data from a generator seeded
    with `seed`: every rank and the single-process reference build exactly the same model and batches.
    Loss: mean squared error per microbatch; torch's schedule divides the summed microbatch gradients
    by the number of microbatches (scale_grads=True), so the reference uses the mean of the
    microbatch losses.
    """

    num_stages: int
    num_microbatches: int
    microbatch_size: int = 8
    hidden: int = 128
    layers_per_stage: int = 2
    seed: int = 0

    def stage_modules(self) -> list:
        """One torch.nn.Sequential per stage, initialized from `seed` without touching the global RNG."""
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return [
                torch.nn.Sequential(
                    *(
                        layer
                        for _ in range(self.layers_per_stage)
                        for layer in (torch.nn.Linear(self.hidden, self.hidden), torch.nn.Tanh())
                    )
                )
                for _ in range(self.num_stages)
            ]

    def batches(self, steps: int) -> tuple:
        """Inputs and targets, each of shape (steps, num_microbatches * microbatch_size, hidden)."""
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        shape = (steps, self.num_microbatches * self.microbatch_size, self.hidden)
        return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)

    def reference_gradients(self, steps: int) -> list[dict]:
        """Per step, every parameter's gradient ("stage{s}.{name}") from one process: the mean of
        the microbatch losses, backpropagated through the whole model at once."""
        import torch

        modules = self.stage_modules()
        model = torch.nn.Sequential(*modules)
        inputs, targets = self.batches(steps)
        gradients = []
        for step in range(steps):
            model.zero_grad(set_to_none=True)
            losses = [
                torch.nn.functional.mse_loss(model(x), y)
                for x, y in zip(
                    inputs[step].tensor_split(self.num_microbatches),
                    targets[step].tensor_split(self.num_microbatches),
                    strict=True,
                )
            ]
            (sum(losses) / self.num_microbatches).backward()
            gradients.append(_named_gradients(modules, range(self.num_stages)))
        return gradients


def _named_gradients(modules: list, stages) -> dict:
    return {
        f"stage{stage}.{name}": parameter.grad.detach().clone()
        for stage in stages
        for name, parameter in modules[stage].named_parameters()
    }


# ---------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class OpTime:
    """Wall times of one kind of op on one stage, over the timed steps, in seconds."""

    count: int
    mean_s: float
    median_s: float


@dataclass(frozen=True)
class StageReport:
    """What was measured on one stage.

    times[kind] for each kind the stage ran (F, I, W, B), measured with time.perf_counter inside
    the rank around torch's own stage methods, so without the waits for received tensors:
      F  PipelineStage.forward_one_chunk (plus the loss function on the last stage);
      I  backward_one_chunk(full_backward=False): the input gradient; on stage 0 torch skips it
         (no input needs a gradient) and W runs the whole backward (torch stage.py, "Skip the
         backward for the first stage");
      W  backward_weight_one_chunk: the weight gradient;
      B  backward_one_chunk(full_backward=True): input and weight gradients together.
    activation_bytes: bytes of the tensors autograd saves during one microbatch's forward
    (parameters excluded), measured in the warm-up step with saved_tensors_hooks.
    """

    stage: int
    rank: int
    times: dict[str, OpTime]
    activation_bytes: int


@dataclass(frozen=True)
class ParameterCheck:
    """One parameter's gradient against the reference: the largest |difference| over all steps."""

    name: str
    max_abs_diff: float
    passed: bool


@dataclass(frozen=True)
class TorchRunReport:
    """The result of `run_torch`. Times in seconds; step 0 is a warm-up, timed steps are 1..steps-1."""

    path: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    placement: str
    steps: int
    model: ToyModel
    rtol: float
    atol: float
    stages: tuple[StageReport, ...]
    parameters: tuple[ParameterCheck, ...]
    step_time_s: tuple[float, ...]
    p2p_time_s: float | None
    gradients: list[dict] = field(repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """True when every parameter's gradient matches the single-process reference."""
        return all(check.passed for check in self.parameters)

    @property
    def max_abs_diff(self) -> float:
        return max(check.max_abs_diff for check in self.parameters)

    def to_dict(self) -> dict:
        """JSON-able: everything but the gradients themselves."""
        data = dataclasses.asdict(self)
        del data["gradients"]
        data.update(passed=self.passed, max_abs_diff=self.max_abs_diff)
        return data


def compare_gradients(
    got: list[dict], expected: list[dict], rtol: float = RTOL, atol: float = ATOL
) -> tuple[ParameterCheck, ...]:
    """Per parameter, torch.allclose(got, expected, rtol, atol) at every step, and the largest
    |difference|. `got` and `expected` hold one {name: gradient} dict per step."""
    import torch

    checks = []
    for name in expected[0]:
        pairs = [(step_got[name], step_expected[name]) for step_got, step_expected in zip(got, expected, strict=True)]
        diff = max((a - b).abs().max().item() for a, b in pairs)
        checks.append(ParameterCheck(name, diff, all(torch.allclose(a, b, rtol=rtol, atol=atol) for a, b in pairs)))
    return tuple(checks)


# ---------------------------------------------------------------------------- inside a rank
@dataclass(frozen=True)
class _RankJob:
    """What every rank needs; pickled to the worker processes."""

    path: str
    stages_of_rank: tuple[tuple[int, ...], ...]
    model: ToyModel
    steps: int
    store_port: int
    timeout_s: float
    result_dir: str


class _OpRecorder:
    """Wraps a rank's PipelineStage methods: op times (timed steps), saved-activation bytes (step 0),
    and the rank's progress (step, ops done) in shared memory for the parent's timeout message."""

    def __init__(self, modules: list, progress, rank: int):
        self.samples: dict[tuple[int, str], list[float]] = defaultdict(list)
        self.activation_bytes: dict[int, int] = {}
        self.modules, self.progress, self.rank = modules, progress, rank
        self.step = 0

    def start_step(self, step: int) -> None:
        self.step = step
        self.progress[2 * self.rank], self.progress[2 * self.rank + 1] = step, 0

    def _timed(self, stage: int, kind: str, function, *args, **kwargs):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        if self.step > 0:
            self.samples[stage, kind].append(time.perf_counter() - start)
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
            result = self._timed(stage, FORWARD, forward, *args, **kwargs)
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
            return self._timed(stage, FORWARD, forward, *args, **kwargs)

        def timed_backward(*args, **kwargs):
            kind = FULL_BACKWARD if kwargs.get("full_backward", True) else INPUT_BACKWARD
            return self._timed(stage, kind, backward, *args, **kwargs)

        pipeline_stage.forward_one_chunk = timed_forward
        pipeline_stage.backward_one_chunk = timed_backward
        pipeline_stage.backward_weight_one_chunk = lambda *a, **k: self._timed(stage, WEIGHT_BACKWARD, weight, *a, **k)

    def timed_loss(self, loss_fn, last_stage: int):
        """The loss, its time added to the last stage's forward: torch computes it right after that
        forward (`_maybe_compute_loss`), for the same microbatch."""

        def loss(output, target):
            start = time.perf_counter()
            value = loss_fn(output, target)
            if self.step > 0:
                self.samples[last_stage, FORWARD][-1] += time.perf_counter() - start
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


def _run_rank(rank: int, job: _RankJob, progress) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    torch.set_num_threads(1)  # one core per rank at most: ranks share the machine's cores
    world = len(job.stages_of_rank)
    timeout = timedelta(seconds=job.timeout_s)
    store = dist.TCPStore("127.0.0.1", job.store_port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        model, mine = job.model, job.stages_of_rank[rank]
        last = model.num_stages - 1
        modules = model.stage_modules()
        recorder = _OpRecorder(modules, progress, rank)
        shape = (model.microbatch_size, model.hidden)
        stages = []
        for stage in mine:
            # Static shapes (no inference round at the first step); requires_grad marks what gets a gradient.
            pipeline_stage = PipelineStage(
                modules[stage], stage, model.num_stages, torch.device("cpu"),
                input_args=torch.zeros(shape, requires_grad=stage > 0),
                output_args=torch.zeros(shape, requires_grad=True),
            )
            recorder.instrument(pipeline_stage)
            stages.append(pipeline_stage)
        loss_fn = recorder.timed_loss(torch.nn.functional.mse_loss, last)
        schedule = _PipelineScheduleRuntime(stages, model.num_microbatches, loss_fn=loss_fn)
        schedule._load_csv(job.path)
        inputs, targets = model.batches(job.steps)
        gradients, step_times = [], []
        for step in range(job.steps):
            for stage in mine:
                modules[stage].zero_grad(set_to_none=True)
            recorder.start_step(step)
            start = time.perf_counter()
            schedule.step(
                *((inputs[step],) if 0 in mine else ()),
                target=targets[step] if last in mine else None,
                return_outputs=False,
            )
            step_times.append(time.perf_counter() - start)
            gradients.append(_named_gradients(modules, mine))
        p2p = _one_way_p2p_s(rank, world, shape)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {
        "gradients": gradients,
        "samples": dict(recorder.samples),
        "activation_bytes": recorder.activation_bytes,
        "step_time_s": statistics.median(step_times[1:]),
        "p2p_time_s": p2p,
    }


def _rank_main(rank: int, job: _RankJob, progress) -> None:
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
        (directory / f"rank{rank}.error").write_text(_one_line(error))
        sys.exit(1)


def _one_line(error: BaseException) -> str:
    """The error's first line, and its root cause's: torch wraps the real failure, e.g. "Failed to
    run stage backward:" caused by "grad can be implicitly created only for scalar outputs"."""

    def first_line(exception: BaseException) -> str:
        lines = [line.strip() for line in str(exception).splitlines() if line.strip()]
        return f"{type(exception).__name__}: {lines[0] if lines else ''}"

    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    return first_line(error) + (f" (caused by {first_line(root)})" if root is not error else "")


# ---------------------------------------------------------------------------- the parent
def _context():
    """forkserver: torch is imported once in the fork server, not in every rank (~4 s each on a
    small machine); fork itself is unsafe once torch's thread pools run, spawn re-imports torch."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch.distributed.pipelining", __name__])
    return context


def _describe_progress(schedule: _CheckedCsv, progress, ranks) -> str:
    parts = []
    for rank in ranks:
        step, done = progress[2 * rank], progress[2 * rank + 1]
        actions = schedule.order.actions[rank]
        if step < 0:
            parts.append(f"rank {rank} (starting up)")
        elif done < len(actions):
            parts.append(f"rank {rank} (step {step}, waiting to run {actions[done]})")
        else:
            parts.append(f"rank {rank} (step {step}, after its last action)")
    return ", ".join(parts)


def _launch(schedule: _CheckedCsv, model: ToyModel, steps: int, timeout_s: float, result_dir: str) -> list[dict]:
    """Start one process per rank, wait for all of them (or the first failure, or the timeout),
    and return their results in rank order. Workers are killed on any way out."""
    import torch
    import torch.distributed as dist

    # The parent hosts the rendezvous store on a port the OS picks: no race for a free port.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    context = _context()
    world = schedule.problem.num_devices
    progress = context.Array("i", [-1, 0] * world, lock=False)
    # An absolute path: the ranks start in the fork server's working directory, not the caller's.
    path = os.path.abspath(schedule.path)
    job = _RankJob(path, schedule.problem.stages_of_device, model, steps, store.port, timeout_s, result_dir)
    workers = [
        context.Process(target=_rank_main, args=(rank, job, progress), name=f"zbopt-rank-{rank}", daemon=True)
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
                    f"{_describe_progress(schedule, progress, running)}"
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
    microbatch_size, hidden, layers_per_stage, seed : the `ToyModel`.
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
    if steps < 2:
        raise ZboptError(f"steps = {steps}: need at least 2 (step 0 is an untimed warm-up)")
    sizes = {"microbatch_size": microbatch_size, "hidden": hidden, "layers_per_stage": layers_per_stage}
    for name, value in sizes.items():
        if value < 1:
            raise ZboptError(f"{name} = {value}: expected a positive integer")
    if not timeout_s > 0:
        raise ZboptError(f"timeout_s = {timeout_s}: expected a positive number of seconds")
    schedule = _check_csv(path)
    problem = schedule.problem
    model = ToyModel(problem.num_stages, problem.num_microbatches, microbatch_size, hidden, layers_per_stage, seed)
    with tempfile.TemporaryDirectory(prefix="zbopt-torch-") as result_dir:
        results = _launch(schedule, model, steps, timeout_s, result_dir)
    gradients = [
        {name: gradient for result in results for name, gradient in result["gradients"][step].items()}
        for step in range(steps)
    ]
    stages = []
    for stage in range(problem.num_stages):
        rank = problem.device_of(stage)
        samples = results[rank]["samples"]
        times = {
            kind: OpTime(len(values), statistics.fmean(values), statistics.median(values))
            for kind in KINDS
            if (values := samples.get((stage, kind)))
        }
        stages.append(StageReport(stage, rank, times, results[rank]["activation_bytes"][stage]))
    return TorchRunReport(
        path=str(path),
        num_ranks=problem.num_devices,
        num_stages=problem.num_stages,
        num_microbatches=problem.num_microbatches,
        placement=problem.placement,
        steps=steps,
        model=model,
        rtol=rtol,
        atol=atol,
        stages=tuple(stages),
        parameters=compare_gradients(gradients, model.reference_gradients(steps), rtol, atol),
        step_time_s=tuple(result["step_time_s"] for result in results),
        p2p_time_s=results[0]["p2p_time_s"],
        gradients=gradients,
    )


# ---------------------------------------------------------------------------- profiling
def _milliseconds(seconds: float) -> float:
    """Four significant digits (never rounds a positive time to 0)."""
    return float(f"{seconds * 1e3:.4g}")


def profile_config(report: TorchRunReport) -> dict:
    """A zbopt config (the keys of zbopt.io.config) with the run's measured costs.

    Times are medians in milliseconds (medians: ranks share few cores, so a preempted op must not
    skew the mean); per virtual stage in stage order. backward_times is I and weight_times W when
    the schedule split the backward, else backward_times is B. p2p_time is the measured one-way
    time of one activation (0 with a single rank). activation_memory is the saved-activation MiB
    of one microbatch per stage; weight_memory is left to zbopt's default (not measured).

    Raises ZboptError when zbopt's Problem cannot express the run: a backward split on some
    stages and fused on others.
    """
    kinds = {frozenset(stage.times) for stage in report.stages}
    if kinds == {frozenset((FORWARD, INPUT_BACKWARD, WEIGHT_BACKWARD))}:
        backward, weight = INPUT_BACKWARD, WEIGHT_BACKWARD
    elif kinds == {frozenset((FORWARD, FULL_BACKWARD))}:
        backward, weight = FULL_BACKWARD, None
    else:
        raise ZboptError(
            f"{report.path}: some stages split the backward (I, W) and others fuse it (B); "
            "a zbopt config needs one or the other"
        )

    def per_stage(kind: str) -> list[float]:
        return [_milliseconds(stage.times[kind].median_s) for stage in report.stages]

    config = {
        "num_stages": report.num_ranks,
        "num_microbatches": report.num_microbatches,
        "chunks_per_device": report.num_stages // report.num_ranks,
        "placement": report.placement,
        "forward_times": per_stage(FORWARD),
        "backward_times": per_stage(backward),
    }
    if weight is not None:
        config["weight_times"] = per_stage(weight)
    config["p2p_time"] = _milliseconds(report.p2p_time_s) if report.p2p_time_s is not None else 0.0
    config["activation_memory"] = [float(f"{stage.activation_bytes / MIB:.4g}") for stage in report.stages]
    return config


def save_profile(config: dict, path: str | Path, report: TorchRunReport) -> None:
    """Write `config` as YAML (JSON when `path` ends in .json), with a header saying where it came from."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(config, indent=2) + "\n")
        return
    import yaml

    model = report.model
    header = (
        f"# Measured by zbopt profile-torch from {report.path}: {report.num_ranks} CPU ranks (gloo), "
        f"{report.steps - 1} timed steps.\n"
        f"# Model: {report.num_stages} stages x {model.layers_per_stage} (Linear {model.hidden}, Tanh), "
        f"microbatch size {model.microbatch_size}.\n"
        "# Times: median wall time per op in ms (p2p_time: one-way, measured); "
        "activation_memory: saved-activation MiB per microbatch.\n"
    )
    path.write_text(header + yaml.safe_dump(config, sort_keys=False, default_flow_style=None))


def profile_torch(path: str | Path, output: str | Path | None = None, **run_options) -> tuple[TorchRunReport, dict]:
    """`run_torch(path, **run_options)`, then `profile_config`; writes it to `output` when given.

    Raises ZboptError when the gradients do not match the reference: a wrong run is not profiled.
    """
    report = run_torch(path, **run_options)
    if not report.passed:
        raise ZboptError(
            f"{path}: gradients differ from the single-process reference (max abs diff {report.max_abs_diff:.3g}); "
            "not profiling a wrong run"
        )
    config = profile_config(report)
    if output is not None:
        save_profile(config, output, report)
    return report, config


def format_report(report: TorchRunReport) -> str:
    """The per-stage table of median op times (ms) and the gradient verdict, for the command line."""
    lines = [
        f"{report.path}: {report.num_ranks} ranks, {report.num_stages} stages "
        f"({report.placement} placement), {report.num_microbatches} microbatches, "
        f"{report.steps - 1} timed steps; median ms per op, saved activations per microbatch",
        f"{'stage':>5} {'rank':>4} {'F ms':>8} {'I ms':>8} {'W ms':>8} {'B ms':>8} {'act KiB':>8}",
    ]
    for stage in report.stages:
        cells = [
            f"{stage.times[kind].median_s * 1e3:8.3f}" if kind in stage.times else f"{'-':>8}" for kind in KINDS
        ]
        lines.append(f"{stage.stage:>5} {stage.rank:>4} {' '.join(cells)} {stage.activation_bytes / 1024:8.1f}")
    p2p = f"{report.p2p_time_s * 1e3:.3f} ms" if report.p2p_time_s is not None else "none (one rank)"
    lines.append(f"step time {max(report.step_time_s) * 1e3:.2f} ms (slowest rank, median); one-way p2p {p2p}")
    verdict = "match" if report.passed else "DIFFER FROM"
    failed = [check.name for check in report.parameters if not check.passed]
    lines.append(
        f"gradients {verdict} the single-process reference (max abs diff {report.max_abs_diff:.3g}; "
        f"rtol {report.rtol:g}, atol {report.atol:g}; {len(report.parameters)} parameters, {report.steps} steps)"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return "\n".join(lines)
