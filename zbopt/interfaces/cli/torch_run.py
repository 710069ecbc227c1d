"""`zbopt run-torch` and `zbopt profile-torch`: a torch CSV schedule run in
torch.distributed.pipelining, its gradients checked and its ops timed (torch is loaded only here)."""

from __future__ import annotations

import argparse
import sys

from zbopt.core.errors import ZboptError
from zbopt.interfaces.cli.output import EXIT_INVALID_SCHEDULE, check_outputs, json_text
from zbopt.io.trace import write_measured_trace

__all__ = ["PROFILE_FORMATS", "add_commands"]

PROFILE_FORMATS = (".yaml", ".yml", ".json")  # what profile-torch writes: YAML, or JSON for .json


def add_commands(commands) -> None:
    """Add `run-torch` and `profile-torch` to the subcommands `commands`."""
    running = commands.add_parser("run-torch", help="run a torch CSV schedule in torch.distributed.pipelining, "
                                  "check its gradients and time its ops")
    _add_torch_flags(running)
    running.add_argument("--json", action="store_true", help="print one JSON object")
    running.add_argument("--trace", metavar="FILE", help="write the last step as a trace for Perfetto, as "
                                                         "`export --format chrome-trace` writes the predicted one")
    running.set_defaults(run=_command_run_torch)
    profiling = commands.add_parser("profile-torch", help="run a torch CSV schedule and write its measured costs "
                                    "as a zbopt config")
    _add_torch_flags(profiling)
    profiling.add_argument("-o", "--output", required=True, metavar="CONFIG.yaml",
                           help="config file to write (.yaml, or .json)")
    profiling.set_defaults(run=_command_profile_torch)


def _add_torch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", metavar="SCHEDULE.csv",
                        help="torch compute-only CSV: one row per rank, cells like 0F1, 2I0, 2W0, 1B3")
    parser.add_argument("--steps", type=int, default=3, help="training steps, the first an untimed warm-up (default 3)")
    parser.add_argument("--microbatch-size", type=int, default=8, help="samples per microbatch (default 8)")
    parser.add_argument("--hidden", type=int, default=128, help="width of the MLP's Linear layers (default 128)")
    parser.add_argument("--layers-per-stage", type=int, default=2, help="Linear+Tanh layers per stage (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and data (default 0)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before the ranks are killed (default 120)")


def _torch_run_options(args: argparse.Namespace) -> dict:
    return {"steps": args.steps, "microbatch_size": args.microbatch_size, "hidden": args.hidden,
            "layers_per_stage": args.layers_per_stage, "seed": args.seed, "timeout_s": args.timeout}


def _say_if_gradients_differ(report) -> None:
    """The reason for exit status 1 on stderr, when the run's gradients differ from the reference."""
    if not report.passed:
        print(f"zbopt: {report.path}: gradients differ from the single-process reference "
              f"(max abs diff {report.max_abs_diff:.3g})", file=sys.stderr)


def _command_run_torch(args: argparse.Namespace) -> int:
    from zbopt.interfaces.runtime import format_report, run_torch

    if args.trace is not None and not args.trace.lower().endswith(".json"):
        raise ZboptError(f"--trace '{args.trace}': unsupported extension, use .json (e.g. run.trace.json)")
    check_outputs(args, {"--trace": args.trace}, {"the schedule": args.schedule})
    report = run_torch(args.schedule, **_torch_run_options(args))
    _say_if_gradients_differ(report)
    print(json_text(report.to_dict()) if args.json else format_report(report))
    if args.trace is not None:
        write_measured_trace(args.trace, report)
        if not args.json:
            print(f"measured trace of the last step written to {args.trace}")
    return 0 if report.passed else EXIT_INVALID_SCHEDULE


def _command_profile_torch(args: argparse.Namespace) -> int:
    from zbopt.interfaces.runtime import format_report, profile_torch

    if not args.output.lower().endswith(PROFILE_FORMATS):
        raise ZboptError(f"-o '{args.output}': unsupported extension, use {', '.join(PROFILE_FORMATS)}")
    check_outputs(args, {"-o": args.output}, {"the schedule": args.schedule})
    report, config = profile_torch(args.schedule, args.output, **_torch_run_options(args))
    _say_if_gradients_differ(report)
    print(format_report(report))
    if config is None:  # a wrong run: nothing written
        return EXIT_INVALID_SCHEDULE
    print(f"config written to {args.output} (try: zbopt solve {args.output})")
    return 0
