"""FSDP's reshard after forward (issue 44, `allow_reshard`): what the optimizer gains by gathering a
chunk's parameters again before its backwards, at memory limits between the floor with re-gathers
and the floor without (where no schedule that keeps the parameters fits) and above it.

The cases, stated: loop placement, p = 4, m = 4, v = 2 and 4 chunks per device, F = B = W = 1 per
chunk, one microbatch's activation 1 per chunk; each chunk's parameters gathered take 8 of memory
(FSDP on a large model: a chunk's parameters outweigh the activations its forwards hold until its
last forward, m·1, which is when a re-gather can free them) and 2 to gather; a reduction of 1 per
chunk and a step of 1 per device. Measured first at m = 8 with parameters of 4 (8 activations held
by a chunk's last forward, more than its parameters): no limit where re-gathers paid. For each
limit: the optimum with the parameters kept (where the limit allows it) and with re-gathers
allowed, the same budget each.

Usage: python benchmarks/bench_reshard.py [--time-limit S]
Prints a table and writes benchmarks/results/bench_reshard.json.
"""

from __future__ import annotations

import argparse

from record import write_results

from zbopt import Problem, ProblemError, solve

PARAMETERS, GATHER, MICROBATCHES = 8.0, 2.0, 4


def case(chunks: int) -> Problem:
    """The problem with `chunks` chunks per device, re-gathers allowed, no limit yet."""
    return Problem(num_devices=4, num_microbatches=MICROBATCHES, chunks_per_device=chunks, forward_times=1,
                   backward_times=1, weight_times=1, unshard_times=GATHER, unshard_memory=PARAMETERS,
                   grad_reduce_times=1, optimizer_step_times=1, allow_reshard=True)


def _number(result: dict, key: str) -> str:
    """A result's value in its column, or "-" where there is none (below the floor, no schedule found)."""
    value = result.get(key)
    return f"{'-':>8}" if value is None else f"{value:>8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    rows = []
    print(f"{'case':<16}{'limit':>7}  {'kept: status':<14}{'value':>8}{'bound':>8}  "
          f"{'re-gathers: status':<20}{'value':>8}{'bound':>8}{'G':>4}", flush=True)
    for chunks in (2, 4):
        allowed = case(chunks)
        floor, kept_floor = max(allowed.min_memory_limit), max(allowed.replace(allow_reshard=False).min_memory_limit)
        for limit in sorted({floor + 2, (floor + kept_floor) / 2, kept_floor, kept_floor + 4}):
            row = {"chunks": chunks, "memory_limit": limit, "floor_with_regathers": floor,
                   "floor_kept": kept_floor, "time_limit": args.time_limit}
            for name, problem in (("kept", allowed.replace(allow_reshard=False)), ("regathers", allowed)):
                try:
                    result = solve(problem.replace(memory_limit=limit), time_limit=args.time_limit, lower_peak=False,
                                   seed=0)
                except ProblemError:
                    row[name] = {"status": "below the floor"}
                    continue
                row[name] = {"status": result.status, "value": result.objective, "lower_bound": result.lower_bound,
                             "regathers": len(result.simulation.table.regathered) if result.simulation else 0}
            rows.append(row)
            kept, again = row["kept"], row["regathers"]
            print(f"{f'v={chunks}':<16}{limit:>7g}  {kept['status']:<14}{_number(kept, 'value')}"
                  f"{_number(kept, 'lower_bound')}  {again['status']:<20}{_number(again, 'value')}"
                  f"{_number(again, 'lower_bound')}{again.get('regathers', 0):>4}", flush=True)
    write_results("bench_reshard", rows=rows)


if __name__ == "__main__":
    main()
