"""DeepSeek's DualPipe family: the bidirectional DualPipe and DualPipeV ("DualPipe cut in half").

DualPipe [1]_ runs half its microbatches down the pipeline (devices 0..p-1) and the other half up
it (devices p-1..0), each device holding a copy of a stage for each way: zbopt's placement
"bidirectional" (`Problem.routes`). DualPipeV, Sea AI Lab's "cut-in-half" of it [2]_, places
stages r and 2p-1-r on device r for every microbatch (placement "v", two chunks per device).

References
----------
.. [1] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, 2024, Section 3.2.1
   (DualPipe); deepseek-ai/DualPipe, dualpipe.py (`DualPipe.step`).
.. [2] deepseek-ai/DualPipe, README ("DualPipeV" and the table "Pipeline Bubbles and Memory Usage
   Comparison") and dualpipev.py (`DualPipeV.step`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence

from zbopt.core.kinds import FORWARD, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.common import backward_ops, input_gradient, iteration_microbatches, require_two_ways
from zbopt.schedules.registry import register, require

__all__ = ["dualpipe", "dualpipe_v"]


class _DeviceProgram:
    """One device's order for one iteration, built the way dualpipe.py and dualpipev.py issue their
    chunks: each stage takes its forwards and backwards in microbatch order (of `microbatches`,
    by stage), and a backward that defers its weight gradient ("zero bubble") leaves W in a queue
    that `weight` empties oldest first."""

    def __init__(self, problem: Problem, microbatches: Mapping[int, Sequence[int]]):
        self.problem = problem
        self.microbatches = microbatches
        self.order: list[Op] = []
        self.pairs: list[tuple[Op, ...]] = []
        self._forwarded: Counter[int] = Counter()
        self._backwarded: Counter[int] = Counter()
        self._deferred_weights: deque[Op] = deque()

    def forward(self, stage: int) -> None:
        self.order.append(Op(FORWARD, stage, self.microbatches[stage][self._forwarded[stage]]))
        self._forwarded[stage] += 1

    def backward(self, stage: int, defer_weight: bool = False) -> None:
        """A full backward (B then W, or BW when fused), or B alone with W queued for later.
        A fused problem cannot defer: its backward runs whole where B would run."""
        microbatch = self.microbatches[stage][self._backwarded[stage]]
        self._backwarded[stage] += 1
        if defer_weight and self.problem.split_backward:
            self.order.append(input_gradient(self.problem, stage, microbatch))
            self._deferred_weights.append(Op(WEIGHT, stage, microbatch))
        else:
            self.order += backward_ops(self.problem, stage, microbatch)

    def weight(self) -> None:
        """The oldest deferred W, if any is waiting."""
        if self._deferred_weights:
            self.order.append(self._deferred_weights.popleft())

    def overlapped(self, forward_stage: int, backward_stage: int, overlap: bool = True) -> None:
        """F&B: a forward and another microbatch's full backward, one overlapped pair (FBW) when
        `overlap` and the problem gives that pair kind a cost, else F then the backward (as the
        scripts run it without an overlapped module)."""
        first = len(self.order)
        self.forward(forward_stage)
        self.backward(backward_stage)
        if overlap and self.problem.pairs is not None and "FBW" in self.problem.pairs.kinds:
            self.pairs.append(tuple(self.order[first:]))


def _first_five_steps(program: _DeviceProgram, first: int, second: int, *, ahead: int, fill: int, main: int,
                      apart: bool) -> None:
    """Steps 1 to 5 of both scripts on one rank, `first` its phase-0 stage and `second` its
    phase-1 stage: nF0 (2·ahead), nF0F1 (fill), nB1W1F1 (ahead, zero bubble), the main step
    n(F0&B1)(F1&B0) (main; its first F0 and B1 not overlapped when `apart`), nB1(F1&B0) (ahead)."""
    for _ in range(2 * ahead):  # step 1: nF0
        program.forward(first)
    for _ in range(fill):  # step 2: nF0F1
        program.forward(first)
        program.forward(second)
    for _ in range(ahead):  # step 3: nB1W1F1, zero bubble
        program.backward(second, defer_weight=True)
        program.weight()
        program.forward(second)
    for i in range(main):  # step 4, the main step: nF0B1F1B0 as (F0&B1)(F1&B0)
        program.overlapped(first, second, overlap=i > 0 or not apart)
        program.overlapped(second, first)
    for _ in range(ahead):  # step 5: nB1F1B0 as B1 (F1&B0)
        program.backward(second)
        program.overlapped(second, first)


def _last_two_steps(program: _DeviceProgram, first: int, *, ahead: int, fill: int) -> None:
    """Steps 7 and 8 of both scripts: nWB0 (ahead, zero bubble), then nW (fill) empties the
    deferred weight gradients."""
    for _ in range(ahead):  # step 7: nWB0
        program.weight()
        program.backward(first, defer_weight=True)
    for _ in range(fill):  # step 8: nW
        program.weight()


def _dualpipe_v_device_program(problem: Problem, device: int, microbatches: Sequence[int]) -> _DeviceProgram:
    """The eight steps of DualPipeV.step for rank `device`. Chunk 0 is stage `device` (going down
    the V), chunk 1 is stage 2p-1-device (coming back up). Each F&B is an overlapped pair when
    the problem gives an FBW cost, else its forward then its full backward, the order dualpipev.py
    runs them in when it does not overlap."""
    p, m, r = problem.num_devices, len(microbatches), device
    down, up = problem.stages_of_device[device]
    program = _DeviceProgram(problem, {down: microbatches, up: microbatches})
    # the last rank (the V's bottom) keeps its first F0 and B1 apart, as dualpipev.py does
    _first_five_steps(program, down, up, ahead=p - r - 1, fill=r + 1, main=m - 2 * p + r + 1, apart=r == p - 1)
    for i in range(2 * (r + 1)):  # step 6: nB1B0; the second half defer their W (zero bubble)
        program.backward(up if i % 2 == 0 else down, defer_weight=i >= r + 1)
    _last_two_steps(program, down, ahead=p - r - 1, fill=r + 1)
    return program


def _dualpipe_v_memory(problem: Problem) -> list[float]:
    """The README table's DualPipeV activation PP+1 with PP = 2p stages: device r holds at most
    2p-r microbatches on its down stage r and r+1 on its up stage 2p-1-r, 2p+1 in all."""
    p = problem.num_devices
    return [(2 * p - r) * problem.activation_memory[down] + (r + 1) * problem.activation_memory[up]
            for r, (down, up) in enumerate(problem.stages_of_device)]


@register("dualpipe-v", "DualPipeV (deepseek-ai/DualPipe, 2025): DualPipe cut in half, V placement, 2 chunks/device",
          _dualpipe_v_memory)
def dualpipe_v(problem: Problem) -> Schedule:
    """DualPipeV: device r holds stages r and 2p-1-r and runs the eight steps of dualpipev.py [1]_.

    Per iteration, as torch's ScheduleDualPipeV [2]_ spells them too: nF0, nF0F1, nB1W1F1,
    n(F0&B1)(F1&B0), nB1(F1&B0), nB1B0, nWB0, nW.

    Needs chunks_per_device = 2, placement "v" and m >= 2p microbatches, as dualpipev.py asserts
    (num_chunks >= num_ranks * 2; torch: n_microbatches >= number of stages). Any p >= 1: unlike
    the full DualPipe, DualPipeV does not need an even number of devices.

    Notes
    -----
    With an FBW cost in `Problem.overlap_times`, each F&B the script overlaps is one overlapped
    pair (all of the main step's but the last rank's first F0 and B1, which dualpipev.py keeps
    apart "to further reduce bubble size"; step 5's F1&B0), and the README's bubble (PP/2 - 1)(F&B
    + B - 3W) holds under its assumptions (`tests/test_overlap.py`). Without one, a pair runs as F
    then the full backward, costing F + B + W: F starts without waiting for the gradient its
    partner B needs, and its output leaves when F ends rather than when the pair ends. The
    bubble (makespan minus a device's work) is then, with uniform costs, no latency and B <= F <=
    B + W, (p-1)(F + max(0, B - W)) in zbopt's units.

    A full backward in the split model is B then W back to back; "zero bubble" steps run B and
    queue W for later. With a fused backward (F, BW) no W can be deferred, so every backward runs
    whole.

    Peak memory: 2p - r microbatches on stage r and r + 1 on stage 2p-1-r, the README's PP + 1 [1]_
    with PP = 2p stages.

    References
    ----------
    .. [1] deepseek-ai/DualPipe, README ("DualPipeV"; "Pipeline Bubbles and Memory Usage
       Comparison") and dualpipev.py (`DualPipeV.step`).
    .. [2] torch.distributed.pipelining, `ScheduleDualPipeV`, the same eight steps.
    """
    name = "dualpipe-v"
    require(problem.chunks_per_device == 2, name, "chunks_per_device = 2 (two chunks per device)")
    require(problem.placement == "v", name, "placement 'v' (stages r and 2p-1-r on device r)")
    p, m = problem.num_devices, problem.num_microbatches
    require(m >= 2 * p, name, f"num_microbatches >= 2 * num_devices (m >= 2p = {2 * p}, got m = {m})")
    programs = [[_dualpipe_v_device_program(problem, device, microbatches)
                 for microbatches in iteration_microbatches(problem)] for device in range(p)]
    orders = [[op for program in device_programs for op in program.order] for device_programs in programs]
    return Schedule(orders, pairs=[pair for device_programs in programs for program in device_programs
                                   for pair in program.pairs])


def _dualpipe_device_program(problem: Problem, device: int) -> _DeviceProgram:
    """The eight steps of DualPipe.step for rank `device`. Phase 0 is the stage copy the rank
    holds in the first half of its route (rank r < p/2: the down stage r; else the up stage
    2p-1-r), phase 1 the other; h = min(r, p-1-r) is the rank's distance from the nearer end."""
    p = problem.num_devices
    half, h = p // 2, min(device, p - 1 - device)
    down, up = device, 2 * p - 1 - device
    first, second = (down, up) if device < half else (up, down)
    program = _DeviceProgram(problem, {stage: problem.microbatches_of(stage) for stage in (down, up)})
    chunks = problem.num_microbatches // 2  # per way: dualpipe.py's half_num_chunks
    # the middle ranks keep their first F0 and B1 apart, as dualpipe.py does
    _first_five_steps(program, first, second, ahead=half - h - 1, fill=h + 1, main=chunks - p + h + 1,
                      apart=h == half - 1)
    deferring = False
    for i in range(h + 1):  # step 6: nB1B0; from the middle of the step on, W is deferred (zero bubble)
        deferring = deferring or (i == (h + 1) // 2 and h % 2 == 1)
        program.backward(second, defer_weight=deferring)
        deferring = deferring or (i == (h + 1) // 2 and h % 2 == 0)
        program.backward(first, defer_weight=deferring)
    _last_two_steps(program, first, ahead=half - h - 1, fill=h + 1)
    return program


def _dualpipe_memory(problem: Problem) -> list[float]:
    """The README table's DualPipe activation PP+1 with PP = p: device r holds at most p-r
    microbatches on its down stage r and r+1 on its up stage 2p-1-r, p+1 in all."""
    p = problem.num_devices
    return [(p - r) * problem.activation_memory[r] + (r + 1) * problem.activation_memory[2 * p - 1 - r]
            for r in range(p)]


@register("dualpipe", "DualPipe (DeepSeek-V3, 2024): bidirectional, half the microbatches each way, 2 stage "
                      "copies/device", _dualpipe_memory, bidirectional=True)
def dualpipe(problem: Problem) -> Schedule:
    """DualPipe: half the microbatches down the pipeline, half up, each rank running the eight
    steps of dualpipe.py [1]_: nF0, nF0F1, nB1W1F1, n(F0&B1)(F1&B0), nB1(F1&B0), nB1B0, nWB0, nW.

    Needs the bidirectional placement (`Problem`: chunks_per_device = 2, one iteration), an even
    p and an even m >= 2p counting both ways, as dualpipe.py asserts (num_ranks % 2 == 0,
    num_chunks % 2 == 0 and num_chunks >= 2 num_ranks).

    Notes
    -----
    In step 6 dualpipe.py starts deferring W halfway: a rank at an odd distance h from the nearer
    end before the middle pair's B1, at an even one between its B1 and B0; zbopt does the same.
    With an FBW cost in `Problem.overlap_times` each F&B the script overlaps is one overlapped
    pair (all of the main step's but the middle ranks' first F0 and B1, which dualpipe.py keeps
    apart "to further reduce bubble size"; step 5's F1&B0); without one it runs as F then the
    full backward (B and W), the order dualpipe.py runs it in without an overlapped module.

    References
    ----------
    .. [1] deepseek-ai/DualPipe, dualpipe.py (`DualPipe.step`); DeepSeek-AI, "DeepSeek-V3
       Technical Report", arXiv:2412.19437, 2024, Section 3.2.1.
    """
    name = "dualpipe"
    require_two_ways(problem, name, 2)
    p, m = problem.num_devices, problem.num_microbatches
    require(m % 2 == 0 and m >= 2 * p, name, f"an even num_microbatches >= 2 * num_devices (m >= {2 * p}, got m = {m})")
    programs = [_dualpipe_device_program(problem, device) for device in range(p)]
    return Schedule([program.order for program in programs],
                    pairs=[pair for program in programs for pair in program.pairs])
