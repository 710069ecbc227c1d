"""Config files: a YAML or JSON file's key/value mapping, and the Problem it describes."""

from __future__ import annotations

from pathlib import Path

from zbopt.core.errors import ZboptError
from zbopt.core.problem import Problem
from zbopt.core.problem.config import problem_from_config
from zbopt.io.read import read_data

__all__ = ["load_problem", "read_config_file"]


def read_config_file(path: str | Path) -> dict:
    """The key/value mapping of a YAML or JSON config file (JSON is read as YAML's subset unless
    the file ends in .json), read through `zbopt.io.read`'s limits."""
    data = read_data(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ZboptError(f"config file '{path}': expected a mapping of keys to values, got {type(data).__name__}")
    return data


def load_problem(path: str | Path) -> Problem:
    """The Problem a YAML or JSON config file describes, as `zbopt simulate CONFIG` reads it (the
    same keys, aliases, batch keys and defaults; `output_file`, the command line's chart, is not
    the problem's and is passed over). Every mistake is one ZboptError naming the file and key.

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.yaml"
    >>> _ = path.write_text("num_stages: 2\\nnum_microbatches: 4\\nforward_times: 1\\n")
    >>> load_problem(path).describe()
    'p=2 devices, m=4 microbatches, v=1 chunk per device (loop placement), fused backward (F, BW)'
    """
    return problem_from_config(read_config_file(path), source=str(path), ignored=("output_file",))
