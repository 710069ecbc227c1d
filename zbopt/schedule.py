"""A schedule: per device, the ordered ops it runs, optionally with their start times.

Nothing else is stored: every metric is computed by `zbopt.simulate`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zbopt.errors import ScheduleError, ZboptError
from zbopt.ops import Op
from zbopt.problem import Problem

FORMAT_NAME = "zbopt-schedule"
FORMAT_VERSION = 1


def _as_op(item: Op | str | Sequence) -> Op:
    if isinstance(item, Op):
        return item
    if isinstance(item, str):
        return Op.from_str(item)
    kind, stage, microbatch = item
    return Op(kind, int(stage), int(microbatch))


@dataclass(frozen=True)
class Schedule:
    """Per device d, `orders[d]` is the sequence of ops device d runs.

    `start_times[d][i]`, when given, is the start of `orders[d][i]`; the simulator then verifies
    the times instead of computing them. Ops may be given as Op, "3F1" strings or tuples.
    """

    orders: tuple[tuple[Op, ...], ...]
    start_times: tuple[tuple[float, ...], ...] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        orders = tuple(tuple(_as_op(item) for item in order) for order in self.orders)
        object.__setattr__(self, "orders", orders)
        if self.start_times is not None:
            times = tuple(tuple(float(t) for t in device_times) for device_times in self.start_times)
            if len(times) != len(orders):
                raise ScheduleError(f"start_times has {len(times)} devices, orders has {len(orders)}")
            for device, (order, device_times) in enumerate(zip(orders, times, strict=True)):
                if len(order) != len(device_times):
                    raise ScheduleError(
                        f"device {device}: {len(order)} ops but {len(device_times)} start times"
                    )
            object.__setattr__(self, "start_times", times)

    @property
    def num_devices(self) -> int:
        return len(self.orders)

    def without_times(self) -> Schedule:
        """The same orders, to be timed by the simulator."""
        return Schedule(self.orders, None, self.name)

    def to_dict(self) -> dict:
        data: dict = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "name": self.name}
        data["orders"] = [[str(op) for op in order] for order in self.orders]
        if self.start_times is not None:
            data["start_times"] = [list(times) for times in self.start_times]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Schedule:
        if not isinstance(data, dict) or "orders" not in data:
            raise ScheduleError("a schedule needs an 'orders' list (one list of ops per device)")
        if data.get("format", FORMAT_NAME) != FORMAT_NAME:
            raise ScheduleError(f"format {data['format']!r} is not {FORMAT_NAME!r}")
        orders = data["orders"]
        if not isinstance(orders, list) or not all(isinstance(order, list) for order in orders):
            raise ScheduleError("'orders' must be a list with one list of ops per device")
        return cls(orders, data.get("start_times"), data.get("name", ""))


def save_schedule(path: str | Path, schedule: Schedule, problem: Problem | None = None) -> None:
    """Write `schedule` (and the problem it is for, when given) as JSON."""
    data = schedule.to_dict()
    if problem is not None:
        data["problem"] = problem.to_dict()
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def load_schedule(path: str | Path) -> tuple[Schedule, Problem | None]:
    """Read a schedule JSON written by `save_schedule`; returns the schedule and its problem if stored."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ZboptError(f"schedule file '{path}' not found") from None
    except json.JSONDecodeError as error:
        raise ZboptError(f"schedule file '{path}': not valid JSON ({error})") from None
    schedule = Schedule.from_dict(data)
    problem = Problem.from_dict(data["problem"]) if "problem" in data else None
    return schedule, problem
