"""Quantities written with their unit ("1.7 ms", "80 GB", "400 TFLOPS", "50 GB/s"), converted once
where a model or device is read, so that everything past the edge holds plain floats in one unit
each: times in ms, memory in GB (10^9 bytes), compute in FLOP/s, bandwidth in GB/s.

A bare number is refused: "80" could be GB or GiB (7% apart), "1.7" ms or s. GB, MB and TB are
powers of ten (SI); GiB, MiB and TiB powers of two (IEC 80000-13).
"""

from __future__ import annotations

import math
import re

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.tolerance import MAX_TOTAL

__all__ = ["BANDWIDTH_UNITS", "FLOPS_UNITS", "MEMORY_UNITS", "TIME_UNITS", "parse_bandwidth", "parse_flops",
           "parse_memory", "parse_time"]

TIME_UNITS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "µs": 1e-3}  # -> ms
MEMORY_UNITS = {"B": 1e-9, "KB": 1e-6, "MB": 1e-3, "GB": 1.0, "TB": 1e3,  # -> GB
                "KiB": 2**10 / 1e9, "MiB": 2**20 / 1e9, "GiB": 2**30 / 1e9, "TiB": 2**40 / 1e9}
FLOPS_UNITS = {f"{prefix}{spelling}": scale  # -> FLOP/s; "TFLOPS" and "TFLOP/s" alike
               for prefix, scale in (("", 1.0), ("G", 1e9), ("T", 1e12), ("P", 1e15))
               for spelling in ("FLOPS", "FLOP/s")}
BANDWIDTH_UNITS = {**{f"{unit}/s": scale for unit, scale in MEMORY_UNITS.items() if unit != "B"},  # -> GB/s
                   "Gb/s": 0.125, "Tb/s": 125.0}  # network links are quoted in bits: 400 Gb/s = 50 GB/s

_QUANTITY = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S.*?)?\s*")


def parse_time(text: object, key: str) -> float:
    """`text` ("1.7 ms", "2 s", "300 us") in ms; at least 0, at most MAX_TOTAL ms (zbopt's range).
    `key` names it in a message."""
    return _within_range(_parse(text, key, TIME_UNITS, "time", "1.7 ms"), text, key, "ms")


def parse_memory(text: object, key: str) -> float:
    """`text` ("80 GB", "0.5 GiB", "512 MiB") in GB (10^9 bytes); at least 0, at most MAX_TOTAL GB."""
    return _within_range(_parse(text, key, MEMORY_UNITS, "memory", "80 GB"), text, key, "GB")


def _within_range(value: float, text: object, key: str, unit: str) -> float:
    """`value`, or one line where it is beyond what zbopt's times and memory may reach."""
    if value > MAX_TOTAL:
        raise ZboptError(f"{key} = {shorten(text)}: at most {MAX_TOTAL:g} {unit} (zbopt's range)")
    return value


def parse_flops(text: object, key: str) -> float:
    """`text` ("400 TFLOPS", "1 PFLOP/s") in FLOP/s; more than 0."""
    value = _parse(text, key, FLOPS_UNITS, "compute rate", "400 TFLOPS")
    if value == 0:
        raise ZboptError(f"{key} = {shorten(text)}: must be more than 0")
    return value


def parse_bandwidth(text: object, key: str) -> float:
    """`text` ("50 GB/s", "400 Gb/s", "900 GiB/s") in GB/s; more than 0."""
    value = _parse(text, key, BANDWIDTH_UNITS, "bandwidth", "50 GB/s")
    if value == 0:
        raise ZboptError(f"{key} = {shorten(text)}: must be more than 0")
    return value


def _parse(text: object, key: str, units: dict[str, float], what: str, example: str) -> float:
    """One quantity in the unit every value of `units` converts to; every mistake one line."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ZboptError(f"{key} = {shorten(text)}: expected a {what} with its unit, e.g. '{example}'")
    match = _QUANTITY.fullmatch(str(text))
    if match is None:
        raise ZboptError(f"{key} = {shorten(text)}: expected a {what} with its unit, e.g. '{example}'")
    number, unit = match.groups()
    if unit is None:
        raise ZboptError(f"{key} = {shorten(text)}: write the unit, e.g. '{number} {example.split()[1]}'")
    if unit not in units:
        raise ZboptError(f"{key} = {shorten(text)}: unknown unit {shorten(unit)} (known: {', '.join(units)})")
    value = float(number) * units[unit]
    if not math.isfinite(value):
        raise ZboptError(f"{key} = {shorten(text)}: not a finite {what}")
    if value < 0:
        raise ZboptError(f"{key} = {shorten(text)}: a {what} cannot be negative")
    return value
