"""Config files: a YAML or JSON file's key/value mapping (the keys are the CLI's to read,
`zbopt.cli.config`)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from zbopt.errors import ZboptError


def read_config_file(path: str | Path) -> dict:
    """The key/value mapping of a YAML or JSON config file (JSON is read as YAML's subset unless
    the file ends in .json)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ZboptError(f"config file '{path}' not found") from None
    except OSError as error:
        raise ZboptError(f"config file '{path}': {error.strerror}") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as error:
        raise ZboptError(f"config file '{path}': not valid JSON (line {error.lineno}: {error.msg})") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f"line {where.line + 1}: " if where is not None else ""
        raise ZboptError(f"config file '{path}': not valid YAML ({line}{getattr(error, 'problem', error)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ZboptError(f"config file '{path}': expected a mapping of keys to values, got {type(data).__name__}")
    return data
