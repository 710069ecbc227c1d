"""Does `--time-limit` hold? Each command that takes one, on a problem large enough to use it all,
timed from the process's start to its exit (the one clock of issue 40: the limit counts the
interpreter's start-up and imports too, and leaves room for the output).

Prints a table (wall seconds, over the limit in %, exit status) and writes
benchmarks/results/bench_time_limits.json. The target: within 5% of the limit.

Usage: python benchmarks/bench_time_limits.py [--time-limit S] [--rows solve,compare,plan,plan-m]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from record import write_results

ROOT = Path(__file__).resolve().parent.parent
LOOP = ["-s", "8", "-b", "16", "-v", "2", "-f", "9.261", "-bw", "9.043", "-w", "4.6685", "--p2p-time", "0.601",
        "--activation-memory", "0.5", "--memory-limit", "4"]  # bench_certify's loop p = 8, memory p/2
MODEL = str(ROOT / "examples" / "model_layers.yaml")
COMMANDS = {
    "solve": lambda limit: ["solve", *LOOP, "--time-limit", limit, "--json"],
    "compare": lambda limit: ["compare", *LOOP, "--optimal", "--time-limit", limit, "--json"],
    "plan": lambda limit: ["plan", str(ROOT / "examples" / "model_llama3_8b.yaml"), "--devices", "8",
                           "--microbatches", "64", "--chunks", "1,2", "--time-limit", limit, "--json"],
    "plan-m": lambda limit: ["plan", MODEL, "--devices", "4", "--microbatches", "3000", "--time-limit", limit,
                             "--json"],
    "plan-m10k": lambda limit: ["plan", MODEL, "--devices", "4", "--microbatches", "10000", "--time-limit", limit,
                                "--json"],
}
LIMITS = {"solve": 30.0, "compare": 30.0, "plan": 30.0, "plan-m": 5.0, "plan-m10k": 5.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(COMMANDS))
    parser.add_argument("--time-limit", type=float, help="one limit for every row (default: each row's own)")
    args = parser.parse_args()
    rows = []
    print(f"{'command':<12}{'limit s':>8}{'wall s':>8}{'over':>8}{'rc':>4}", flush=True)
    for name in args.rows.split(","):
        limit = args.time_limit or LIMITS[name]
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "zbopt", *COMMANDS[name](f"{limit:g}")], capture_output=True,
                              text=True, cwd=ROOT)
        wall = time.perf_counter() - began
        rows.append({"command": name, "time_limit": limit, "wall_s": wall, "over": wall / limit - 1,
                     "returncode": done.returncode})
        print(f"{name:<12}{limit:>8g}{wall:>8.2f}{wall / limit - 1:>8.1%}{done.returncode:>4}", flush=True)
    write_results("bench_time_limits", rows=rows)


if __name__ == "__main__":
    main()
