"""A run's settings (a config file's keys, flag values) -> the Problem (`zbopt.core.problem.config`)
plus the run's own options (the chart to write)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.problem import Problem
from zbopt.core.problem.config import problem_from_config

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
