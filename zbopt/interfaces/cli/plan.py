"""`zbopt plan MODEL.yaml --devices P`: the layer split and the schedule of a model, optimized
together and certified over every split, beside the named split rules with every schedule."""

from __future__ import annotations

import argparse
import contextlib
import math

from zbopt.core import interrupt
from zbopt.core.errors import ZboptError
from zbopt.interfaces.cli.flags import add_deterministic_flag, dask_client
from zbopt.interfaces.cli.output import check_outputs, command_clock, json_text

__all__ = ["add_commands"]


def add_commands(commands) -> None:
    """Add `plan` to the subcommands `commands`."""
    planning = commands.add_parser("plan", help="split a model's layers over the devices and schedule them: the "
                                                "joint optimum, certified, beside the usual split rules")
    planning.add_argument("model", metavar="MODEL.yaml", help="model file: {model: ..., device: ...} (YAML or JSON)")
    planning.add_argument("--devices", type=int, required=True, help="pipeline devices p")
    planning.add_argument("--chunks", default="1", help="chunks per device to try, comma-separated (default 1)")
    planning.add_argument("--placement", default="v", choices=["loop", "v"],
                          help="placement of two or more chunks (default v; one chunk is always loop)")
    planning.add_argument("--microbatches", type=int, help="microbatches per step m (default 4 per device)")
    planning.add_argument("--global-batch", type=int, help="m from a global batch: global / (micro-batch size x "
                                                           "data-parallel ranks), instead of --microbatches")
    planning.add_argument("--micro-batch-size", type=int, help="with --global-batch (default 1)")
    planning.add_argument("--data-parallel", type=int,
                          help="data-parallel ranks: each stage's gradients are reduced over them (timed where the "
                               "model file's device gives dp_bandwidth), and with --global-batch they divide the "
                               "batch (default: the model file's data_parallel, else 1)")
    planning.add_argument("--device-memory", metavar="GB", help="each device's memory, with its unit (e.g. 80GB); "
                                                               "default: the model file's device memory")
    planning.add_argument("--reserve", metavar="GB", help="memory each device keeps free for what a run holds beside "
                                                         "the model (CUDA context, NCCL buffers, fragmentation), with "
                                                         "its unit (e.g. 6GB, 0GB); default: the model file's device "
                                                         "reserve, else 10%% of the memory")
    planning.add_argument("--schedule", action="append", metavar="NAME",
                          help="schedules per split rule, repeatable; 'optimal' is the optimizer (default: every "
                               "applicable heuristic and the optimizer)")
    planning.add_argument("--time-limit", type=float, default=120.0, help="seconds for the whole plan (default 120)")
    planning.add_argument("--workers", type=int, default=2, help="solver threads per split (default 2)")
    planning.add_argument("--dask", metavar="ADDRESS", help="solve splits on a dask.distributed cluster, as many at a "
                                                         "time as its threads hold --workers each, e.g. tcp://host:8786")
    add_deterministic_flag(planning)
    planning.add_argument("--json", action="store_true", help="print one JSON object: best, pipelines, rows")
    planning.add_argument("-o", "--output", metavar="report.html", help="write the HTML report")
    planning.add_argument("--export", metavar="FILE", help="write the best schedule: .csv torch CSV, .json zbopt JSON "
                                                          "(with the split), .trace.json a trace for Perfetto (with "
                                                          "the split)")
    planning.set_defaults(run=_command_plan)


