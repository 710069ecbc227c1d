"""The fuzz test of `tests/test_fuzz.py`, longer: EXAMPLES random config files with flags, as
many random schedule files and as many model files (`costs`, `plan`), each run through
`zbopt.interfaces.cli.main`; prints a table of what they ended in and writes
benchmarks/results/bench_fuzz.json. Any run that breaks the property (a traceback, a second
stderr line, another exit status, a hang) stops the run with hypothesis's smallest example.

Usage: python benchmarks/bench_fuzz.py [EXAMPLES]   (default 1,000 of each kind)
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from record import write_results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.test_fuzz import CONFIG_CASES, MODEL_CASES, SCHEDULE_CASES, config_case, model_case, schedule_case

EXAMPLES = 1_000


def fuzz(name: str, case, cases: dict, examples: int) -> dict:
    """Run `case` on `examples` draws of `cases`; the count of each exit status and the time."""
    statuses: Counter = Counter()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(**cases)
    def run(**drawn):
        statuses[case(**drawn)] += 1

    start = time.perf_counter()
    run()
    return {"name": name, "runs": sum(statuses.values()), "exit 0": statuses[0], "exit 1": statuses[1],
            "exit 2": statuses[2], "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else EXAMPLES
    rows = [fuzz("config file + flags", config_case, CONFIG_CASES, examples),
            fuzz("schedule file + flags", schedule_case, SCHEDULE_CASES, examples),
            fuzz("model file: costs, plan", model_case, MODEL_CASES, examples)]
    print(f"{'inputs':<24}{'runs':>7}{'exit 0':>8}{'exit 1':>8}{'exit 2':>8}{'seconds':>9}")
    for row in rows:
        print(f"{row['name']:<24}{row['runs']:>7}{row['exit 0']:>8}{row['exit 1']:>8}{row['exit 2']:>8}"
              f"{row['seconds']:>9}")
    write_results("bench_fuzz", examples_per_kind=examples, rows=rows,
                  property="exit 0, 1 (simulate: memory limit broken) or 2 with one stderr line; no traceback, "
                           "no numpy warning, no hang")


if __name__ == "__main__":
    main()
