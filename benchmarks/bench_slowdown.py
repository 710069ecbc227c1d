"""Compute slowed while it communicates (issue 44, `comm_slowdown`): how much of an iteration runs
under a transfer, what a slowdown costs each schedule, whether it reorders them, and how far the
optimizer's answer (its model leaves the slowdown out) is from the bound.

The cases, stated: the Zero Bubble paper's four Table 5 models (zbopt.core.paper_tables) cut into
two chunks per device (each chunk half a stage's F, B, W, activations and ends), with the ends of
bench_ends.py (each chunk's gradients all-reduced over data-parallel 8 at 25 GB/s and 0.05 ms per
ring step, each device's step at 2,000 GB/s), no memory limit: interleaved 1F1B (loop placement)
and ZB-V, V-Half, V-Min (V placement), each simulated at a slowdown of 1 (none), 1.1 and 1.3; the
optimizer (loop and V) at 1 and 1.3 (its bound is the same for both: no bound sees the slowdown).
With one chunk per device no compute meets a transfer (a device's reduction follows its last
compute op), so v = 1 is left out.

Usage: python benchmarks/bench_slowdown.py [--time-limit S] [--models 1.5B,6.2B,...]
Prints a table and writes benchmarks/results/bench_slowdown.json.
"""

from __future__ import annotations

from bench_ends import ends_of, paper_arguments
from record import write_results

from zbopt import Problem, generate, simulate, solve
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS

FACTORS = (1.0, 1.1, 1.3)
SCHEDULES = {"loop": ("interleaved-1f1b",), "v": ("zb-v", "v-half", "v-min")}


def two_chunks(name: str, placement: str) -> Problem:
    """The model called `name` with two chunks per device, each half a stage."""
    model = ZERO_BUBBLE_MODELS[name]
    ends = ends_of(name, model.num_devices)
    return Problem(num_devices=model.num_devices, num_microbatches=model.num_microbatches, chunks_per_device=2,
                   placement=placement, forward_times=model.forward / 2, backward_times=model.backward / 2,
                   weight_times=model.weight / 2, p2p_time=model.comm, activation_memory=0.5,
                   weight_memory=model.weight_memory / 2, grad_reduce_times=ends["grad_reduce_times"] / 2,
                   optimizer_step_times=ends["optimizer_step_times"])


def under_transfers(simulation) -> float:
    """The most compute time any device runs while one of its transfers runs (its ops' own, slowed, time)."""
    windows = [window for window in simulation.ends.windows(simulation.problem) if window.what != "step"]
    most = 0.0
    for device, ops in enumerate(simulation.device_ops):
        mine = [(window.begin, window.end) for window in windows if window.device == device]
        most = max(most, sum(max(0.0, min(simulation.end[op], end) - max(simulation.start[op], begin))
                             for op in ops.tolist() if simulation.table.lane[op] == 0 for begin, end in mine))
    return most


def main() -> None:
    args = paper_arguments(__doc__)
    rows = []
    print(f"{'model':<7}{'schedule':<18}" + "".join(f"{f'x{factor:g}':>10}" for factor in FACTORS)
          + f"{'under transfers':>17}  optimizer at x1, x{FACTORS[-1]:g}: status, bound", flush=True)
    for name in args.models.split(","):
        for placement, names in SCHEDULES.items():
            plain = two_chunks(name, placement)
            for schedule in (*names, f"optimal ({placement})"):
                row = {"model": name, "placement": placement, "schedule": schedule, "iteration": {}}
                for factor in FACTORS:
                    problem = plain.replace(comm_slowdown=factor)
                    if schedule.startswith("optimal"):
                        if factor not in (FACTORS[0], FACTORS[-1]):
                            continue
                        result = solve(problem, time_limit=args.time_limit, lower_peak=False, seed=0)
                        simulation = result.simulation
                        row.setdefault("status", {})[factor] = result.status
                        row.setdefault("lower_bound", {})[factor] = result.lower_bound
                    else:
                        simulation = simulate(problem, generate(schedule, problem))
                    row["iteration"][factor] = simulation.iteration_time
                    row["under_transfers"] = under_transfers(simulation)
                rows.append(row)
                times = "".join(f"{row['iteration'][f]:>10.1f}" if f in row["iteration"] else f"{'-':>10}"
                                for f in FACTORS)
                tail = "".join(f"  {row['status'][f]} {row['lower_bound'][f]:.1f}" for f in row.get("status", {}))
                print(f"{name:<7}{schedule:<18}{times}{row['under_transfers']:>17.1f}{tail}", flush=True)
    write_results("bench_slowdown", rows=rows)


if __name__ == "__main__":
    main()
