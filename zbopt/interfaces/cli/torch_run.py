"""`zbopt run-torch` and `zbopt profile-torch`: a torch CSV schedule run in
torch.distributed.pipelining, its gradients checked and its ops timed; `zbopt profile-model`: a
user's own model measured layer by layer (torch is loaded only here)."""

from __future__ import annotations

import argparse
import sys

from zbopt.core.errors import ZboptError
from zbopt.interfaces.cli.output import EXIT_INVALID_SCHEDULE, check_outputs, json_text
from zbopt.interfaces.runtime.launch import LOWERINGS
from zbopt.io.trace import write_measured_trace
from zbopt.io.write import write_file

__all__ = ["PROFILE_FORMATS", "TOY_FLAGS", "add_commands"]

PROFILE_FORMATS = (".yaml", ".yml", ".json")  # what profile-torch writes: YAML, or JSON for .json
# the toy model's sizes: flag, run_torch's option (the flag's destination), default, meaning
TOY_FLAGS = (("--microbatch-size", "microbatch_size", 8, "samples per microbatch of the toy MLP"),
             ("--hidden", "hidden", 128, "width of the toy MLP's Linear layers"),
             ("--layers-per-stage", "layers_per_stage", 2, "the toy MLP's Linear+Tanh layers per stage"))


def add_commands(commands) -> None:
    """Add `run-torch`, `profile-torch` and `profile-model` to the subcommands `commands`."""
    running = commands.add_parser("run-torch", help="run a torch CSV schedule in torch.distributed.pipelining, "
                                  "check its gradients and time its ops; or a plan on your own model (--model)")
    _add_torch_flags(running)
    running.add_argument("--model", metavar="PACKAGE.MODULE:FACTORY",
                         help="run a plan (the JSON plan --json prints, or plan --export's JSON: the positional "
                              "file) on your own model, cut at the plan's split (see profile-model)")
    running.add_argument("--row", action="append", default=[], metavar="ROW",
                         help="with --model: run this row of the plan (its index in the JSON's rows, or a schedule's "
                              "name: its fastest row) instead of the best; may be repeated")
    running.add_argument("--data-parallel", type=int, default=1, metavar="N",
                         help="N replicas of the toy model's pipeline, their stages replicated over a data-parallel "
                              "group (torch's replicate), each on its share of a batch N times as large (default 1)")
    running.add_argument("--lowering", choices=LOWERINGS, default="torch",
                         help="who adds the sends, receives and REDUCE_GRAD: torch's runtime (default), or zbopt "
                              "(its torch-comms-csv of the same order, run with format=compute_comms)")
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
    layers = commands.add_parser("profile-model", help="measure your own torch model layer by layer (F, B, W, "
                                 "activation and parameter memory) and write the profile CSV plan reads")
    layers.add_argument("model", metavar="PACKAGE.MODULE:FACTORY",
                        help="a function returning (layers, sample) or (layers, sample, loss): an nn.Sequential, a "
                             "list of modules or a mapping FQN -> module, and one microbatch's input")
    layers.add_argument("-o", "--output", metavar="LAYERS.csv", help="profile CSV to write (model: {profile: ...})")
    layers.add_argument("--repeats", type=int, default=10, help="timed rounds per layer (default 10)")
    layers.add_argument("--warmup", type=int, default=3, help="untimed rounds per layer first (default 3)")
    layers.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                        help="whose state the parameters' memory counts (default adam: two tensors per weight)")
    layers.add_argument("--device", help="where to run, e.g. cpu or cuda (default: where the layers are)")
    layers.add_argument("--json", action="store_true", help="print one JSON object: {layers: [...]}")
    layers.set_defaults(run=_command_profile_model)


def _add_torch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schedule", metavar="SCHEDULE.csv",
                        help="torch compute-only CSV: one row per rank, cells like 0F1, 2I0, 2W0, 1B3")
    parser.add_argument("--steps", type=int, default=3, help="training steps, the first an untimed warm-up (default 3)")
    for flag, key, default, meaning in TOY_FLAGS:
        parser.add_argument(flag, dest=key, type=int, help=f"{meaning} (default {default})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and data (default 0)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds before the ranks are killed (default 120)")


