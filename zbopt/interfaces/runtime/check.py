"""The schedule CSV's checks, all before any rank starts: zbopt's reader, torch's own validator
and zbopt's simulator, each error one line naming the file and the culprit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zbopt.core.errors import DeadlockError, ScheduleError, ZboptError
from zbopt.core.problem import Problem
from zbopt.core.simulation import simulate
from zbopt.io.torch_format import TORCH_FULL_BACKWARD, TORCH_INPUT_BACKWARD
from zbopt.io.torch_order import TorchOrder, read_torch_csv

__all__ = ["CheckedCsv", "check_csv"]


@dataclass(frozen=True)
class CheckedCsv:
    """A schedule CSV that passed every check: the file as given, its actions per rank as
    zbopt.io.torch_order reads them, and the Problem of its layout (unit costs: only the order
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
    names = ["B is torch's I"] if TORCH_INPUT_BACKWARD in kinds else []
    if TORCH_FULL_BACKWARD in kinds:
        names.append("B then W is torch's B" if order.split_backward else "BW is torch's B")
    return f" (zbopt's op names: {', '.join(names)})" if names else ""


def check_csv(path: str | Path) -> CheckedCsv:
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
    return CheckedCsv(str(path), order, problem)
