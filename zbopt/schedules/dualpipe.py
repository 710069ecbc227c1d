"""DeepSeek's DualPipe family: DualPipeV ("DualPipe cut in half"), V placement, two chunks per device.

Notes
-----
Only DualPipeV is registered. The full bidirectional DualPipe [1]_ runs half its microbatches
through the stages on devices 0..p-1 and the other half on devices p-1..0, so a stage's device
depends on the microbatch, while a zbopt Problem places each stage on one device for every
microbatch. DualPipeV, Sea AI Lab's "cut-in-half" of it [2]_, places stages r and 2p-1-r on
device r for every microbatch.

References
----------
.. [1] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, 2024, Section 3.2.1 (DualPipe).
.. [2] deepseek-ai/DualPipe, README ("DualPipeV" and the table "Pipeline Bubbles and Memory Usage
   Comparison") and dualpipev.py (`DualPipeV.step`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from zbopt.ops import Op
from zbopt.problem import FORWARD, WEIGHT, Problem
from zbopt.schedule import Schedule
from zbopt.schedules.common import backward_ops, input_gradient, iteration_microbatches
from zbopt.schedules.registry import register, require


class _DeviceProgram:
    """One device's order for one iteration, built the way dualpipev.py issues its chunks: each
    stage takes its forwards and backwards in microbatch order, and a backward that defers its
    weight gradient ("zero bubble") leaves W in a queue that `weight` empties oldest first."""

    def __init__(self, problem: Problem, microbatches: Sequence[int]):
        self.problem = problem
        self.microbatches = microbatches
        self.order: list[Op] = []
        self._forwarded: Counter[int] = Counter()
        self._backwarded: Counter[int] = Counter()
        self._deferred_weights: deque[Op] = deque()

    def forward(self, stage: int) -> None:
        self.order.append(Op(FORWARD, stage, self.microbatches[self._forwarded[stage]]))
        self._forwarded[stage] += 1

    def backward(self, stage: int, defer_weight: bool = False) -> None:
        """A full backward (B then W, or BW when fused), or B alone with W queued for later.
        A fused problem cannot defer: its backward runs whole where B would run."""
        microbatch = self.microbatches[self._backwarded[stage]]
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


def _dualpipe_v_device_order(problem: Problem, device: int, microbatches: Sequence[int]) -> list[Op]:
    """The eight steps of DualPipeV.step for rank `device`. Chunk 0 is stage `device` (going down
    the V), chunk 1 is stage 2p-1-device (coming back up). An overlapped pair "F&B" is its forward
    then its full backward, the order dualpipev.py runs them in when it does not overlap."""
    p, m, r = problem.num_devices, len(microbatches), device
    down, up = problem.stages_of_device[device]
    program = _DeviceProgram(problem, microbatches)
    for _ in range(2 * (p - r - 1)):  # step 1: nF0
        program.forward(down)
    for _ in range(r + 1):  # step 2: nF0F1
        program.forward(down)
        program.forward(up)
    for _ in range(p - r - 1):  # step 3: nB1W1F1, zero bubble
        program.backward(up, defer_weight=True)
        program.weight()
        program.forward(up)
    for _ in range(m - 2 * p + r + 1):  # step 4, the main step: nF0B1F1B0 as (F0&B1)(F1&B0)
        program.forward(down)
        program.backward(up)
        program.forward(up)
        program.backward(down)
    for _ in range(p - r - 1):  # step 5: nB1F1B0 as B1 (F1&B0)
        program.backward(up)
        program.forward(up)
        program.backward(down)
    for i in range(2 * (r + 1)):  # step 6: nB1B0; the second half defer their W (zero bubble)
        program.backward(up if i % 2 == 0 else down, defer_weight=i >= r + 1)
    for _ in range(p - r - 1):  # step 7: nWB0, zero bubble
        program.weight()
        program.backward(down, defer_weight=True)
    for _ in range(r + 1):  # step 8: nW
        program.weight()
    return program.order


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
    zbopt runs one op at a time per device, so it does not capture what DualPipe is built for:
    overlapping the computation of a forward chunk with the backward of another and hiding their
    communication behind each other. An overlapped pair F&B costs F + B + W here (F, then the full
    backward B and W); F starts without waiting for the gradient its partner B needs, and its output
    leaves when F ends rather than when the pair ends. So the README's bubble (p-1)(F&B + B - 3W)
    [1]_ is not what the model gives: with uniform costs, no latency and B <= F <= B + W the bubble
    (makespan minus a device's work) is (p-1)(F + max(0, B - W)) in zbopt's units.

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
    orders = [[op for microbatches in iteration_microbatches(problem)
               for op in _dualpipe_v_device_order(problem, device, microbatches)]
              for device in range(p)]
    return Schedule(orders)
