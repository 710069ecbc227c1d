"""BitPipe (Wu et al., 2024): two V-shaped interleaved pipelines in opposite directions.

Each device holds four chunks: two of the down pipeline's copy of the model, whose microbatches
run a V (devices 0..p-1, then back p-1..0), and two of the up copy, a V mirrored (p-1..0, then
0..p-1): zbopt's placement "bidirectional" with chunks_per_device = 4 (`Problem.routes`). The
turn of each V is on one device, so it sends nothing ([1]_: "turns cross-device communication
into local copies").

The schedule is the authors' two figures [2]_, read op for op (tests/test_bitpipe.py holds them
as data): BitPipe-v.svg (p = 4, 4 microbatches) and scale-moreb.svg (8 microbatches, two *rounds*
of p, then a flush). In unit slots, a forward one slot and a backward two:

- a round sends p/2 microbatches each way, the k-th entering its pipeline at slot 2k; the forward
  of its i-th stage on the route is due at slot 2k + i. For an even p, the two ways' forwards
  never fall due in the same slot of a device (the parities of d and p-1-d differ), so each
  device's forwards take that order: the figures' order, round after round;
- a device that is free runs a backward as soon as one is ready (the earliest ready first), else
  its next forward once that is ready; it starts the next round's forwards only while the op it
  waits for is the last of its round (scale-moreb.svg: device 0 runs microbatches 5 and 6 in the
  two slots before microbatch 2's last backward; devices 1 and 2 start round two after round one).

The orders come from that template; the problem's own costs then time them (`simulate`): with
F = 1 and B = 2, 28 slots for the first figure and 53 for the second (its "Flush" line). Only the
orders are the figures'; where BitPipe-v.svg leaves device 0 idle in slot 1 (microbatch 2 enters
at slot 2), the template and the simulator start it at once. With a split backward each W runs
right after its B.

References
----------
.. [1] H. Wu, L. Chen, W. Yu, "BitPipe: Bidirectional Interleaved Pipeline Parallelism for
   Accelerating Large Models Training", arXiv:2410.19367 (2024), abstract and §1.
.. [2] wuhouming/BitPipe (the authors' Megatron-LM fork), README figures
   docs/BitPipe_images/BitPipe-v.svg (right panel, "BitPipe") and docs/BitPipe_images/scale-moreb.svg
   (lower panel; its upper one repeats BitPipe-v.svg).
"""

from __future__ import annotations

import heapq

from zbopt.core.kinds import BACKWARD, FORWARD
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.common import backward_ops, require_two_ways
from zbopt.schedules.registry import register

__all__ = ["bitpipe", "bitpipe_orders"]

_FORWARD_SLOTS, _BACKWARD_SLOTS = 1, 2  # the figures' widths: a backward twice a forward


