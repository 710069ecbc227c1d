"""The command line's shared flags: every config key as a flag (with the 1F1B visualizer's
spellings), the schedule's, the input and output files', and --quiet; and what they gave."""

from __future__ import annotations

import argparse

from zbopt.cli.batch import BATCH_FLAGS
from zbopt.cli.config import OPTION_KEYS, PROBLEM_KEYS
from zbopt.errors import ZboptError, shorten
from zbopt.io.read import parse_yaml
from zbopt.microbatch_order import ORDER_RULES
from zbopt.schedules import TORCH_PREFIX, TORCH_REFUSED, TORCH_SCHEDULES

DASK_CONNECT_TIMEOUT_S = 10

RUNNABLE_TORCH_SCHEDULES = [name for name in TORCH_SCHEDULES if name not in TORCH_REFUSED]  # named in --help


class _Numbers(argparse.Action):
    """A list flag's tokens (`-f 1 2 3` or `-f 1,2,3`) as one list; a single number stays a scalar."""

    def __call__(self, parser, namespace, values, option_string=None):
        flat = [number for token in values for number in token]
        setattr(namespace, self.dest, flat[0] if len(flat) == 1 else flat)


def _numbers(text: str) -> list[float]:
    """One flag token: a number, or comma-separated numbers ("1,2,3")."""
    try:
        return [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers, got {shorten(text)}") from None


def _schedule_option(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE read as a YAML scalar (8 -> int, 0.5 -> float, true -> bool)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {shorten(text)}")
    try:
        return key.strip(), parse_yaml(value, f"--option {key.strip()}")
    except ZboptError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _order(text: str) -> str | list[int]:
    """--order: a rule's name, or the microbatches in the order they enter, e.g. 3,1,0,2."""
    if text in ORDER_RULES:
        return text
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {', '.join(ORDER_RULES)} or the microbatches in the order "
                                         f"they enter, e.g. 3,1,0,2; got {shorten(text)}") from None


def add_order_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--order", type=_order, metavar="RULE|3,1,0,2",
                        help=f"the order microbatches enter the pipeline: a rule ({', '.join(ORDER_RULES)}: "
                             "as given, by total work, or DynaPipe's search over size clusters) or a permutation, "
                             "the microbatch entering first first (default: as given)")


def add_problem_flags(parser: argparse.ArgumentParser) -> None:
    """Every config key as a flag, with the 1F1B visualizer's spellings. Flags override the file."""
    group = parser.add_argument_group("problem (each flag overrides the config file's key)")
    add = group.add_argument
    suppress = argparse.SUPPRESS
    numbers = {"type": _numbers, "nargs": "+", "action": _Numbers, "default": suppress}
    add("--num-stages", "--num-devices", "-s", dest="num_stages", type=int, default=suppress,
        help="pipeline devices p (default 4)")
    add("--num-microbatches", "--num-batches", "-b", dest="num_microbatches", type=int, default=suppress,
        help="microbatches m per iteration (default 8)")
    add("--global-batch", dest="global_batch_size", type=int, default=suppress,
        help="samples per optimizer step: m = global batch / (micro-batch size × data parallel), instead of -b")
    add("--micro-batch-size", dest="micro_batch_size", type=int, default=suppress,
        help="samples per microbatch, with --global-batch (default 1)")
    add("--data-parallel", dest="data_parallel", type=int, default=suppress,
        help="data-parallel replicas, with --global-batch (default 1)")
    add("--chunks-per-device", "-v", dest="chunks_per_device", type=int, default=suppress,
        help="model chunks per device (default 1)")
    add("--placement", default=suppress, help="stage placement: loop, v or bidirectional (default loop)")
    add("--forward-times", "-f", dest="forward_times", **numbers,
        help="F time, one value or one per virtual stage (default 1)")
    add("--backward-times", "-bw", dest="backward_times", **numbers,
        help="backward time: B when --weight-times is given, else the fused BW (default 2)")
    add("--weight-times", "-w", dest="weight_times", **numbers, help="W time (splits the backward into B and W)")
    add("--p2p-time", dest="p2p_time", type=float, default=suppress, help="latency between devices (default 0)")
    add("--activation-memory", dest="activation_memory", **numbers, help="M_B per virtual stage (default 1)")
    add("--weight-memory", dest="weight_memory", **numbers,
        help="M_W per virtual stage (split backward only; default half of M_B)")
    add("--memory-limit", dest="memory_limit", **numbers, help="memory cap per device (default none)")
    add("--iterations", type=int, default=suppress, help="optimizer steps back to back (default 1)")
    add("--no-flush", dest="flush", action="store_false", default=suppress,
        help="iterations do not wait for each other's weight update (PipeDream-2BW double buffering)")
    add("--allow-recompute", dest="allow_recompute", action=argparse.BooleanOptionalAction, default=suppress,
        help="a schedule may recompute an activation instead of keeping it (needs --checkpoint-memory); "
             "--no-allow-recompute overrides a config that allows it")
    add("--recompute-times", dest="recompute_times", **numbers,
        help="cost of a recompute R per virtual stage (default: the forward's)")
    add("--checkpoint-memory", dest="checkpoint_memory", **numbers,
        help="what a recomputed activation keeps between F and R per virtual stage (its stage input)")
    add("--allow-offload", dest="allow_offload", action=argparse.BooleanOptionalAction, default=suppress,
        help="a schedule may offload an activation to host memory and reload it before its backward "
             "(needs --offload-times); --no-allow-offload overrides a config that allows it")
    add("--offload-times", dest="offload_times", **numbers,
        help="device-to-host copy time of one activation per virtual stage")
    add("--reload-times", dest="reload_times", **numbers,
        help="host-to-device copy time of one activation per virtual stage (default: the offload time)")
    add("--shared-host-link", dest="shared_host_link", action=argparse.BooleanOptionalAction, default=suppress,
        help="devices 2k and 2k+1 share one host link, one copy each way at a time (PipeOffload's pairing)")


