"""torch's compute-only schedule CSV, read: `TorchOrder` holds each rank's actions, infers the
problem layout they imply and checks them against a problem into a zbopt Schedule (the format, and
its writing, are zbopt.io.torch_format's)."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from zbopt.core.errors import ScheduleError, ZboptError
from zbopt.core.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, PAIR_MEMBERS, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.placement import PLACEMENTS, stage_device
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.io.read import read_text
from zbopt.io.torch_format import (
    TORCH_FORWARD,
    TORCH_FULL_BACKWARD,
    TORCH_INPUT_BACKWARD,
    TORCH_KIND_NAMES,
    TORCH_WEIGHT_BACKWARD,
    TorchAction,
    require_one_step_one_route,
)

__all__ = ["LAYOUT_KEYS", "TorchOrder", "parse_torch_csv", "read_torch_csv"]

LAYOUT_KEYS = ("num_devices", "chunks_per_device", "placement", "num_microbatches")

_COMPUTE = re.compile(r"(\d+)([FIWB])(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")
_NOT_COMPUTE = re.compile(r"\d*(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)\d*")


def _parse_cell(text: str, where: str) -> list[TorchAction]:
    """The compute actions of one non-empty cell: one, or an OVERLAP_F_B's sub-actions in order
    (a forward, then a backward: torch's DualPipeV pairs them so)."""
    text = text.strip()
    overlap = _OVERLAP.fullmatch(text)
    actions = []
    for part in overlap.group(1).split(";") if overlap else [text]:
        match = _COMPUTE.fullmatch(part.strip())
        if match and match.group(3):
            actions.append(TorchAction(int(match.group(1)), match.group(2), int(match.group(3))))
        elif match:
            raise ScheduleError(f"{where}: action '{text}' has no microbatch")
        elif _NOT_COMPUTE.fullmatch(part.strip()):
            raise ScheduleError(f"{where}: '{text}' is a communication or sharding action; a compute-only schedule "
                                f"holds only F, I, W, B and OVERLAP_F_B")
        else:
            raise ScheduleError(f"{where}: unknown action '{text}' (expected stage, F/I/W/B, microbatch, e.g. '3F1')")
    return actions


@dataclass(frozen=True)
class TorchOrder:
    """A torch compute-only schedule: per rank its compute actions in order, `places[r][i]` where
    `actions[r][i]` was read (for messages), and `source` naming the whole (a file name).

    `layout` infers the problem layout the actions imply, `problem(...)` builds a Problem on it,
    `to_schedule(problem)` checks the actions against a problem and returns the zbopt Schedule.
    """

    actions: tuple[tuple[TorchAction, ...], ...]
    places: tuple[tuple[str, ...], ...]
    source: str
    overlapped: tuple[tuple[int, ...], ...] = ()  # per rank, per action, its OVERLAP_F_B cell's number or -1

    @property
    def split_backward(self) -> bool:
        """True when any action is an I or a W (a schedule of full backwards B only is fused)."""
        split = (TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD)
        return any(action.kind in split for actions in self.actions for action in actions)

    @cached_property
    def layout(self) -> dict:
        """num_devices (= rows), chunks_per_device, placement ("loop" or "v", whichever puts every
        stage on the rank it appears on; "loop" when both do) and num_microbatches (the largest id
        plus one). Raises ScheduleError when a stage appears on two ranks, a stage or a rank has no
        action, or the stages fit neither placement."""
        num_devices = len(self.actions)
        if num_devices == 0:
            raise ScheduleError(f"{self.source}: no ranks (no rows)")
        rank_of: dict[int, tuple[int, str]] = {}
        for rank, (actions, places) in enumerate(zip(self.actions, self.places, strict=True)):
            if not actions:
                raise ScheduleError(f"{self.source}: rank {rank} has no actions; every rank needs a stage")
            for action, place in zip(actions, places, strict=True):
                first_rank, _ = rank_of.setdefault(action.stage, (rank, place))
                if first_rank != rank:
                    raise ScheduleError(f"{place}: stage {action.stage} appears on ranks {first_rank} and {rank}")
        num_stages = max(rank_of) + 1
        absent = [stage for stage in range(num_stages) if stage not in rank_of]
        if absent:
            raise ScheduleError(f"{self.source}: stage {absent[0]} has no actions (stages run up to {num_stages - 1})")
        if num_stages % num_devices:
            raise ScheduleError(f"{self.source}: {num_stages} stages on {num_devices} ranks; zbopt needs the same "
                                f"number of stages on every rank")
        misplaced = {}
        for placement in (placement for placement in PLACEMENTS if placement != "bidirectional"):
            wrong = [(stage, rank) for stage, (rank, _) in sorted(rank_of.items())
                     if stage_device(stage, num_devices, placement) != rank]
            if not wrong:
                break
            misplaced[placement] = wrong[0]
        else:
            reasons = [f"{placement} placement puts stage {stage} on rank "
                       f"{stage_device(stage, num_devices, placement)}, not {rank}"
                       for placement, (stage, rank) in misplaced.items()]
            raise ScheduleError(f"{self.source}: the stages fit neither placement: {'; '.join(reasons)}")
        microbatches = max(action.microbatch for actions in self.actions for action in actions) + 1
        return {"num_devices": num_devices, "chunks_per_device": num_stages // num_devices,
                "placement": placement, "num_microbatches": microbatches}

    def problem(self, **parameters) -> Problem:
        """A Problem with this schedule's layout and `parameters` (costs, latency, memory). A split
        backward needs `weight_times`; a layout key among `parameters` is an error."""
        clash = [key for key in LAYOUT_KEYS if key in parameters]
        if clash:
            raise ZboptError(f"{clash[0]} comes from {self.source} ({self.layout[clash[0]]}); do not give it")
        if self.split_backward and parameters.get("weight_times") is None:
            raise ZboptError(f"{self.source} splits the backward (I, W): give weight_times")
        return Problem(**self.layout, **parameters)

    def to_schedule(self, problem: Problem, name: str = "") -> Schedule:
        """The zbopt Schedule of these actions on `problem`, each rank's actions in order. Checks
        every action against the problem (rank count, stage placement, microbatch range, backward
        kind) and that each of the problem's ops comes exactly once; a ScheduleError names the cell."""
        require_one_step_one_route(problem, self.source, reading=True)
        if len(self.actions) != problem.num_devices:
            raise ScheduleError(f"{self.source} has {len(self.actions)} ranks (rows), the problem "
                                f"{problem.num_devices} devices")
        seen: dict[Op, tuple[str, TorchAction]] = {}
        orders = []
        cells: dict[tuple[int, int], list[Op]] = {}  # (rank, OVERLAP_F_B cell) -> its ops
        for rank, (actions, places) in enumerate(zip(self.actions, self.places, strict=True)):
            order = []
            overlapped = self.overlapped[rank] if self.overlapped else (-1,) * len(actions)
            for action, place, cell in zip(actions, places, overlapped, strict=True):
                ops = _zbopt_ops(action, place, rank, problem)
                if cell >= 0:
                    cells.setdefault((rank, cell), []).extend(ops)
                for op in ops:
                    if op in seen:
                        first_place, first = seen[op]
                        raise ScheduleError(f"{place}: '{action}' repeats the {TORCH_KIND_NAMES[op.kind]} of stage "
                                            f"{op.stage}, microbatch {op.microbatch} (already at {first_place}: "
                                            f"'{first}')")
                    seen[op] = (place, action)
                    order.append(op)
            orders.append(order)
        missing = [Op(kind, stage, microbatch) for kind in problem.kinds for stage in range(problem.num_stages)
                   for microbatch in range(problem.num_microbatches) if Op(kind, stage, microbatch) not in seen]
        if missing:
            op = missing[0]
            more = f" (and {len(missing) - 1} more actions)" if len(missing) > 1 else ""
            raise ScheduleError(f"{self.source}: stage {op.stage} misses the {TORCH_KIND_NAMES[op.kind]} of microbatch "
                                f"{op.microbatch}{more}")
        return Schedule(orders, name=name, pairs=self._pairs(problem, cells, seen))

    def _pairs(self, problem: Problem, cells: dict, seen: dict) -> list[tuple[Op, ...]]:
        """The OVERLAP_F_B cells as overlapped pairs where the problem gives overlap costs (each
        pair kind it holds must have one), else none: their actions run one after another."""
        if problem.pairs is None:
            return []
        shapes = {members: kind for (kind, split), members in PAIR_MEMBERS.items() if split == problem.split_backward}
        given = set(problem.pairs.kinds)
        pairs = []
        for ops in cells.values():
            kind = shapes.get(tuple(op.kind for op in ops))
            if kind not in given:
                place = seen[ops[0]][0]
                what = f"an {kind} pair" if kind else "no pair zbopt models (a forward, then one backward)"
                raise ScheduleError(f"{place}: this OVERLAP_F_B is {what}, and overlap_times gives no cost for it "
                                    f"(it gives {', '.join(sorted(given))})")
            pairs.append(tuple(ops))
        return pairs

    @classmethod
    def from_cells(cls, ranks: list[list[tuple[str, str]]], source: str) -> TorchOrder:
        """A TorchOrder from, per rank, its cells in order as (text, where); an empty text is an idle step."""
        actions, places, overlapped = [], [], []
        for cells in ranks:
            parsed = [(action, where, number if _OVERLAP.fullmatch(text.strip()) else -1)
                      for number, (text, where) in enumerate(cells) if text.strip()
                      for action in _parse_cell(text, where)]
            actions.append(tuple(action for action, _, _ in parsed))
            places.append(tuple(where for _, where, _ in parsed))
            overlapped.append(tuple(cell for *_, cell in parsed))
        return cls(tuple(actions), tuple(places), source, tuple(overlapped))


def _zbopt_ops(action: TorchAction, place: str, rank: int, problem: Problem) -> list[Op]:
    """The zbopt ops of one torch action on `problem`: I is B, W is W, and a full backward B is BW,
    or B then W when the problem splits the backward."""
    stage, kind, microbatch = action
    if stage >= problem.num_stages:
        raise ScheduleError(f"{place}: stage {stage} out of range (the problem has {problem.num_stages} stages)")
    if problem.device_of(stage) != rank:
        raise ScheduleError(f"{place}: stage {stage} is on rank {rank}, but the problem ({problem.placement} "
                            f"placement, {problem.chunks_per_device} chunks per device) puts it on device "
                            f"{problem.device_of(stage)}")
    if microbatch >= problem.num_microbatches:
        raise ScheduleError(f"{place}: microbatch {microbatch} out of range (the problem has "
                            f"{problem.num_microbatches})")
    if kind == TORCH_FORWARD:
        return [Op(FORWARD, stage, microbatch)]
    if kind == TORCH_FULL_BACKWARD:
        kinds = (BACKWARD, WEIGHT) if problem.split_backward else (FUSED_BACKWARD,)
        return [Op(zbopt_kind, stage, microbatch) for zbopt_kind in kinds]
    if not problem.split_backward:
        raise ScheduleError(f"{place}: '{action}' is a split backward step, but the problem's backward is fused "
                            f"(give weight_times to split it)")
    return [Op(BACKWARD if kind == TORCH_INPUT_BACKWARD else WEIGHT, stage, microbatch)]


def parse_torch_csv(text: str, source: str = "torch CSV") -> TorchOrder:
    """Parse compute-only CSV text (row r = rank r - 1; empty cells are idle steps) and infer its
    layout; a ScheduleError names the row and column (1-based) of a malformed cell."""
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as error:
        raise ScheduleError(f"{source}: not a CSV file ({error})") from None
    order = TorchOrder.from_cells([[(cell, f"{source} row {row_number}, column {column}")
                                    for column, cell in enumerate(row, 1)]
                                   for row_number, row in enumerate(rows, 1)], source)
    _ = order.layout  # a schedule zbopt cannot represent fails when read
    return order


def read_torch_csv(path: str | Path) -> TorchOrder:
    """Read a compute-only CSV written by torch's `_dump_csv` or by `write_torch_csv`."""
    return parse_torch_csv(read_text(path, "schedule file"), Path(path).name)