def _rounds(problem: Problem) -> list[list[tuple[int, int]]]:
    """Per round, its microbatches as (microbatch, k): p/2 of the down route's and p/2 of the up
    route's, the k-th of each way entering at slot 2k."""
    half = problem.num_devices // 2
    (_, down), (_, up) = problem.routes
    return [[(way[r * half + k], k) for way in (down, up) for k in range(half)] for r in range(len(down) // half)]


def _forward_orders(problem: Problem, rounds: list[list[tuple[int, int]]]) -> list[list[tuple[int, Op]]]:
    """Per device, its forwards as (round, op), round by round (`_rounds`), each round's in the
    order they fall due (slot 2k + i for the i-th stage of the k-th microbatch of a way)."""
    orders: list[list[tuple[int, Op]]] = [[] for _ in range(problem.num_devices)]
    for number, members in enumerate(rounds):
        due = []
        for microbatch, k in members:
            stages = next(stages for stages, microbatches in problem.routes if microbatch in microbatches)
            due += [(2 * k + i, Op(FORWARD, stage, microbatch)) for i, stage in enumerate(stages)]
        for _, op in sorted(due):
            orders[problem.device_of(op.stage)].append((number, op))
    return orders


class _Template:
    """The unit-slot run that orders each device's ops (module docstring): a forward one slot, a
    backward two, no latency."""

    def __init__(self, problem: Problem):
        self.problem = problem
        rounds = _rounds(problem)
        self.forwards = _forward_orders(problem, rounds)
        self.round_of = {microbatch: number for number, members in enumerate(rounds) for microbatch, _ in members}
        p = problem.num_devices
        self.ops_left = [[0] * len(rounds) for _ in range(p)]  # per device and round
        for device, forwards in enumerate(self.forwards):
            for number, _ in forwards:
                self.ops_left[device][number] += 2  # its forward and its backward
        self.done: dict[Op, int] = {}  # op -> the slot it ends
        self.ready: list[list[tuple[int, int, Op]]] = [[] for _ in range(p)]  # per device, backwards ready
        self.orders: list[list[Op]] = [[] for _ in range(p)]

    def run(self) -> list[list[Op]]:
        """Slot by slot, each free device starts what the rule says, until every op has run."""
        p, slot = self.problem.num_devices, 0
        free, position = [0] * p, [0] * p  # per device: the slot it is free, its next forward
        while any(left for device in self.ops_left for left in device):
            for device in range(p):
                if free[device] <= slot:
                    free[device] = slot + self._start(device, slot, position)
            slot += 1
            if slot > 3 * self.problem.num_activations:  # every op one after another: stuck
                raise AssertionError(f"bitpipe's template is stuck at slot {slot}")
        return self.orders

    def _start(self, device: int, slot: int, position: list[int]) -> int:
        """Start the device's next op at `slot` (module docstring); its length, or 1 to wait."""
        ready = self.ready[device]
        if ready and ready[0][0] <= slot:
            _, _, op = heapq.heappop(ready)
            return self._run(device, op, slot, _BACKWARD_SLOTS)
        forwards = self.forwards[device]
        if position[device] == len(forwards):
            return 1
        number, op = forwards[position[device]]
        current = next(r for r, left in enumerate(self.ops_left[device]) if left)
        if number > current and self.ops_left[device][current] > 1:
            return 1  # the next round waits until only the round's last op is left
        arrival = self._arrival(op)
        if arrival is None or arrival > slot:
            return 1
        position[device] += 1
        return self._run(device, op, slot, _FORWARD_SLOTS)

    def _arrival(self, op: Op) -> int | None:
        """When forward `op`'s input is there (slot 0 on its route's first stage), None if not yet."""
        first = self.problem.routes[self.problem.route_of_stage(op.stage)][0][0]
        return 0 if op.stage == first else self.done.get(Op(FORWARD, op.stage - 1, op.microbatch))

    def _run(self, device: int, op: Op, slot: int, length: int) -> int:
        """Run `op` from `slot` for `length` slots; the backward it enables is ready at its end
        (that of the same stage after the route's last forward, else of the stage before)."""
        self.orders[device].append(op)
        self.done[op] = slot + length
        self.ops_left[device][self.round_of[op.microbatch]] -= 1
        stages = self.problem.routes[self.problem.route_of_stage(op.stage)][0]
        if op.kind == FORWARD:
            following = op.stage if op.stage == stages[-1] else None
        else:
            following = op.stage - 1 if op.stage > stages[0] else None
        if following is not None:  # ready backwards: the earliest first, on a tie the lower stage
            backward = Op(BACKWARD, following, op.microbatch)
            heapq.heappush(self.ready[self.problem.device_of(following)], (slot + length, following, backward))
        return length


def bitpipe_orders(problem: Problem) -> list[list[Op]]:
    """Per device, its ops in the order of the unit-slot template: forwards F, backwards "B"
    (the whole backward, one op per microbatch and stage)."""
    return _Template(problem).run()


def _bitpipe_memory(problem: Problem) -> list[float]:
    """Per device, a round's count of activations, 2p (p/2 microbatches each way, each on two of
    the device's chunks), each at most the device's largest: a device starts a round only when the
    round before has one backward left, so rounds do not pile up. (Per stage the count is not
    p/2: at p = 4 with two rounds device 0 holds three microbatches of stage 0.) The paper states
    no bound (tests/test_bitpipe.py)."""
    return [2 * problem.num_devices * max(problem.activation_memory[stage] for stage in stages)
            for stages in problem.stages_of_device]


@register("bitpipe", "BitPipe (Wu et al., 2024): two V-shaped interleaved pipelines in opposite directions, "
                     "bidirectional placement with 4 chunks", _bitpipe_memory, bidirectional=True, after="chimera")
def bitpipe(problem: Problem) -> Schedule:
    """BitPipe: half the microbatches down a V and half up the mirrored V, in rounds of p, each
    device's ops ordered as the authors' figures (module docstring [2]_).

    Needs the bidirectional placement with chunks_per_device = 4 (two V's), an even p (the two
    ways' forwards then never fall due in one slot of a device) and m a multiple of p (whole
    rounds: p/2 microbatches each way).

    Notes
    -----
    Peak memory: at most 2p activations per device, a round's count; with p = 4 and m = 4, 7 on
    the end devices and 8 in the middle (BitPipe-v.svg). The figures show p = 4; other even p
    follow the same rule (zbopt's extension: its idle grows with p, e.g. 12 unit slots per round
    at p = 6, and rounds barely overlap).
    """
    require_two_ways(problem, "bitpipe", 4, "rounds")
    orders = [[each for op in order for each in ([op] if op.kind == FORWARD else
                                                  backward_ops(problem, op.stage, op.microbatch))]
              for order in bitpipe_orders(problem)]
    return Schedule(orders)