def add_schedule_flags(parser: argparse.ArgumentParser) -> None:
    """Which schedule: a registered name with its options, a torch built-in, or a file."""
    parser.add_argument("--schedule", metavar="NAME",
                        help=f"registered schedule name (default 1f1b), or {TORCH_PREFIX}NAME for a torch."
                             f"distributed.pipelining built-in ({', '.join(RUNNABLE_TORCH_SCHEDULES)}; "
                             f"needs torch)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", type=_schedule_option,
                        help="an option of the schedule's generator, e.g. microbatch_group_size_per_vp_stage=8")
    parser.add_argument("--schedule-file", metavar="FILE",
                        help="a torch compute-only CSV (.csv; its ranks, stages and microbatches fill what the "
                             "config leaves out) or a zbopt schedule JSON (its stored problem fills what the "
                             "config and flags leave out)")
    add_order_flag(parser)


def add_input_flags(parser: argparse.ArgumentParser,
                     output_help: str = "write a Gantt chart (.png, .svg or .pdf)") -> None:
    parser.add_argument("config", nargs="?", help="YAML or JSON config file (optional)")
    parser.add_argument("-c", "--config", dest="config_flag", metavar="CONFIG", help="same as the positional CONFIG")
    parser.add_argument("-o", "--output", "--output-file", dest="output_file", default=argparse.SUPPRESS,
                        help=output_help)
    parser.add_argument("--no-visualization", action="store_true", help="write no chart, even if the config names one")
    add_problem_flags(parser)


def add_style_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--style", help="the figure's style: screen (default) or paper (TrueType fonts in PDF, "
                                        "STIX text, Computer Modern math, colour-blind-safe colours, no title)")


def add_quiet_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="print nothing, not even a progress line (use -o or --json)")


def config_file(args: argparse.Namespace) -> str | None:
    """The config file, given as CONFIG or as -c CONFIG."""
    if args.config and args.config_flag and args.config != args.config_flag:
        raise ZboptError(f"two config files given ('{args.config}' and '{args.config_flag}'); give one")
    return args.config or args.config_flag


def flag_values(args: argparse.Namespace) -> dict:
    """The config keys the user gave as flags (a flag left out is not in `args`)."""
    return {key: value for key, value in vars(args).items()
            if key in PROBLEM_KEYS or key in OPTION_KEYS or key in BATCH_FLAGS}


def dask_client(address: str):
    """A dask.distributed Client connected to the scheduler at `address` (an optional dependency)."""
    try:
        from distributed import Client
    except ImportError:
        raise ZboptError("--dask needs dask.distributed: pip install 'zbopt[dask]'") from None
    try:
        return Client(address, timeout=DASK_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as error:
        raise ZboptError(f"--dask {address}: cannot connect to the scheduler ({error})") from None
