"""A plan run on the user's own model: the plan's rows (its best, or others picked), each row's
schedule written as torch's CSV and run with the model cut at the row's split, and each run's
measured step time beside the one the plan predicted, with both rankings.

A plan is the JSON `zbopt plan --json` prints (its `best` and its `rows`, each with its split and
its schedule's `orders`) or the zbopt JSON `plan --export` writes (one schedule, its problem and
its split).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.problem import Problem
from zbopt.core.problem.checks import is_count, is_number
from zbopt.core.schedule import Schedule
from zbopt.interfaces.runtime.launch import run_torch
from zbopt.interfaces.runtime.run_report import ATOL, RTOL, TorchRunReport
from zbopt.io.read import read_data, schedule_of
from zbopt.io.torch_format import write_torch_csv
from zbopt.presentation.tables import aligned
from zbopt.solvers.gap import optimality_tolerance

__all__ = ["PlanEntry", "PlannedRun", "format_plan_runs", "plan_entries", "run_plan"]


@dataclass(frozen=True)
class PlanEntry:
    """One schedule of a plan on one split: what it is called, the layers per virtual stage, the
    pipeline (chunks per device, placement), each device's ops as text and the predicted makespan."""

    label: str
    split: tuple[int, ...]
    chunks: int
    placement: str
    orders: tuple[tuple[str, ...], ...]
    predicted_ms: float


@dataclass(frozen=True)
class PlannedRun:
    """A plan entry run in torch: its report (gradients checked, op and step times)."""

    entry: PlanEntry
    report: TorchRunReport

    @property
    def measured_ms(self) -> float:
        """The step time as the slowest rank saw it (its median over the timed steps)."""
        return max(self.report.step_time_s) * 1e3


def plan_entries(path: str | Path, rows: Sequence[str] = ()) -> list[PlanEntry]:
    """The entries of the plan file `path` to run: its best, or each of `rows` (an index into the
    JSON's rows, or a schedule's name: that schedule's fastest row). Raises ZboptError naming the
    file and what is missing."""
    where = f"plan '{path}'"
    data = read_data(path, "plan")
    if isinstance(data, dict) and isinstance(data.get("split"), dict):  # plan --export's zbopt JSON
        if rows:
            raise ZboptError(f"{where}: an exported plan holds one schedule; --row picks from plan --json's rows")
        return [_exported_entry(data, where)]
    if not isinstance(data, dict) or "rows" not in data or "best" not in data:
        raise ZboptError(f"{where}: expected the JSON `zbopt plan --json` prints (best, rows) or a zbopt JSON "
                         "that `plan --export` wrote")
    if not rows:
        if not isinstance(data["best"], dict):
            raise ZboptError(f"{where}: the plan has no best schedule (none was found)")
        return [_entry(data["best"], "best: " + str(data["best"].get("schedule")), where)]
    table = data["rows"] if isinstance(data["rows"], list) else []
    return [_picked(table, row, where) for row in rows]


def _picked(table: list, row: str, where: str) -> PlanEntry:
    """The row an index or a schedule's name picks (rows without a schedule are passed over; of a
    schedule's rows the least iteration time, the makespan in a plan written before it had one)."""
    runnable = [(index, entry) for index, entry in enumerate(table) if isinstance(entry, dict) and entry.get("orders")]
    if row.isdigit():
        chosen = [(index, entry) for index, entry in runnable if index == int(row)]
        if not chosen:
            raise ZboptError(f"{where}: --row {row}: no row {row} with a schedule (rows 0 to {len(table) - 1}; "
                             f"with a schedule: {', '.join(str(index) for index, _ in runnable) or 'none'})")
    else:
        chosen = sorted(((index, entry) for index, entry in runnable if entry.get("schedule") == row),
                        key=lambda pair: _number(pair[1].get("iteration_ms", pair[1].get("makespan_ms"))))
        if not chosen:
            names = sorted({str(entry.get("schedule")) for _, entry in runnable})
            raise ZboptError(f"{where}: --row {shorten(row)}: no row of that schedule with a schedule found "
                             f"(rows have: {', '.join(names) or 'none'})")
    index, entry = chosen[0]
    return _entry(entry, f"row {index}: {entry.get('schedule')} ({entry.get('rule')} split)", where)


def _number(value) -> float:
    """A row's makespan to sort by: not a number sorts last (and is refused when picked)."""
    return float(value) if is_number(value) else math.inf


def _entry(row: dict, label: str, where: str) -> PlanEntry:
    """One row as an entry; its fields checked for their types (whole numbers, lists of op texts)."""
    split, chunks, orders, makespan = (row.get(key) for key in ("split", "chunks", "orders", "makespan_ms"))
    if not (isinstance(split, list) and split and all(is_count(count) for count in split)):
        raise ZboptError(f"{where}: {label}: split = {shorten(split)}: expected layers per stage, each at least 1")
    if not (is_count(chunks) and isinstance(row.get("placement"), str)):
        raise ZboptError(f"{where}: {label}: expected chunks (a whole number) and placement (text)")
    if not (isinstance(orders, list) and orders and all(isinstance(order, list) and all(isinstance(op, str)
                                                                                            for op in order)
                                                           for order in orders)):
        raise ZboptError(f"{where}: {label}: orders = {shorten(orders)}: expected each device's ops as text")
    if not is_number(makespan):
        raise ZboptError(f"{where}: {label}: makespan_ms = {shorten(makespan)}: expected a number")
    return PlanEntry(label, tuple(split), chunks, row["placement"], tuple(tuple(order) for order in orders),
                     float(makespan))