def _command_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from zbopt.core.units import parse_memory
    from zbopt.planning.model import load_model, model_files
    from zbopt.planning.planner import check_stages, plan

    _check_numbers(args)
    model, device = load_model(args.model, data_parallel=args.data_parallel)
    if args.device_memory is not None:
        device = replace(device, memory_gb=parse_memory(args.device_memory, "--device-memory"))
    if args.reserve is not None:
        try:
            device = replace(device, reserve_gb=parse_memory(args.reserve, "--reserve"))
        except ZboptError as error:  # the Device's own check, said of the flag
            raise ZboptError(f"--reserve {args.reserve}: {str(error).split(': ', 1)[1]}") from None
    if args.output is not None:
        from zbopt.presentation.plan_report import check_plan_report

        check_plan_report(args.output)
    if args.export is not None:
        from zbopt.io.export import check_export

        check_export(args.export)
    check_outputs(args, [("-o", args.output), ("--export", args.export)], inputs=model_files(args.model))
    for chunks in _chunks(args.chunks):  # before m's default of 4 per device is blamed for the size
        check_stages(model, args.devices, chunks)
    microbatches = _microbatches(args, model.training.data_parallel)
    pipelines = [_pipeline(args, chunks, microbatches) for chunks in _chunks(args.chunks)]
    with contextlib.ExitStack() as stack:
        executor, parallel = None, 1
        if args.dask is not None:
            client = stack.enter_context(dask_client(args.dask))
            # each split's solve runs --workers threads: as many splits at once as the cluster holds
            executor, parallel = client.get_executor(), max(1, sum(client.nthreads().values()) // args.workers)
        clock = command_clock(args, "plan")
        answer, stop = interrupt.answer_of(lambda: plan(model, device, pipelines, schedules=args.schedule,
                                                        time_limit=clock,
                                                        workers=args.workers, executor=executor, parallel=parallel,
                                                        deterministic=args.deterministic))
    if args.json:
        print(json_text(answer.to_dict()))
    else:
        from zbopt.presentation.plan_report import format_plan

        print(format_plan(answer))
    if args.export is not None:
        _export(args.export, answer, args.json)
    if args.output is not None:
        from zbopt.presentation.plan_report import write_plan_report

        write_plan_report(args.output, answer)
        if not args.json:
            print(f"\nreport written to {args.output}")
    if stop is not None:  # Ctrl-C: the plan so far is printed and written, then exit 130
        raise stop
    return 0


def _export(path: str, answer, quiet: bool) -> None:
    """The best schedule written to `path`, the split recorded where the format has room."""
    from zbopt.io.export import EXPORT_FORMATS, write_export

    best = answer.to_dict()["best"]
    split = {key: best[key] for key in ("split", "stages", "chunks", "placement", "exports")}
    written = write_export(path, answer.best.best.simulation, with_times=True, split=split)
    if not quiet:
        print(f"\n{EXPORT_FORMATS[written]} written to {path}")


def _microbatches(args: argparse.Namespace, data_parallel: int) -> int:
    """m: --microbatches, or from --global-batch over the model's `data_parallel` ranks
    (`problem.batch`'s rule and its messages), else 4 per device."""
    from zbopt.core.problem.batch import BATCH_FLAGS, batch_microbatches

    values = {key: getattr(args, key if key != "global_batch_size" else "global_batch")
              for key in BATCH_FLAGS if key != "data_parallel"}
    values = {key: value for key, value in values.items() if value is not None}
    if args.global_batch is not None and data_parallel > 1:
        values["data_parallel"] = data_parallel
    if args.microbatches is not None:
        values["num_microbatches"] = args.microbatches
    counted = batch_microbatches(values, lambda key: BATCH_FLAGS.get(key, "--microbatches"))
    if counted is not None:
        return counted[0]
    return args.microbatches or 4 * args.devices


def _pipeline(args: argparse.Namespace, chunks: int, microbatches: int):
    """The pipeline the flags ask for; one that no problem could hold blamed on the flag that set it."""
    from zbopt.core.errors import ProblemError
    from zbopt.planning.planner import Pipeline

    try:
        return Pipeline(args.devices, chunks, "loop" if chunks == 1 else args.placement, microbatches)
    except ProblemError as error:
        given_m = "--microbatches" if args.microbatches is not None else \
            "--global-batch" if args.global_batch is not None else "--devices (m is 4 per device)"
        flag = {"num_devices": "--devices", "chunks_per_device": "--chunks"}.get(error.key, given_m)
        raise ZboptError(f"{flag}: {error}") from None


def _chunks(text: str) -> list[int]:
    """`--chunks 1,2` as [1, 2]: whole numbers, at least 1, each once."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ZboptError(f"--chunks {text}: expected whole numbers separated by commas, e.g. 1,2") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise ZboptError(f"--chunks {text}: expected distinct whole numbers, each at least 1")
    return values


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, value in (("--devices", args.devices), ("--microbatches", args.microbatches),
                        ("--workers", args.workers), ("--data-parallel", args.data_parallel)):
        if value is not None and value < 1:
            raise ZboptError(f"{flag} {value}: expected a whole number, at least 1")
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise ZboptError(f"--time-limit {args.time_limit:g}: expected a number of seconds above 0")
