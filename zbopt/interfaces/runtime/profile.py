"""A run's measured costs as a zbopt config, so that `zbopt solve` optimizes a schedule for them."""

from __future__ import annotations

import json
from pathlib import Path

from zbopt.core.errors import ZboptError
from zbopt.interfaces.runtime.launch import run_torch
from zbopt.interfaces.runtime.run_report import TorchRunReport
from zbopt.io.torch_format import TORCH_FORWARD, TORCH_FULL_BACKWARD, TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD
from zbopt.io.write import write_file

__all__ = ["MIB", "profile_config", "profile_torch", "save_profile"]

MIB = 2**20


def _milliseconds(seconds: float) -> float:
    """Four significant digits (never rounds a positive time to 0)."""
    return float(f"{seconds * 1e3:.4g}")


def profile_config(report: TorchRunReport) -> dict:
    """A zbopt config (the keys of zbopt.interfaces.cli.inputs) with the run's measured costs.

    Times are medians in milliseconds (medians: ranks share few cores, so a preempted op must not
    skew the mean); per virtual stage in stage order. backward_times is I and weight_times W when
    the schedule split the backward, else backward_times is B. p2p_time is the measured one-way
    time of one activation (0 with a single rank). activation_memory is the saved-activation MiB
    of one microbatch per stage; weight_memory is left to zbopt's default (not measured).

    Raises ZboptError when zbopt's Problem cannot express the run: a backward split on some
    stages and fused on others.
    """
    kinds = {frozenset(stage.times) for stage in report.stages}
    if kinds == {frozenset((TORCH_FORWARD, TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD))}:
        backward, weight = TORCH_INPUT_BACKWARD, TORCH_WEIGHT_BACKWARD
    elif kinds == {frozenset((TORCH_FORWARD, TORCH_FULL_BACKWARD))}:
        backward, weight = TORCH_FULL_BACKWARD, None
    else:
        raise ZboptError(
            f"{report.path}: some stages split the backward (I, W) and others fuse it (B); "
            "a zbopt config needs one or the other"
        )

    def per_stage(kind: str) -> list[float]:
        return [_milliseconds(stage.times[kind].median_s) for stage in report.stages]

    config = {
        "num_stages": report.num_ranks,
        "num_microbatches": report.num_microbatches,
        "chunks_per_device": report.num_stages // report.num_ranks,
        "placement": report.placement,
        "forward_times": per_stage(TORCH_FORWARD),
        "backward_times": per_stage(backward),
    }
    if weight is not None:
        config["weight_times"] = per_stage(weight)
    config["p2p_time"] = _milliseconds(report.p2p_time_s) if report.p2p_time_s is not None else 0.0
    config["activation_memory"] = [float(f"{stage.activation_bytes / MIB:.4g}") for stage in report.stages]
    return config


def save_profile(config: dict, path: str | Path, report: TorchRunReport) -> None:
    """Write `config` as YAML (JSON when `path` ends in .json), with a header saying where it came from."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        write_file(path, json.dumps(config, indent=2) + "\n")
        return
    import yaml

    model = report.model
    header = (
        f"# Measured by zbopt profile-torch from {report.path}: {report.num_ranks} CPU ranks (gloo), "
        f"{report.steps - 1} timed steps.\n"
        f"# Model: {report.num_stages} stages x {model.layers_per_stage} (Linear {model.hidden}, Tanh), "
        f"microbatch size {model.microbatch_size}.\n"
        "# Times: median wall time per op in ms (p2p_time: one-way, measured); "
        "activation_memory: saved-activation MiB per microbatch.\n"
    )
    write_file(path, header + yaml.safe_dump(config, sort_keys=False, default_flow_style=None))


def profile_torch(
    path: str | Path, output: str | Path | None = None, **run_options
) -> tuple[TorchRunReport, dict | None]:
    """`run_torch(path, **run_options)`, then `profile_config`, written to `output` when given.

    A wrong run is not profiled: when the gradients differ from the reference the config is None
    and nothing is written, and the caller decides what to say (the report tells how they differ).
    """
    report = run_torch(path, **run_options)
    if not report.passed:
        return report, None
    config = profile_config(report)
    if output is not None:
        save_profile(config, output, report)
    return report, config