def _exported_entry(data: dict, where: str) -> PlanEntry:
    """plan --export's JSON: the schedule and its problem (the predicted makespan is its simulation),
    the plan's split."""
    from zbopt.core.simulation import simulate

    schedule, problem = schedule_of(data, where)
    if problem is None or "split" not in data["split"]:
        raise ZboptError(f"{where}: an exported plan needs its problem and split (written by plan --export)")
    return _entry({"split": data["split"]["split"], "chunks": problem.chunks_per_device,
                   "placement": problem.placement, "orders": [[str(op) for op in order] for order in schedule.orders],
                   "makespan_ms": simulate(problem, schedule).makespan}, "exported schedule", where)


def run_plan(path: str | Path, model: str, *, rows: Sequence[str] = (), steps: int = 3, seed: int = 0,
             timeout_s: float = 120.0, rtol: float = RTOL, atol: float = ATOL,
             folder: str | None = None) -> list[PlannedRun]:
    """Run the plan's entries (`plan_entries(path, rows)`) on the model `model` names
    (`PACKAGE.MODULE:FACTORY`, its module looked for in `folder`, default the working folder), each
    with `run_torch`: gradients checked against one process."""
    entries = plan_entries(path, rows)
    schedules = [(entry, _problem(entry, path), Schedule([list(order) for order in entry.orders]))
                 for entry in entries]  # every entry checked before the first run
    runs = []
    with tempfile.TemporaryDirectory(prefix="zbopt-plan-") as scratch:
        for number, (entry, problem, schedule) in enumerate(schedules):
            csv = Path(scratch) / f"entry{number}.csv"
            write_torch_csv(csv, problem, schedule)
            report = run_torch(csv, model=model, split=entry.split, steps=steps, seed=seed, timeout_s=timeout_s,
                               rtol=rtol, atol=atol, folder=folder or os.getcwd())
            runs.append(PlannedRun(entry, report))
    return runs


def _problem(entry: PlanEntry, path) -> Problem:
    """The pipeline the entry's orders run on (costs do not matter to the CSV): its devices, chunks,
    placement, microbatches, and a split backward where the orders have W. A ZboptError naming the
    plan file and the entry for orders that are no schedule of it."""
    from zbopt.core.kinds import WEIGHT
    from zbopt.core.ops import Op

    try:
        ops = [Op.from_str(text) for order in entry.orders for text in order]
        if not ops:
            raise ZboptError("orders: no ops")
        split_backward = any(op.kind == WEIGHT for op in ops)
        return Problem(num_devices=len(entry.orders), num_microbatches=1 + max(op.microbatch for op in ops),
                       chunks_per_device=entry.chunks, placement=entry.placement,
                       weight_times=1.0 if split_backward else None)
    except ZboptError as error:
        raise ZboptError(f"plan '{path}': {entry.label}: {error}") from None


def format_plan_runs(runs: list[PlannedRun]) -> str:
    """Predicted against measured step time per entry, both rankings (ties share a rank), and
    whether the measured times keep every strict order the predicted ones make."""
    predicted = [run.entry.predicted_ms for run in runs]
    measured = [run.measured_ms for run in runs]
    rows = [("schedule", "split", "predicted ms", "measured ms", "rank", "gradients")]
    for index, run in enumerate(runs):
        verdict = "match" if run.report.passed else f"DIFFER (max abs diff {run.report.max_abs_diff:.3g})"
        rows.append((run.entry.label, ",".join(map(str, run.entry.split)), f"{run.entry.predicted_ms:.4g}",
                     f"{run.measured_ms:.4g}", f"{_rank(predicted, index)} / {_rank(measured, index)}", verdict))
    lines = aligned(rows, left=(0, 1, 5))
    if len(runs) > 1:
        held = all(measured[one] <= measured[other] for one in range(len(runs)) for other in range(len(runs))
                   if predicted[one] < predicted[other] and not _tied(predicted[one], predicted[other]))
        lines.append(f"rank: predicted / measured; the predicted ranking {'held' if held else 'did not hold'}")
    return "\n".join(lines)


def _rank(values: list[float], index: int) -> int:
    """1 + how many values are below `values[index]` (equal ones, within the tolerance, tie)."""
    return 1 + sum(value < values[index] and not _tied(value, values[index]) for value in values)


def _tied(one: float, other: float) -> bool:
    """Equal within the one tolerance of "optimal" (two schedules a solver calls equally fast)."""
    return abs(one - other) <= optimality_tolerance(min(one, other))
