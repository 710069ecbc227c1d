"""torch.distributed.pipelining's schedule CSVs and Megatron-LM's per-rank order: the formats, and
a schedule written in them (a torch CSV is read by zbopt.io.torch_order).

**torch CSV** — the "compute_only" format `_PipelineScheduleRuntime._load_csv` reads and
`_dump_csv` writes: one row per rank, in rank order; each cell one action
"{stage}{kind}{microbatch}" with global stage ids. Kinds: F (forward), I (input-gradient backward,
zbopt's B), W (weight gradient, zbopt's W), B (full backward, zbopt's BW). An empty cell is an idle
step: torch reads it as None and its runtime skips it. "(0F1;7B0)OVERLAP_F_B" runs its
sub-actions as one overlapped step; zbopt reads it as the sub-actions in order (zbopt runs one op
at a time). A full backward B on a problem with a split backward is zbopt's B then W back to back
(torch's `_merge_bw` merges exactly that pair into B).

**torch comms CSV** — the "compute_comms" format, a schedule as torch's runtime runs it after its
lowering: the compute actions with the sends and receives between ranks ("0SEND_F3", "1RECV_F3",
"1SEND_B3", "0RECV_B3") and, per stage, "0UNSHARD", "0REDUCE_GRAD", "0RESHARD"
(`torch_comms_actions` says where each goes). Written only (`--format torch-comms-csv`).

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
import math
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from zbopt.core.errors import ZboptError
from zbopt.core.kinds import BACKWARD, FORWARD, FUSED_BACKWARD, KINDS, OFFLOAD, RECOMPUTE, REGATHER, WEIGHT
from zbopt.core.ops import Op
from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule, pair_text
from zbopt.core.simulation import Simulation, simulate
from zbopt.core.simulation.ends import forwards_done, gradient_ends
from zbopt.io.write import write_file

__all__ = ["MEGATRON_FORMAT", "MEGATRON_VERSION", "TORCH_FORWARD", "TORCH_FULL_BACKWARD", "TORCH_INPUT_BACKWARD",
           "TORCH_KIND", "TORCH_KIND_NAMES", "TORCH_WEIGHT_BACKWARD", "TorchAction", "check_exportable",
           "megatron_json", "megatron_order", "require_one_step_one_route", "torch_actions", "torch_comms_actions",
           "torch_comms_csv", "torch_csv", "write_megatron_order", "write_torch_csv"]

# torch's action letters (its _ComputationType), not zbopt's op kinds: torch's B is zbopt's BW
TORCH_FORWARD, TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD, TORCH_FULL_BACKWARD = "F", "I", "W", "B"
TORCH_KIND = {FORWARD: TORCH_FORWARD, BACKWARD: TORCH_INPUT_BACKWARD, WEIGHT: TORCH_WEIGHT_BACKWARD,
              FUSED_BACKWARD: TORCH_FULL_BACKWARD}
MEGATRON_FORMAT = "megatron-order"
MEGATRON_VERSION = 1
TORCH_KIND_NAMES = {kind: f"{KINDS[kind].name} ({letter})" for kind, letter in TORCH_KIND.items()}  # e.g. "forward (F)"


class TorchAction(NamedTuple):
    """One compute action of a torch schedule: kind F, I, W or B of `stage` on `microbatch`."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


def require_one_step_one_route(problem: Problem, what: str, reading: bool = False) -> None:
    """`what` (a format) holds one training step, and every microbatch through every stage (torch
    and Megatron run each stage on all microbatches); `reading`: the problem is the one a file of
    that format is read into."""
    if problem.iterations != 1:
        raise ZboptError(f"{what} holds one training step: iterations = {problem.iterations} must be 1")
    if problem.bidirectional:
        advice = "read it into a problem of loop or v placement" if reading else "export it as zbopt JSON (.json)"
        raise ZboptError(f"{what} sends every microbatch through every stage, and placement 'bidirectional' sends "
                         f"half of them each way; {advice}")
    if problem.sequence_slices > 1:
        raise ZboptError(f"{what} has no sequence slices: its runtime would run the "
                         f"{problem.sequence_slices} slices of a sequence as independent microbatches, without the "
                         "keys and values each reads from the slices before it; export it as zbopt JSON (.json)")


def _checked_orders(problem: Problem, schedule: Schedule, what: str, pairs_allowed: bool = False,
                    regathers_allowed: bool = False) -> tuple[tuple[Op, ...], ...]:
    """Per device, its ops in the order a runtime must follow: the schedule's own, in which the
    simulator runs them (and checks given start times against). Simulating also rejects a broken
    schedule here, before anything is written; so does a recompute or an offload, which `what`
    (the format) cannot express (dropping it would change the schedule), an overlapped pair
    unless `pairs_allowed` and a re-gather unless `regathers_allowed`."""
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
    if table.regathered and not regathers_allowed:
        raise ZboptError(f"{what} has no re-gather, and the schedule gathers {len(table.regathered)} stage(s) again "
                         f"(first {Op(REGATHER, *table.regathered[0])}); export it as --format torch-comms-csv "
                         "(RESHARD and UNSHARD) or zbopt JSON (.json)")
    return schedule.orders


