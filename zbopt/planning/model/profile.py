"""Measured per-layer costs read from a file: a CSV, or YAML/JSON rows, with the unit in each
column's name (ms, GB = 10^9 bytes), so the numbers themselves are bare.

    name,repeat,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb
    embedding,1,0.4,0.5,0.9,0.2,4.2
    decoder,32,1.7,1.8,1.3,0.8,1.2

`repeat` (default 1) and `weight_activation_gb` (default half of activation_gb) may be left out;
an empty `weight_ms` means a fused backward (backward_ms is then the whole BW). YAML or JSON: a
list of such rows, or {layers: [...]} as `zbopt costs --json` prints it.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from zbopt.core.errors import ZboptError, shorten
from zbopt.io.read import read_data, read_text
from zbopt.planning.model.parts import Layer, check_repeat

__all__ = ["AMOUNTS", "COLUMNS", "OPTIONAL_COLUMNS", "profile_text", "read_profile"]

COLUMNS = ("name", "forward_ms", "backward_ms", "weight_ms", "activation_gb", "parameters_gb")
OPTIONAL_COLUMNS = ("repeat", "weight_activation_gb", "gradient_gb")
AMOUNTS = ("forward_ms", "backward_ms", "weight_ms", "activation_gb", "parameters_gb", "weight_activation_gb",
           "gradient_gb")


def read_profile(path: str | Path) -> list[tuple[Layer, int]]:
    """The (layer, repeat) pairs of a profile file, in file order."""
    what = f"profile '{path}'"
    if Path(path).suffix.lower() == ".csv":
        text = read_text(path, "profile")
        rows = list(csv.reader(io.StringIO(text)))
        if not rows:
            raise ZboptError(f"{what}: empty, expected a header row ({','.join(COLUMNS)})")
        header = [cell.strip() for cell in rows[0]]
        _check_columns(header, what)
        entries = [(f"{what} line {number}", dict(zip(header, _cells(row, header, what, number), strict=True)))
                   for number, row in enumerate(rows[1:], start=2) if any(cell.strip() for cell in row)]
    else:
        data = read_data(path, "profile")
        if isinstance(data, dict) and set(data) == {"layers"}:
            data = data["layers"]
        if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
            raise ZboptError(f"{what}: expected a list of rows with keys {', '.join(COLUMNS)}")
        for row in data:
            _check_columns(list(row), what)
        entries = [(f"{what} row {index}", row) for index, row in enumerate(data)]
    if not entries:
        raise ZboptError(f"{what}: no layers")
    return [_row_layer(row, where) for where, row in entries]


def profile_text(rows: list[dict]) -> str:
    """The CSV `read_profile` reads, one line per row (dicts with COLUMNS' keys, and the optional
    columns some row gives; a weight_ms of None is a fused backward), numbers to six significant
    digits: a small layer's memory stays above 0."""
    columns = COLUMNS + tuple(column for column in OPTIONAL_COLUMNS if any(row.get(column) is not None for row in rows))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(column) is None else row[column] if column in ("name", "repeat")
                         else f"{row[column]:.6g}" for column in columns])
    return text.getvalue()


def _check_columns(names: list, what: str) -> None:
    unknown = [name for name in names if name not in COLUMNS + OPTIONAL_COLUMNS]
    if unknown:
        known = ", ".join(COLUMNS + OPTIONAL_COLUMNS)
        raise ZboptError(f"{what}: unknown column {shorten(unknown[0])} (known: {known})")
    missing = [name for name in COLUMNS if name not in names]
    if missing:
        raise ZboptError(f"{what}: missing column {missing[0]}")
    if len(set(names)) != len(names):
        raise ZboptError(f"{what}: a column is named twice")


def _cells(row: list[str], header: list[str], what: str, number: int) -> list:
    """One CSV row's cells: text to numbers (an empty cell is None), checked for width."""
    if len(row) != len(header):
        raise ZboptError(f"{what} line {number}: {len(row)} cells, the header has {len(header)}")
    values: list = []
    for name, cell in zip(header, row, strict=True):
        cell = cell.strip()
        if name == "name" or not cell:
            values.append(cell or None)
            continue
        try:
            values.append(int(cell) if name == "repeat" else float(cell))
        except ValueError:
            raise ZboptError(f"{what} line {number}: {name} = {shorten(cell)}: not a number") from None
    return values


def _row_layer(row: dict, where: str) -> tuple[Layer, int]:
    """One row as a layer: bare numbers in the column's unit; negative ones refused."""
    repeat = check_repeat(1 if row.get("repeat") is None else row["repeat"], f"{where}: repeat")
    for key in AMOUNTS:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ZboptError(f"{where}: {key} = {shorten(value)}: cannot be negative")
    try:
        layer = Layer(name=row["name"], forward_ms=row["forward_ms"], backward_ms=row["backward_ms"],
                      weight_ms=row["weight_ms"], activation_gb=row["activation_gb"],
                      parameters_gb=row["parameters_gb"], weight_activation_gb=row.get("weight_activation_gb"),
                      gradient_gb=row.get("gradient_gb"))
    except ZboptError as error:
        raise ZboptError(f"{where}: {error}") from None
    return layer, repeat
