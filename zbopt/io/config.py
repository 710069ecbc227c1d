"""Config files: a YAML or JSON file's key/value mapping (the keys are the CLI's to read,
`zbopt.cli.config`)."""

from __future__ import annotations

from pathlib import Path

from zbopt.errors import ZboptError
from zbopt.io.read import read_data


def read_config_file(path: str | Path) -> dict:
    """The key/value mapping of a YAML or JSON config file (JSON is read as YAML's subset unless
    the file ends in .json), read through `zbopt.io.read`'s limits."""
    data = read_data(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ZboptError(f"config file '{path}': expected a mapping of keys to values, got {type(data).__name__}")
    return data