def torch_actions(problem: Problem, schedule: Schedule) -> list[list[str]]:
    """Per rank, its torch actions ("3F1", "3I1", "3W1", "3B1") in execution order; an overlapped
    pair as torch's "(0F7;7B3)OVERLAP_F_B", its backward a full B (an FBW pair) or an I (FB)."""
    require_one_step_one_route(problem, "a torch schedule CSV")
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
    write_file(path, torch_csv(problem, schedule))


def _require_megatron(problem: Problem) -> None:
    require_one_step_one_route(problem, "Megatron-LM's order")
    if problem.split_backward:
        raise ZboptError("Megatron-LM's order cannot hold a split backward (weight_times given): upstream Megatron-LM "
                         "has no weight-gradient step, its order only forwards (+k) and whole backwards (-k); write "
                         "it as a torch CSV (--format torch-csv: torch.distributed.pipelining runs B as I and W, as "
                         "zbopt run-torch does) or as zbopt JSON (--format json)")
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
                    f"device {device} runs {op} where stage {op.stage}'s {TORCH_KIND_NAMES[op.kind]} of microbatch "
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
    write_file(path, megatron_json(problem, schedule))


def check_exportable(problem: Problem, export_format: str) -> None:
    """Raise ZboptError now if no schedule of `problem` can be written as `export_format`
    ("torch-csv", "torch-comms-csv" or "megatron"), so that a long solve does not end in that error. A schedule that
    recomputes or offloads is refused only when written: whether a solver's answer does is known
    then."""
    if export_format in ("torch-csv", "torch-comms-csv"):
        require_one_step_one_route(problem, "a torch schedule CSV")
    elif export_format == "megatron":
        _require_megatron(problem)


def torch_comms_actions(simulation: Simulation) -> list[list[str]]:
    """Per rank, torch's lowered ("compute_comms") actions for a simulated schedule: its compute
    actions (`torch_actions`, in its order); a SEND_F or SEND_B right after each op whose output
    leaves the rank; a RECV_F or RECV_B where the simulated times put the message's arrival (before
    its consumer; between two ranks in the order sent, as the runtime's channel matches them:
    the times are a run of the schedule, so no rank waits on one that waits on it); each stage's
    UNSHARD first and, right after its last gradient op, its REDUCE_GRAD (where torch's
    `_add_reduce_grad` puts it) and RESHARD. Those three are listed whatever the problem models, as
    torch's own lowering of a compute-only CSV adds them: UNSHARD and RESHARD do nothing without
    FSDP, and REDUCE_GRAD also scales the gradients by the microbatch count. A stage the schedule
    gathers again (its G) is also resharded right after its last forward and unsharded where
    the G starts."""
    problem, schedule, table = simulation.problem, simulation.schedule, simulation.table
    require_one_step_one_route(problem, "a torch schedule CSV")
    _checked_orders(problem, schedule, "a torch schedule CSV", pairs_allowed=True, regathers_allowed=True)
    start, end = simulation.start.tolist(), simulation.end.tolist()
    # per rank: (time, then sends, receives and compute at one moment, the order made, action)
    events: list[list[tuple[float, int, int, str]]] = [[] for _ in range(problem.num_devices)]

    def add(rank: int, time: float, rank_at_moment: int, action: str) -> None:
        events[rank].append((time, rank_at_moment, sum(map(len, events)), action))

    for device, stages in enumerate(problem.stages_of_device):
        for stage in stages:
            add(device, -math.inf, 0, f"{stage}UNSHARD")
        for item in schedule.items(device):
            if item[0].kind == REGATHER:  # its forwards are done: free the parameters, gather them at the G
                add(device, forwards_done(table, end, table.index(item[0])), 0, f"{item[0].stage}RESHARD")
                add(device, start[table.index(item[0])], 2, f"{item[0].stage}UNSHARD")
                continue
            add(device, start[table.index(item[0])], 2, _torch_cell(item))
            for op in item:
                index = table.index(op)
                source = table.predecessor[index]
                if source >= 0 and table.device[source] != device:  # a message from another rank
                    kind = "F" if op.kind == FORWARD else "B"
                    add(table.device[source], end[source], 0, f"{table.op(source).stage}SEND_{kind}{op.microbatch}")
                    arrival = min(end[source] + table.latency[index], start[index])  # given times: within tolerance
                    add(device, arrival, 1, f"{op.stage}RECV_{kind}{op.microbatch}")
    for stage, finish in enumerate(gradient_ends(problem, table, simulation.end)):
        add(problem.device_of(stage), finish, 0, f"{stage}REDUCE_GRAD")
        add(problem.device_of(stage), finish, 0, f"{stage}RESHARD")
    return [[action for *_, action in sorted(rank)] for rank in events]


def torch_comms_csv(simulation: Simulation) -> str:
    """`torch_comms_actions` as the CSV `_PipelineScheduleRuntime._load_csv(path, format="compute_comms")`
    reads (csv.writer, as torch's `_dump_csv` writes it)."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(torch_comms_actions(simulation))
    return buffer.getvalue()
