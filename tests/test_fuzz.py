"""A property-based fuzz test of the config reader and the command line (issue 29): random keys,
values, encodings, nesting and flags, in a config file, a schedule file or on the command line.

Whatever the input, a run exits 0 (done), 1 (`simulate`'s verdict that the schedule breaks the
memory limit) or 2 (bad input, then exactly one stderr line), within RUN_SECONDS, and prints no
traceback nor a numpy warning. `benchmarks/bench_fuzz.py` runs the same property longer.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import tempfile
import warnings
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbopt import Problem, generate, simulate
from zbopt.core.problem.batch import COUNT_KEYS, PACKING_KEYS
from zbopt.core.problem.config import KEYS as PROBLEM_KEYS
from zbopt.interfaces.cli import main
from zbopt.interfaces.cli.inputs import OPTION_KEYS

RUN_SECONDS = 20  # a hang, not a slow run: the problems drawn are small
EXAMPLES = 150  # per test; the default suite draws 300 in all

BATCH_KEYS = [*COUNT_KEYS, *PACKING_KEYS]
KEYS = st.sampled_from([*PROBLEM_KEYS, *BATCH_KEYS, *OPTION_KEYS]) | st.text(max_size=12)
NUMBERS = (st.integers(-3, 12) | st.sampled_from([0.5, 1e-12, 1e9, 1e308, -1.0, 2**63, 10**30])
           | st.floats(allow_nan=True, allow_infinity=True))
SCALARS = NUMBERS | st.booleans() | st.none() | st.text(max_size=10) | st.sampled_from(["loop", "v", "FBW", "FB"])
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(KEYS, inner, max_size=3),
                      max_leaves=12)
SENSIBLE = (st.integers(1, 6) | st.sampled_from([0.5, 1.5, 2.0, 3.0]) | st.booleans()
            | st.lists(st.integers(1, 4) | st.just(0.5), min_size=1, max_size=4) | st.sampled_from(["loop", "v"])
            # cost rows per microbatch, token counts and packed documents, packing rules (issue 42)
            | st.lists(st.lists(st.sampled_from([1, 2, 0.5, 512, 4096]), min_size=1, max_size=4), min_size=1,
                       max_size=4)
            | st.sampled_from(["loader", "first-fit-decreasing", "balanced"]))
CONFIGS = (st.dictionaries(st.sampled_from([*PROBLEM_KEYS, *BATCH_KEYS]), SENSIBLE, max_size=4)  # mostly runs
           | st.dictionaries(KEYS, VALUES, max_size=6) | VALUES)
ENCODINGS = st.sampled_from(["utf-8", "utf-8", "utf-16", "latin-1"])
FLAG_NAMES = ["-s", "-b", "-v", "--placement", "-f", "-bw", "-w", "--p2p-time", "--activation-memory",
              "--weight-memory", "--memory-limit", "--iterations", "--no-flush", "--allow-recompute",
              "--checkpoint-memory", "--recompute-times", "--allow-offload", "--offload-times", "--reload-times",
              "--shared-host-link", "--schedule", "--option", "--json", "--quiet", "-c"]
TOKENS = (st.sampled_from(["1", "2", "4", "8", "0", "-1", "0.5", "1e9", "1e308", "nan", "inf", "1,2", "zb-h1",
                           "1f1b", "v", "loop", "torch:GPipe", "x=1", "a=&b [1]", "", "--"])
          | st.text(max_size=8))
FLAGS = st.just([]) | st.lists(st.tuples(st.sampled_from(FLAG_NAMES), st.lists(TOKENS, max_size=3)), max_size=3)
def _generated(schedule: str, devices: int, microbatches: int, timed: bool, cut: int) -> dict:
    """A schedule zbopt generates, as its JSON holds it, with its problem; `cut` > 0 drops an op."""
    problem = Problem(num_devices=devices, num_microbatches=microbatches, weight_times=1)
    order = generate(schedule, problem)
    if timed:
        order = simulate(problem, order).timed_orders()
    data = {**order.to_dict(), "problem": problem.to_dict()}
    if cut:
        data["orders"][cut % devices] = data["orders"][cut % devices][1:]
    return data


GENERATED = st.builds(_generated, st.sampled_from(["1f1b", "zb-h1", "gpipe"]), st.integers(1, 3), st.integers(1, 3),
                      st.booleans(), st.integers(0, 3))
SCHEDULE_DATA = GENERATED | st.fixed_dictionaries(
    {"orders": st.lists(st.lists(st.sampled_from(["0F0", "0B0", "0W0", "1F0", "(0F1;1B0)", "9Z9", ""])
                                 | SCALARS, max_size=6), max_size=4)},
    optional={"problem": CONFIGS, "start_times": st.lists(st.lists(NUMBERS, max_size=6), max_size=4) | VALUES,
              "pairs": VALUES, "format": SCALARS})


class Hang(BaseException):
    """A run took longer than RUN_SECONDS (a BaseException, so that no `except Exception` eats it)."""


def _on_alarm(signum, frame):
    raise Hang


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`zbopt ARGV` in-process: (status, stdout, stderr), stopped after RUN_SECONDS."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, RUN_SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                status = main(argv)
            except SystemExit as stop:
                status = stop.code if isinstance(stop.code, int) else 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    numeric = [str(warning.message) for warning in caught if issubclass(warning.category, RuntimeWarning)]
    assert not numeric, (argv, numeric)
    return status, out.getvalue(), err.getvalue()


def check_run(argv: list[str]) -> int:
    """Run `argv` and assert the property; returns the status."""
    status, _, err = run_cli(argv)
    assert status in (0, 1, 2), (argv, status, err[-2000:])
    assert "Traceback" not in err, (argv, err[-2000:])
    if status == 2:
        assert err.count("\n") == 1 and err.startswith("zbopt: "), (argv, err[:2000])
    if status == 1:
        assert argv[0] == "simulate", (argv, err[-2000:])
    return status


def encoded(data: object, suffix: str, encoding: str, noise: bytes, at: int) -> bytes:
    """`data` written as YAML or JSON in `encoding`, with `noise` spliced in at `at` (a fraction)."""
    text = json.dumps(data, allow_nan=True) if suffix == ".json" else yaml.safe_dump(data, allow_unicode=True)
    raw = text.encode(encoding, errors="replace")
    cut = round(at * len(raw))
    return raw[:cut] + noise + raw[cut:]


def flag_tokens(flags: list[tuple[str, list[str]]]) -> list[str]:
    return [token for name, values in flags for token in (name, *values)]


CONFIG_FILES = st.tuples(CONFIGS, st.sampled_from([".yaml", ".json", ".yml", ".csv"]), ENCODINGS,
                         st.binary(max_size=4) | st.just(b""), st.floats(0, 1), st.integers(0, 40))
CONFIG_CASES = {"drawn": CONFIG_FILES, "flags": FLAGS, "command": st.sampled_from(["simulate", "simulate", "compare"])}
SCHEDULE_CASES = {"data": SCHEDULE_DATA, "suffix": st.sampled_from([".json", ".csv"]), "encoding": ENCODINGS,
                  "noise": st.just(b"") | st.binary(max_size=3), "at": st.floats(0, 1), "flags": FLAGS}


def config_case(drawn: tuple, flags: list, command: str) -> int:
    """`zbopt COMMAND CONFIG FLAGS` on a config file drawn from CONFIG_FILES (its data wrapped in
    up to 40 lists), in a fresh directory; asserts the property and returns the status."""
    data, suffix, encoding, noise, at, depth = drawn
    for _ in range(depth if depth > 30 else 0):
        data = [data]
    with tempfile.TemporaryDirectory() as directory, contextlib.chdir(directory):
        path = Path(directory) / f"config{suffix}"
        path.write_bytes(encoded(data, suffix, encoding, noise, at))
        return check_run([command, str(path), "--no-visualization", *flag_tokens(flags)])


def schedule_case(data: dict, suffix: str, encoding: str, noise: bytes, at: float, flags: list) -> int:
    """`zbopt simulate --schedule-file FILE FLAGS` on a schedule JSON or torch CSV drawn from
    SCHEDULE_DATA; asserts the property and returns the status."""
    with tempfile.TemporaryDirectory() as directory, contextlib.chdir(directory):
        path = Path(directory) / f"schedule{suffix}"
        if suffix == ".csv":
            rows = [",".join(map(str, order)) for order in data["orders"]]
            path.write_bytes("\n".join(rows).encode(encoding, errors="replace") + noise)
        else:
            path.write_bytes(encoded(data, suffix, encoding, noise, at))
        return check_run(["simulate", "--schedule-file", str(path), "--no-visualization", *flag_tokens(flags)])


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(**CONFIG_CASES)
def test_any_config_file_and_flags_exit_0_or_2_in_one_line(drawn, flags, command):
    config_case(drawn, flags, command)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(**SCHEDULE_CASES)
def test_any_schedule_file_exits_0_or_2_in_one_line(data, suffix, encoding, noise, at, flags):
    schedule_case(data, suffix, encoding, noise, at, flags)


# ------------------------------------------------------------------- model files: `costs` and `plan` (issue 42)
ODD_QUANTITIES = (st.sampled_from(["0 ms", "1e16 ms", "-1 ms", "1", "1e308 GB", "nan ms", "1e-300 GFLOPS", "1 MB"])
                  | NUMBERS | st.text(max_size=6))
TIMES = st.one_of(*[st.sampled_from(["1 ms", "0.5 ms", "2 ms", "300 us", "1.7 ms", "0.01 s"])] * 8, ODD_QUANTITIES)
MEMORY = st.one_of(*[st.sampled_from(["1 GB", "0.5 GB", "2 GB", "512 MiB", "0 GB", "3 GB"])] * 8, ODD_QUANTITIES)
QUANTITIES = TIMES | MEMORY
LAYER = st.fixed_dictionaries(
    {"name": st.one_of(*[st.sampled_from(["decoder", "embedding", "lm_head"])] * 4, st.text(max_size=5)),
     "forward": TIMES,
     "backward": TIMES, "activation": MEMORY, "parameters": MEMORY},
    optional={"weight": TIMES, "weight_activation": MEMORY,
              "repeat": st.one_of(*[st.integers(1, 6)] * 6, st.sampled_from([0, 100_000, 100_001, 10**12]), SCALARS)})
ARCHITECTURE = st.fixed_dictionaries(
    {"num_layers": st.integers(-1, 4) | st.sampled_from([10**8]), "hidden_size": st.sampled_from([64, 96, 0, 10**12]),
     "num_attention_heads": st.sampled_from([4, 3, 0]), "seq_length": st.sampled_from([128, 1, 10**9]),
     "vocab_size": st.sampled_from([1000, 1, 10**12])},
    optional={"swiglu": st.booleans() | SCALARS, "num_query_groups": st.sampled_from([1, 2, 5]),
              "micro_batch_size": st.integers(0, 3)})
PROFILES = st.lists(st.tuples(st.sampled_from(["d", "e", "", "1"]),
                              st.lists(st.sampled_from(["1", "1", "2", "0.5", "0", "-1", "1e308", "nan", "", "x"]),
                                       min_size=5, max_size=6)).map(lambda row: [row[0], *row[1]]), max_size=6)
LAYERS = st.fixed_dictionaries({"layers": st.lists(LAYER, min_size=1, max_size=4)})
MODEL_SECTIONS = (LAYERS | LAYERS | LAYERS
                  | st.fixed_dictionaries({"layers": VALUES})
                  | st.fixed_dictionaries({"architecture": ARCHITECTURE}, optional={"dtype": SCALARS})
                  | st.fixed_dictionaries({"preset": st.sampled_from(["llama-3-8b", "gpt"]) | SCALARS})
                  | st.just({"profile": "layers.csv"}) | VALUES)
DEVICES = st.fixed_dictionaries({}, optional={"memory": st.sampled_from(["20 GB", "80 GB", "4 GB"]) | MEMORY,
                                              "flops": st.sampled_from(["100 TFLOPS", "1 PFLOP/s"]) | QUANTITIES,
                                              "p2p": TIMES}) | VALUES
GOOD_TIMES = st.sampled_from(["1 ms", "0.5 ms", "2 ms", "300 us", "1.7 ms"])
GOOD_MEMORY = st.sampled_from(["1 GB", "0.5 GB", "2 GB", "512 MiB", "0 GB"])
GOOD_LAYER = st.fixed_dictionaries(
    {"name": st.sampled_from(["decoder", "embedding", "lm_head"]), "forward": GOOD_TIMES, "backward": GOOD_TIMES,
     "activation": GOOD_MEMORY, "parameters": GOOD_MEMORY},
    optional={"weight": GOOD_TIMES, "repeat": st.integers(1, 6)})
GOOD_MODELS = (st.fixed_dictionaries({"layers": st.lists(GOOD_LAYER, min_size=1, max_size=3)})
               | st.fixed_dictionaries({"architecture": st.fixed_dictionaries(
                   {"num_layers": st.integers(1, 6), "hidden_size": st.just(64), "num_attention_heads": st.just(4),
                    "seq_length": st.sampled_from([128, 512]), "vocab_size": st.just(1000)})}))
GOOD_FILES = st.fixed_dictionaries({"model": GOOD_MODELS, "device": st.fixed_dictionaries(
    {"memory": st.sampled_from(["20 GB", "80 GB", "6 GB"]), "flops": st.just("100 TFLOPS")},
    optional={"p2p": st.sampled_from(["0.1 ms", "0 ms"])})})
MODEL_FILES = (GOOD_FILES | GOOD_FILES | st.fixed_dictionaries({"model": MODEL_SECTIONS}, optional={"device": DEVICES})
               | VALUES)
PLAN_FLAGS = st.lists(st.sampled_from([["--chunks", "2"], ["--microbatches", "3"], ["--device-memory", "1e16 GB"],
                                       ["--device-memory", "20 GB"], ["--schedule", "1f1b"], ["--placement", "loop"],
                                       ["--global-batch", "6"]]), max_size=3)
MODEL_CASES = {"data": MODEL_FILES, "profile": PROFILES, "suffix": st.sampled_from([".yaml", ".json"]),
               "command": st.sampled_from(["costs", "costs", "plan"]), "devices": st.integers(1, 3),
               "flags": PLAN_FLAGS}
MODEL_EXAMPLES = 60  # each plan takes up to its second of time limit


def model_case(data: object, profile: list, suffix: str, command: str, devices: int, flags: list) -> int:
    """`zbopt costs MODEL` or `zbopt plan MODEL --devices D --time-limit 1 FLAGS` on a model file
    drawn from MODEL_FILES (with a profile CSV beside it); asserts the property, returns the status."""
    with tempfile.TemporaryDirectory() as directory, contextlib.chdir(directory):
        path = Path(directory) / f"model{suffix}"
        path.write_bytes(encoded(data, suffix, "utf-8", b"", 0))
        header = "name,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb"
        (Path(directory) / "layers.csv").write_text("\n".join([header, *(",".join(row) for row in profile)]))
        if command == "costs":
            return check_run(["costs", str(path)])
        return check_run(["plan", str(path), "--devices", str(devices), "--time-limit", "1",
                          *(token for flag in flags for token in flag)])


@settings(max_examples=MODEL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**MODEL_CASES)
def test_any_model_file_exits_0_or_2_in_one_line(data, profile, suffix, command, devices, flags):
    model_case(data, profile, suffix, command, devices, flags)
