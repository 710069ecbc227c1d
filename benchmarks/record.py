"""Where every benchmark writes its figures: benchmarks/results/NAME.json (not versioned)."""

from __future__ import annotations

import json
import platform
from pathlib import Path


def write_results(name: str, **fields) -> Path:
    """benchmarks/results/`name`.json: the machine, then `fields`; says where it went."""
    out = Path(__file__).resolve().parent / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), **fields}, indent=1) + "\n")
    print(f"\nwritten to {out}")
    return out
