"""What a run measured and whether its gradients match the reference: the report, the gradient
check, and the report as a table for the command line."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from zbopt.interfaces.runtime.model import CutModel, ToyModel
from zbopt.io.torch_format import TORCH_FORWARD, TORCH_FULL_BACKWARD, TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD

__all__ = ["ATOL", "OP_KINDS", "RTOL", "OpTime", "ParameterCheck", "StageReport", "TorchRunReport",
           "compare_gradients", "format_report"]

# the kinds of op a stage can run, in the table's column order
OP_KINDS = (TORCH_FORWARD, TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD, TORCH_FULL_BACKWARD)
# torch.testing.assert_close's defaults for float32: the pipelined and the single-process sums of
# microbatch gradients differ only by float rounding order.
RTOL, ATOL = 1.3e-6, 1e-5


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
    model: ToyModel | CutModel
    rtol: float
    atol: float
    stages: tuple[StageReport, ...]
    parameters: tuple[ParameterCheck, ...]
    step_time_s: tuple[float, ...]
    p2p_time_s: float | None
    gradients: list[dict] = field(repr=False, compare=False)
    # the last step's ops as (rank, stage, torch kind, microbatch, start s, end s), one clock for all ranks
    intervals: tuple[tuple[int, int, str, int, float, float], ...] = field(default=(), repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """True when every parameter's gradient matches the single-process reference."""
        return all(check.passed for check in self.parameters)

    @property
    def max_abs_diff(self) -> float:
        return max(check.max_abs_diff for check in self.parameters)

    def to_dict(self) -> dict:
        """JSON-able: everything but the gradients themselves and the last step's raw intervals (on the
        machine's monotonic clock; `zbopt.io.trace.measured_trace` turns them into a trace)."""
        data = dataclasses.asdict(self)
        del data["gradients"], data["intervals"]
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
            f"{stage.times[kind].median_s * 1e3:8.3f}" if kind in stage.times else f"{'-':>8}" for kind in OP_KINDS
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
