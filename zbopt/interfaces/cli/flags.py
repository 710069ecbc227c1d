"""The command line's shared flags: every config key as a flag (with the 1F1B visualizer's
spellings), the schedule's, the input and output files', and --quiet; and what they gave."""

from __future__ import annotations

import argparse

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.problem.batch import BATCH_FLAGS, BATCH_HELP
from zbopt.core.problem.config import DEFAULTS, KEYS
from zbopt.core.problem.order import ORDER_RULES
from zbopt.core.problem.parameters import MECHANISMS, PARAMETERS
from zbopt.interfaces.cli.inputs import OPTION_KEYS
from zbopt.io.read import parse_yaml
from zbopt.schedules import TORCH_PREFIX, TORCH_REFUSED, TORCH_SCHEDULES

__all__ = ["DASK_CONNECT_TIMEOUT_S", "RUNNABLE_TORCH_SCHEDULES", "add_deterministic_flag", "add_input_flags",
           "add_order_flag",
           "add_problem_flags", "add_quiet_flag", "add_schedule_flags", "add_style_flag", "config_file", "dask_client",
           "flag_values"]

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


def add_order_flag(parser: argparse.ArgumentParser, whose: str = "") -> None:
    parser.add_argument("--order", type=_order, metavar="RULE|3,1,0,2",
                        help=f"{whose}the order microbatches enter the pipeline: a rule ({', '.join(ORDER_RULES)}: "
                             "as given, by total work, or DynaPipe's search over size clusters) or a permutation, "
                             "the microbatch entering first first (default: as given)")


def add_deterministic_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deterministic", action="store_true",
                        help="the same answer and bound on every run: the solver on one worker, --time-limit a "
                             "budget of work (CP-SAT's deterministic time; about as long in wall time on 2 cores, "
                             "not bounded by it), no wall clock deciding anything")


def add_problem_flags(parser: argparse.ArgumentParser) -> None:
    """Every parameter of the table (`zbopt.core.problem.parameters`) that takes a flag, grouped by its
    mechanism, each under its config keys' spellings; the batch's flags with the pipeline's.
    Flags override the config file."""
    suppress = argparse.SUPPRESS
    for mechanism, title in MECHANISMS.items():
        rows = [entry for entry in PARAMETERS if entry.mechanism == mechanism and entry.flags]
        if not rows:
            continue
        group = parser.add_argument_group(f"problem: {title}" + " (each flag overrides the config file's key)"
                                          * (mechanism == "core"))
        for entry in rows:
            group.add_argument(*entry.flags, dest=entry.config_keys[0], default=suppress, help=_flag_help(entry),
                               **_FLAG_KIND[entry.shape])
        if mechanism == "core":
            for key, flag in BATCH_FLAGS.items():
                group.add_argument(flag, dest=key, type=int, default=suppress, help=BATCH_HELP[key])


# how a flag reads a value of each shape (a switch takes --NAME and --no-NAME)
_NUMBERS = {"type": _numbers, "nargs": "+", "action": _Numbers}
_FLAG_KIND = {"count": {"type": int}, "number": {"type": float}, "choice": {},
              "switch": {"action": argparse.BooleanOptionalAction}, "per stage": _NUMBERS, "per device": _NUMBERS}


def _flag_help(entry) -> str:
    """The table's one line, with its default where it has a plain one."""
    if entry.required:
        return f"{entry.help} (default {DEFAULTS[entry.name]})"
    if entry.default is None or entry.shape == "switch":
        return entry.help
    return f"{entry.help} (default {entry.default:g})" if isinstance(entry.default, float) else \
        f"{entry.help} (default {entry.default})"


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
                        action="append", help=f"{output_help}; give it again for more files")
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
            if key in KEYS or key in OPTION_KEYS or key in BATCH_FLAGS}


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
