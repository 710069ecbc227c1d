"""A schedule: per device, the ordered ops it runs, optionally with their start times.

Nothing else is stored: every metric is computed by `zbopt.simulate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from zbopt.core import interrupt
from zbopt.core.errors import ScheduleError, shorten
from zbopt.core.ops import Op
from zbopt.core.problem.checks import is_number

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Schedule", "pair_text"]

FORMAT_NAME = "zbopt-schedule"
FORMAT_VERSION = 1


def _as_op(item: Op | str | Sequence) -> Op:
    if isinstance(item, Op):
        return item
    if isinstance(item, str):
        return Op.from_str(item)
    kind, stage, microbatch = item
    return Op(kind, int(stage), int(microbatch))


def _pair_members(item: object) -> tuple[Op, ...] | None:
    """The members of an overlapped pair written "(0F7;7B3)" (a forward, then a backward's ops),
    or None when `item` is not one."""
    if not (isinstance(item, str) and item.strip().startswith("(") and item.strip().endswith(")")):
        return None
    members = tuple(Op.from_str(text) for text in item.strip()[1:-1].split(";"))
    if len(members) < 2:
        raise ScheduleError(f"{shorten(item)}: a pair needs a forward and a backward, e.g. '(0F7;7B3)'")
    return members


def _first_positions(items: list[tuple[Op, ...]]) -> list[int]:
    """The position in its order of each item's first op."""
    positions, position = [], 0
    for item in items:
        positions.append(position)
        position += len(item)
    return positions


def pair_text(members: Sequence[Op]) -> str:
    """An overlapped pair's text form, "(0F7;7B3)" (torch writes it "(0F7;7B3)OVERLAP_F_B")."""
    return "(" + ";".join(str(op) for op in members) + ")"


@dataclass(frozen=True)
class Schedule:
    """Per device d, `orders[d]` is the sequence of ops device d runs.

    `start_times[d][i]`, when given, is the start of `orders[d][i]`; the simulator then verifies
    the times instead of computing them. Ops may be given as Op, "3F1" strings or tuples.

    `pairs` are the overlapped pairs (`Problem.overlap_times`): each a forward and another
    microbatch's backward ops, consecutive in their device's order, run as one op. In an order a
    pair may be written as one item "(0F7;7B3)" (its members go into the order, the pair into
    `pairs`; its start time, when times are given, is one for all its members).

    Examples
    --------
    One microbatch through two devices, F = 1 and BW = 2 each: 1 + 1 + 2 + 2.

    >>> from zbopt import Problem, simulate
    >>> schedule = Schedule([["0F0", "0BW0"], ["1F0", "1BW0"]])
    >>> simulate(Problem(num_devices=2, num_microbatches=1), schedule).makespan
    6.0
    """

    orders: tuple[tuple[Op, ...], ...]
    start_times: tuple[tuple[float, ...], ...] | None = None
    name: str = ""
    pairs: tuple[tuple[Op, ...], ...] = ()

    def __post_init__(self) -> None:
        items_given = [len(order) for order in self.orders]  # a pair written as one item counts one
        pairs = [tuple(_as_op(op) for op in members) for members in self.pairs]
        orders, times = [], []
        for device, order in enumerate(self.orders):
            interrupt.check()  # a device's order at m = 10^4 takes a tenth of a second: a deadline stops it
            ops, device_times = [], []
            given = None if self.start_times is None or device >= len(self.start_times) else self.start_times[device]
            for position, item in enumerate(order):
                members = _pair_members(item)
                copies = 1 if members is None else len(members)
                if members is not None:
                    pairs.append(members)
                ops.extend([_as_op(item)] if members is None else members)
                if given is not None and position < len(given):
                    device_times.extend([float(given[position])] * copies)
            orders.append(tuple(ops))
            times.append(device_times)
        object.__setattr__(self, "orders", tuple(orders))
        object.__setattr__(self, "pairs", tuple(pairs))
        if self.start_times is not None:
            written = [len(device_times) for device_times in self.start_times]
            if len(written) != len(items_given):
                raise ScheduleError(f"start_times has {len(written)} devices, orders has {len(items_given)}")
            for device, (count, items) in enumerate(zip(written, items_given, strict=True)):
                if count != items:
                    raise ScheduleError(f"device {device}: {items} ops but {count} start times")
            object.__setattr__(self, "start_times", tuple(tuple(device_times) for device_times in times))

    @property
    def num_devices(self) -> int:
        return len(self.orders)

    def without_times(self) -> Schedule:
        """The same orders (and pairs), to be timed by the simulator."""
        return self._copy(start_times=None)

    def renamed(self, name: str) -> Schedule:
        """The same schedule under another name."""
        return self._copy(name=name)

    def _copy(self, **changes) -> Schedule:
        """A copy with `changes` to fields that need no check again: this one's orders are already
        normalised, and at 10^5 ops checking them anew (`dataclasses.replace`) takes a quarter second."""
        copy = object.__new__(Schedule)
        for field in dataclasses.fields(self):
            object.__setattr__(copy, field.name, changes.get(field.name, getattr(self, field.name)))
        return copy

    def items(self, device: int) -> list[tuple[Op, ...]]:
        """Device `device`'s order as written: one tuple per item, an op alone or an overlapped
        pair's members."""
        heads = {members[0]: members for members in self.pairs}
        order, items, position = self.orders[device], [], 0
        while position < len(order):
            members = heads.get(order[position])
            if members is None or tuple(order[position:position + len(members)]) != members:
                members = (order[position],)
            items.append(members)
            position += len(members)
        return items

    def to_dict(self) -> dict:
        data: dict = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "name": self.name}
        written = [self.items(device) for device in range(self.num_devices)]
        data["orders"] = [[str(item[0]) if len(item) == 1 else pair_text(item) for item in items] for items in written]
        if self.start_times is not None:  # one per item: a pair's members start together
            data["start_times"] = [[times[position] for position in _first_positions(items)]
                                   for items, times in zip(written, self.start_times, strict=True)]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Schedule:
        if not isinstance(data, dict) or "orders" not in data:
            raise ScheduleError("a schedule needs an 'orders' list (one list of ops per device)")
        if data.get("format", FORMAT_NAME) != FORMAT_NAME:
            raise ScheduleError(f"format {shorten(data['format'])} is not {FORMAT_NAME!r}")
        orders = _per_device(data, "orders", _is_op_text, "ops", "an op, e.g. '0F0' or '(0F7;7B3)'")
        times = _per_device(data, "start_times", is_number, "numbers", "a number") if "start_times" in data else None
        pairs = data.get("pairs", [])  # as `simulate --json` writes them, beside orders of single ops
        if not isinstance(pairs, list) or any(_pair_members(text) is None for text in pairs):
            raise ScheduleError("'pairs' must be a list of overlapped pairs, e.g. ['(0F7;7B3)']")
        if not isinstance(data.get("name", ""), str):
            raise ScheduleError(f"'name' must be a text, got {shorten(data['name'])}")
        return cls(orders, times, data.get("name", ""), tuple(map(_pair_members, pairs)))


def _is_op_text(item: object) -> bool:
    """An op as a schedule file writes it: "3F1", a pair "(0F7;7B3)", or [kind, stage, microbatch]."""
    if isinstance(item, list):
        return (len(item) == 3 and isinstance(item[0], str)
                and all(isinstance(n, int) and not isinstance(n, bool) for n in item[1:]))
    return isinstance(item, str)


def _per_device(data: dict, key: str, valid, what: str, one: str) -> list:
    """data[key], checked to be one list per device of items `valid` accepts."""
    lists = data[key]
    if not isinstance(lists, list) or not all(isinstance(items, list) for items in lists):
        raise ScheduleError(f"'{key}' must be a list with one list of {what} per device")
    for device, items in enumerate(lists):
        for position, item in enumerate(items):
            if not valid(item):
                raise ScheduleError(f"'{key}' of device {device}, item {position}: {shorten(item)} is not {one}")
    return lists


