"""What a run is given (a config file, flag values, a schedule by name or as a file) -> the
RunConfig (the Problem, `zbopt.core.problem.config`, plus the run's own options: the charts to write)
and the Schedule to work on.

Flags win over the config file; a schedule file's own layout (a torch CSV's ranks, stages and
microbatches) or stored problem (a zbopt JSON's) fills only what neither of them gives. An error
names each value where it came from: the flag, the config file's key or the schedule file's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.problem import Problem
from zbopt.core.problem.config import FLAG, KEYS, problem_from_config, same_parameter
from zbopt.core.schedule import Schedule
from zbopt.core.tolerance import latest_start
from zbopt.io.read import load_schedule, read_config_file
from zbopt.io.torch_order import read_torch_csv
from zbopt.schedules import named_schedule

__all__ = ["DEFAULT_SCHEDULE", "OPTION_KEYS", "RunConfig", "build_run_config", "is_schedule_file", "run_and_schedule",
           "run_config", "schedule_from_file"]

DEFAULT_SCHEDULE = "1f1b"
OPTION_KEYS = ("output_file",)


@dataclass(frozen=True)
class RunConfig:
    """A problem and the options that came with it."""

    problem: Problem
    outputs: tuple[str, ...] = ()  # the charts to write (-o, each time it is given; or the config's output_file)


def build_run_config(values: dict, source: str = "config", sources: Mapping[str, str] | None = None) -> RunConfig:
    """`values` (config keys, aliases allowed, and OPTION_KEYS) as a RunConfig; the errors are
    `problem_from_config`'s, and one for an output file that is not a name (or a list of names)."""
    output = values.get("output_file")
    outputs = [] if output is None else output if isinstance(output, list) else [output]
    if not all(isinstance(name, str) for name in outputs):
        raise ZboptError(f"{source}: output_file = {shorten(output)}: expected a file name")
    return RunConfig(problem_from_config(values, source, sources, ignored=OPTION_KEYS), tuple(outputs))


def run_config(config_file: str | Path | None, flags: dict, implied: dict | None = None,
               implied_by: str = "") -> RunConfig:
    """The problem of `config_file` (optional) with `flags` (config keys given as command-line
    flags) over it; `implied` (problem parameters the schedule file `implied_by` implies) fills
    each parameter neither of them gives."""
    values = read_config_file(config_file) if config_file else {}
    values = _override(values, flags)
    sources = dict.fromkeys(flags, FLAG)
    if implied:
        given = {same_parameter(key) for key in values}
        filled = {key: value for key, value in implied.items() if key not in given}
        values.update(filled)
        sources.update(dict.fromkeys(filled, implied_by))
    return build_run_config(values, source=str(config_file) if config_file else "flags", sources=sources)


def _override(values: dict, overrides: dict) -> dict:
    """Overrides replace the file's value for the same parameter, whichever alias either used."""
    merged = dict(values)
    for key, value in overrides.items():
        target = KEYS.get(key, key)
        for existing in [k for k in merged if KEYS.get(k, k) == target]:
            del merged[existing]
        merged[key] = value
    return merged


def is_schedule_file(path: str | Path) -> bool:
    """Whether a file given in a config's place is a schedule: a torch CSV, or a JSON with the
    'orders' of a zbopt schedule (`zbopt export SCHEDULE.json -o FILE.csv`)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return True
    return suffix == ".json" and "orders" in read_config_file(path)


def schedule_from_file(schedule_file: str | Path, config_file: str | Path | None,
                       flags: dict) -> tuple[RunConfig, Schedule]:
    """A torch CSV (.csv), whose layout fills what the config and flags leave out, or a zbopt JSON
    schedule, whose stored problem fills what the config and flags leave out."""
    path = Path(schedule_file)
    if path.suffix.lower() == ".csv":
        order = read_torch_csv(path)
        run = run_config(config_file, flags, order.layout, str(path))
        return run, order.to_schedule(run.problem, path.name)
    schedule, stored = load_schedule(path)
    run = run_config(config_file, flags, None if stored is None else stored.to_dict(), str(path))
    latest = latest_start(run.problem)
    for device, times in enumerate(schedule.start_times or ()):
        for position, time in enumerate(times):
            if abs(time) > latest:
                raise ZboptError(f"schedule file '{path}': start_times of device {device}, item {position}: "
                                 f"{time:g} is outside +-{latest:.3g}, the range zbopt's tolerance holds in")
    return run, schedule


def run_and_schedule(config_file: str | Path | None, flags: dict, schedule: str | None = None,
                     options: dict | None = None, schedule_file: str | Path | None = None,
                     order: str | list[int] | None = None) -> tuple[RunConfig, Schedule]:
    """The problem and the schedule of `zbopt simulate` and `zbopt export`: from `schedule_file`
    (or a schedule file given as `config_file`), or by name (default 1f1b) with its generator's
    `options`, its microbatches entering in `order`; "torch:NAME" is torch's built-in NAME."""
    if schedule_file is None and config_file and is_schedule_file(config_file):
        schedule_file, config_file = config_file, None
    if schedule_file is None:
        run = run_config(config_file, flags)
        return run, named_schedule(schedule or DEFAULT_SCHEDULE, run.problem, order, **(options or {}))
    if schedule is not None or options:
        raise ZboptError("--schedule-file: give it without --schedule and --option")
    if order is not None:
        raise ZboptError("--order orders a generated schedule (--schedule); a schedule file's order is its own")
    return schedule_from_file(schedule_file, config_file, flags)
