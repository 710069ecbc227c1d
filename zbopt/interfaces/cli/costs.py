"""`zbopt costs MODEL.yaml`: the per-layer costs a model file gives or derives (from an
architecture, a preset or a profile), as a table with units or as JSON."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

__all__ = ["COLUMNS", "SUMMED", "add_commands", "format_costs"]

if TYPE_CHECKING:
    from zbopt.planning.model import Model

COLUMNS = (("name", "layer"), ("repeat", "repeat"), ("forward_ms", "F (ms)"), ("backward_ms", "B (ms)"),
           ("weight_ms", "W (ms)"), ("activation_gb", "M_B (GB)"), ("weight_activation_gb", "M_W (GB)"),
           ("parameters_gb", "parameters (GB)"), ("gradient_gb", "gradient (GB)"))
SUMMED = ("forward_ms", "backward_ms", "weight_ms", "activation_gb", "weight_activation_gb", "parameters_gb")


def add_commands(commands) -> None:
    """Add `costs` to the subcommands `commands`."""
    costs = commands.add_parser("costs", help="print a model's per-layer costs (given, measured, or derived from "
                                              "an architecture and a device)")
    costs.add_argument("model", metavar="MODEL.yaml", help="model file: {model: ..., device: ...} (YAML or JSON)")
    costs.add_argument("--json", action="store_true", help="print one JSON object: {layers: [...]}, one per group")
    costs.set_defaults(run=_command_costs)


def _command_costs(args: argparse.Namespace) -> int:
    from zbopt.planning.model import load_model  # loaded by this command only: `zbopt --help` stays quick

    model, _ = load_model(args.model)
    if args.json:
        print(json.dumps({"layers": model.group_rows()}, indent=1))
    else:
        print(format_costs(model))
    return 0


def format_costs(model: Model) -> str:
    """One line per group as written, then the total over every layer (GB = 10^9 bytes; a fused
    backward shows W as "fused", its B being the whole BW)."""
    from zbopt.planning.model.collectives import gradient_of
    from zbopt.presentation.tables import aligned

    rows = [{key: _cell(key, row.get(key)) for key, _ in COLUMNS} for row in model.group_rows()]
    start = 0
    for row, (_, count) in zip(rows, model.groups, strict=True):  # the gradient reduced: given, or the rule's
        row["gradient_gb"] = _cell("gradient_gb", gradient_of(model.layers[start], model.training))
        start += count
    totals = {key: sum((getattr(layer, key) or 0.0) for layer in model.layers) for key in SUMMED}
    totals["gradient_gb"] = sum(gradient_of(layer, model.training) for layer in model.layers)
    rows.append({"name": "total", "repeat": str(len(model.layers)),
                 **{key: _cell(key, totals[key]) for key in (*SUMMED, "gradient_gb")}})
    table = [[title for _, title in COLUMNS], *([row[key] for key, _ in COLUMNS] for row in rows)]
    return "\n".join([*aligned(table), "(times and activations per microbatch; parameters include gradients and "
                                        "optimizer state; the gradient is what a step's data-parallel reduction "
                                        "moves; GB = 10^9 bytes)"])


def _cell(key: str, value: object) -> str:
    if value is None:
        return "fused" if key == "weight_ms" else "-"
    return str(value) if isinstance(value, (str, int)) else f"{value:.4g}"
