"""torch.distributed.pipelining's schedule CSV and Megatron-LM's per-rank order, both ways.

**torch CSV** — the "compute_only" format `_PipelineScheduleRuntime._load_csv` reads and
`_dump_csv` writes: one row per rank, in rank order; each cell one action
"{stage}{kind}{microbatch}" with global stage ids. Kinds: F (forward), I (input-gradient backward,
zbopt's B), W (weight gradient, zbopt's W), B (full backward, zbopt's BW). An empty cell is an idle
step: torch reads it as None and its runtime skips it. "(0F1;7B0)OVERLAP_F_B" runs its
sub-actions as one overlapped step; zbopt reads it as the sub-actions in order (zbopt runs one op
at a time). A full backward B on a problem with a split backward is zbopt's B then W back to back
(torch's `_merge_bw` merges exactly that pair into B).

**Megatron-LM order** — per rank, what Megatron-LM's `convert_schedule_table_to_order` returns
(the `_order` TransformerEngine's `make_graphed_callables` takes): the rank's compute steps in
execution order, k for a forward and -k for a backward of its model chunk k (1-based). It has no
microbatch ids (each chunk runs its microbatches in order) and no weight-gradient step.

torch's built-in schedules, by name, are zbopt.schedules.torch_builtin's; this module never imports torch.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from zbopt.errors import ScheduleError, ZboptError
from zbopt.kinds import KINDS
from zbopt.ops import Op
from zbopt.placement import PLACEMENTS, stage_device
from zbopt.problem import (
    BACKWARD,
    FORWARD,
    FUSED_BACKWARD,
    OFFLOAD,
    PAIR_MEMBERS,
    RECOMPUTE,
    WEIGHT,
    Problem,
)
from zbopt.schedule import Schedule, pair_text
from zbopt.simulation import simulate

# torch's action letters (its _ComputationType), not zbopt's op kinds: torch's B is zbopt's BW
TORCH_FORWARD, TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD, TORCH_FULL_BACKWARD = "F", "I", "W", "B"
TORCH_KIND = {FORWARD: TORCH_FORWARD, BACKWARD: TORCH_INPUT_BACKWARD, WEIGHT: TORCH_WEIGHT_BACKWARD,
              FUSED_BACKWARD: TORCH_FULL_BACKWARD}
MEGATRON_FORMAT = "megatron-order"
MEGATRON_VERSION = 1
LAYOUT_KEYS = ("num_devices", "chunks_per_device", "placement", "num_microbatches")

_COMPUTE = re.compile(r"(\d+)([FIWB])(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")
_NOT_COMPUTE = re.compile(r"\d*(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)\d*")
_KIND_NAMES = {kind: f"{KINDS[kind].name} ({letter})" for kind, letter in TORCH_KIND.items()}  # e.g. "forward (F)"


class TorchAction(NamedTuple):
    """One compute action of a torch schedule: kind F, I, W or B of `stage` on `microbatch`."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


# ----------------------------------------------------------------------------------------- export
def _require_one_step_one_route(problem: Problem, what: str, reading: bool = False) -> None:
    """`what` (a format) holds one training step, and every microbatch through every stage (torch
    and Megatron run each stage on all microbatches); `reading`: the problem is the one a file of
    that format is read into."""
    if problem.iterations != 1:
        raise ZboptError(f"{what} holds one training step: iterations = {problem.iterations} must be 1")
    if problem.bidirectional:
        advice = "read it into a problem of loop or v placement" if reading else "export it as zbopt JSON (.json)"
        raise ZboptError(f"{what} sends every microbatch through every stage, and placement 'bidirectional' sends "
                         f"half of them each way; {advice}")


def _checked_orders(problem: Problem, schedule: Schedule, what: str,
                    pairs_allowed: bool = False) -> tuple[tuple[Op, ...], ...]:
    """Per device, its ops in the order a runtime must follow: the schedule's own, in which the
    simulator runs them (and checks given start times against). Simulating also rejects a broken
    schedule here, before anything is written; so does a recompute or an offload, which `what`
    (the format) cannot express (dropping it would change the schedule), and an overlapped pair
    unless `pairs_allowed`."""
    simulation = simulate(problem, schedule)
    if simulation.pairs and not pairs_allowed:
        raise ZboptError(f"{what} has no overlapped pair, and the schedule has {len(simulation.pairs)} (first "
                         f"{pair_text(schedule.pairs[0])}); export it as zbopt JSON (.json) or a torch CSV")
    table = simulation.table
    for pairs, kind, action, verb in ((table.recomputed, RECOMPUTE, "recompute", "recomputes"),
                                      (table.offloaded, OFFLOAD, "offload or reload", "offloads")):
        if pairs:
            raise ZboptError(f"{what} has no {action} action, and the schedule {verb} {len(pairs)} activation(s) "
                             f"(first {Op(kind, *pairs[0])}); export it as zbopt JSON (.json)")
    return schedule.orders


def torch_actions(problem: Problem, schedule: Schedule) -> list[list[str]]:
    """Per rank, its torch actions ("3F1", "3I1", "3W1", "3B1") in execution order; an overlapped
    pair as torch's "(0F7;7B3)OVERLAP_F_B", its backward a full B (an FBW pair) or an I (FB)."""
    _require_one_step_one_route(problem, "a torch schedule CSV")
    _checked_orders(problem, schedule, "a torch schedule CSV", pairs_allowed=True)
    return [[_torch_cell(item) for item in schedule.items(device)] for device in range(schedule.num_devices)]