def _torch_run_options(args: argparse.Namespace) -> dict:
    """run_torch's options from the flags; the toy model's sizes at their defaults where not given."""
    sizes = {key: default if getattr(args, key) is None else getattr(args, key) for _, key, default, _ in TOY_FLAGS}
    return {"steps": args.steps, **sizes, "seed": args.seed, "timeout_s": args.timeout}


def _say_if_gradients_differ(report) -> None:
    """The reason for exit status 1 on stderr, when the run's gradients differ from the reference."""
    if not report.passed:
        print(f"zbopt: {report.path}: gradients differ from the single-process reference "
              f"(max abs diff {report.max_abs_diff:.3g})", file=sys.stderr)


def _command_run_torch(args: argparse.Namespace) -> int:
    from zbopt.interfaces.runtime import format_report, run_torch

    if args.model is not None:
        if args.data_parallel != 1 or args.lowering != "torch":
            raise ZboptError("--data-parallel and --lowering run the toy model (a plan on your own model runs one "
                             "pipeline, lowered by torch): drop them or --model")
        return _run_plan(args)
    if args.row:
        raise ZboptError("--row picks a plan's row to run on your model: give --model too")
    if args.trace is not None and not args.trace.lower().endswith(".json"):
        raise ZboptError(f"--trace '{args.trace}': unsupported extension, use .json (e.g. run.trace.json)")
    check_outputs(args, {"--trace": args.trace}, {"the schedule": args.schedule})
    report = run_torch(args.schedule, **_torch_run_options(args), data_parallel=args.data_parallel,
                       lowering=args.lowering)
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


def _command_profile_model(args: argparse.Namespace) -> int:
    from zbopt.interfaces.runtime.layer_profile import format_profile, profile_user_model
    from zbopt.interfaces.runtime.user_model import load_user_model
    from zbopt.planning.model.profile import profile_text

    if args.output is not None and not args.output.lower().endswith(".csv"):
        raise ZboptError(f"-o '{args.output}': unsupported extension, use .csv (the profile plan reads)")
    model = load_user_model(args.model)
    check_outputs(args, {"-o": args.output}, {"the model's module": model.source} if model.source else None)
    profile = profile_user_model(model, repeats=args.repeats, warmup=args.warmup, optimizer=args.optimizer,
                                 device=args.device, where=f"model {args.model!r}")
    rows = [cost.profile_row() for cost in profile.layers]
    if args.output is not None:
        write_file(args.output, profile_text(rows))
    if args.json:
        print(json_text({"layers": [{**row, "forward_flops": cost.forward_flops, "spread": cost.spread}
                                    for row, cost in zip(rows, profile.layers, strict=True)]}))
        return 0
    print(format_profile(profile))
    if args.output is not None:
        print(f"profile written to {args.output} (a model file takes it as model: {{profile: {args.output}}})")
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    """run-torch PLAN --model: each chosen row run on the user's model; exit 1 where gradients differ."""
    from zbopt.interfaces.runtime.plan_run import format_plan_runs, run_plan

    given = [flag for flag, key, _, _ in TOY_FLAGS if getattr(args, key) is not None]
    if given or args.trace is not None:
        raise ZboptError(f"{(given or ['--trace'])[0]}: not with --model (the toy model's, or one CSV's run)")
    if args.schedule.lower().endswith(".csv"):
        raise ZboptError(f"'{args.schedule}': a torch CSV holds no split; with --model give the plan's JSON "
                         "(plan --json > plan.json, or plan --export plan.json)")
    runs = run_plan(args.schedule, args.model, rows=args.row, steps=args.steps, seed=args.seed,
                    timeout_s=args.timeout)
    if args.json:
        print(json_text({"runs": [{"label": run.entry.label, "split": list(run.entry.split),
                                   "predicted_ms": run.entry.predicted_ms, "measured_ms": run.measured_ms,
                                   "report": run.report.to_dict()} for run in runs]}))
    else:
        print(format_plan_runs(runs))
    failed = [run for run in runs if not run.report.passed]
    for run in failed:
        print(f"zbopt: {run.entry.label}: gradients differ from the single-process reference "
              f"(max abs diff {run.report.max_abs_diff:.3g})", file=sys.stderr)
    return EXIT_INVALID_SCHEDULE if failed else 0
