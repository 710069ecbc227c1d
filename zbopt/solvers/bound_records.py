"""What the lower bounds give (`bounds`): each `Bound` with its name, value, time and devices, and
`LowerBounds`, every bound of one call with the best. Every bound's name is in BOUND_NAMES."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BOUND_NAMES", "Bound", "LowerBounds", "on_device"]

# every bound's name, in the order ties go (the cheaper first); the last two bound the span objective
BOUND_NAMES = ("critical_path", "device_load", "one_machine", "memory", "pair_count", "heaviest_microbatches",
               "device_sequencing", "device_relaxation", "cross_device", "iteration_ends", "device_work", "span")


@dataclass(frozen=True)
class Bound:
    """One lower bound on the makespan (or on the iteration time, never shorter): its name, its
    value (problem units), the seconds it took, and the devices whose ops it reasoned about where
    it reasons about some (empty: the whole problem, or not known)."""

    name: str
    value: float
    seconds: float = 0.0
    devices: tuple[int, ...] = ()

    def describe(self) -> str:
        """The name, with the devices where the bound reasons about some: "device_sequencing on device 7"."""
        if not self.devices:
            return self.name
        word = "device" if len(self.devices) == 1 else "devices"
        return f"{self.name} on {word} {', '.join(map(str, self.devices))}"


@dataclass(frozen=True)
class LowerBounds:
    """Every bound computed (`lower_bounds` on the makespan, `span_bounds` on the span), and the
    best of them. A bound skipped because it could not beat the others (see
    `device_sequencing`), or not reached before the deadline, is 0; `complete` is False when a
    deadline cut some short."""

    bounds: tuple[Bound, ...] = ()
    complete: bool = True

    def __getitem__(self, name: str) -> float:
        """The value of the bound `name` (0 where it was not computed)."""
        if name not in BOUND_NAMES:
            raise KeyError(f"no lower bound named {name!r} (known: {', '.join(BOUND_NAMES)})")
        return max((bound.value for bound in self.bounds if bound.name == name), default=0.0)

    def by_name(self) -> dict[str, float]:
        """Every computed bound's value by its name."""
        return {name: self[name] for name in BOUND_NAMES if any(bound.name == name for bound in self.bounds)}

    @property
    def binding_bound(self) -> Bound:
        """The bound that gives `best` (the first in BOUND_NAMES' order, on a tie)."""
        order = {name: index for index, name in enumerate(BOUND_NAMES)}
        return max(sorted(self.bounds, key=lambda bound: order[bound.name]), key=lambda bound: bound.value,
                   default=Bound(BOUND_NAMES[0], 0.0))

    @property
    def best(self) -> float:
        return self.binding_bound.value

    @property
    def binding(self) -> str:
        """The name of the bound that gives `best`."""
        return self.binding_bound.name

    def as_dict(self) -> dict[str, float]:
        return {**self.by_name(), "best": self.best}


def on_device(name: str, values: list[float], seconds: float) -> Bound:
    """A per-device bound: the largest of its devices' values, on the device that gives it."""
    best = max(range(len(values)), key=values.__getitem__)
    return Bound(name, values[best], seconds, (best,))