def _torch_cell(ops: tuple[Op, ...]) -> str:
    """One op's torch action, or an overlapped pair's OVERLAP_F_B (forward, then the backward:
    torch's full B for B and W or BW, its I for B alone)."""
    if len(ops) == 1:
        op = ops[0]
        return str(TorchAction(op.stage, TORCH_KIND[op.kind], op.microbatch))
    forward, backward = ops[0], ops[1]
    kind = TORCH_INPUT_BACKWARD if len(ops) == 2 and backward.kind == BACKWARD else TORCH_FULL_BACKWARD
    return f"({TorchAction(forward.stage, TORCH_FORWARD, forward.microbatch)};" \
           f"{TorchAction(backward.stage, kind, backward.microbatch)})OVERLAP_F_B"


def torch_csv(problem: Problem, schedule: Schedule) -> str:
    """The schedule as torch's compute-only CSV text, byte for byte as torch's `_dump_csv` writes
    the same actions (csv.writer, "\\r\\n" line ends)."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(torch_actions(problem, schedule))
    return buffer.getvalue()


def write_torch_csv(path: str | Path, problem: Problem, schedule: Schedule) -> None:
    """Write `torch_csv` to `path`, for `_PipelineScheduleRuntime._load_csv`."""
    Path(path).write_text(torch_csv(problem, schedule), newline="")


def _require_megatron(problem: Problem) -> None:
    _require_one_step_one_route(problem, "Megatron-LM's order")
    if problem.split_backward:
        raise ZboptError("Megatron-LM's order has no weight-gradient step: it needs a fused backward (no weight_times)")
    if problem.placement == "v" and problem.chunks_per_device > 1:
        raise ZboptError("Megatron-LM's interleaving puts chunk k of rank r at stage k·p + r (loop placement); "
                         "this problem has placement v")


def megatron_order(problem: Problem, schedule: Schedule) -> list[list[int]]:
    """Per rank, Megatron-LM's order: +k forward, -k backward of the rank's model chunk k (1-based,
    the index of the stage among the rank's stages in increasing order, plus one), in execution order;
    loop placement only (Megatron's own).

    Raises ZboptError for a split backward (the order has no W step), iterations > 1, or a chunk
    that runs its microbatches out of order (the order carries no microbatch ids).

    >>> from zbopt.schedules import generate
    >>> problem = Problem(num_devices=2, num_microbatches=3)
    >>> megatron_order(problem, generate("1f1b", problem))
    [[1, 1, -1, 1, -1, -1], [1, -1, 1, -1, 1, -1]]
    """
    _require_megatron(problem)
    orders = []
    for device, ops in enumerate(_checked_orders(problem, schedule, "Megatron-LM's order")):
        chunks = problem.stages_of_device[device]
        done: Counter = Counter()
        order = []
        for op in ops:
            due = done[op.kind, op.stage]
            if op.microbatch != due:
                raise ZboptError(
                    f"Megatron-LM's order has no microbatch ids, so each chunk runs its microbatches in order: "
                    f"device {device} runs {op} where stage {op.stage}'s {_KIND_NAMES[op.kind]} of microbatch "
                    f"{due} is due"
                )
            done[op.kind, op.stage] += 1
            chunk = chunks.index(op.stage) + 1
            order.append(chunk if op.kind == FORWARD else -chunk)
        orders.append(order)
    return orders


def megatron_json(problem: Problem, schedule: Schedule) -> str:
    """The Megatron order as JSON: format, version, name, the layout, then "order" with one line
    per rank (order[r] is rank r's list)."""
    orders = megatron_order(problem, schedule)
    header = {"format": MEGATRON_FORMAT, "version": MEGATRON_VERSION, "name": schedule.name,
              "num_devices": problem.num_devices, "chunks_per_device": problem.chunks_per_device,
              "placement": problem.placement, "num_microbatches": problem.num_microbatches}
    fields = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in header.items()]
    fields.append(' "order": [\n' + ",\n".join(f"  {json.dumps(order)}" for order in orders) + "\n ]")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def write_megatron_order(path: str | Path, problem: Problem, schedule: Schedule) -> None:
    """Write `megatron_json` to `path`."""
    Path(path).write_text(megatron_json(problem, schedule))


def check_exportable(problem: Problem, export_format: str) -> None:
    """Raise ZboptError now if no schedule of `problem` can be written as `export_format`
    ("torch-csv" or "megatron"), so that a long solve does not end in that error. A schedule that
    recomputes or offloads is refused only when written: whether a solver's answer does is known
    then."""
    if export_format == "torch-csv":
        _require_one_step_one_route(problem, "a torch schedule CSV")
    elif export_format == "megatron":
        _require_megatron(problem)


# ----------------------------------------------------------------------------------------- import
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
        _require_one_step_one_route(problem, self.source, reading=True)
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
                        raise ScheduleError(f"{place}: '{action}' repeats the {_KIND_NAMES[op.kind]} of stage "
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
            raise ScheduleError(f"{self.source}: stage {op.stage} misses the {_KIND_NAMES[op.kind]} of microbatch "
                                f"{op.microbatch}{more}")
        return Schedule(orders, name=name, pairs=self._pairs(problem, cells, seen))

    def _pairs(self, problem: Problem, cells: dict, seen: dict) -> list[tuple[Op, ...]]:
        """The OVERLAP_F_B cells as overlapped pairs where the problem gives overlap costs (each
        pair kind it holds must have one), else none: their actions run one after another."""
        if not problem.overlap_times:
            return []
        shapes = {members: kind for (kind, split), members in PAIR_MEMBERS.items() if split == problem.split_backward}
        given = {kind for kind, _ in problem.overlap_times}
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
    try:
        with open(path, newline="") as file:
            text = file.read()
    except FileNotFoundError:
        raise ZboptError(f"schedule file '{path}' not found") from None
    except UnicodeDecodeError:
        raise ZboptError(f"schedule file '{path}': not a text file") from None
    return parse_torch_csv(text, Path(path).name)

