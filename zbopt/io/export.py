"""One writer for every schedule export: `zbopt export`, `zbopt solve --export` and Python.

`check_export` says before any work whether a file can be written (its format known, the problem
writable in it, the file creatable); `write_export` writes a simulated schedule, and
`save_schedule` zbopt's schedule JSON, each through `write_file` (whole or not at all).
"""

from __future__ import annotations

import json
from pathlib import Path

from zbopt.core.errors import ZboptError
from zbopt.core.problem import Problem
from zbopt.core.problem.order import entry_order, relabelled
from zbopt.core.schedule import Schedule
from zbopt.core.simulation import Simulation
from zbopt.io.torch_format import check_exportable, torch_comms_csv, write_megatron_order, write_torch_csv
from zbopt.io.trace import TRACE_EXTENSION, write_chrome_trace
from zbopt.io.write import check_writable, write_file

__all__ = ["EXPORT_EXTENSIONS", "EXPORT_FORMATS", "check_export", "export_format", "order_note", "save_schedule",
           "write_export"]

EXPORT_FORMATS = {"torch-csv": "torch CSV", "torch-comms-csv": "torch CSV with its communication (compute_comms)",
                  "megatron": "Megatron-LM order", "json": "zbopt schedule JSON",
                  "chrome-trace": "Perfetto / chrome://tracing trace"}
# the formats told by the file's name, longest ending first (a trace is JSON too: .json alone is zbopt's)
EXPORT_EXTENSIONS = {TRACE_EXTENSION: "chrome-trace", ".csv": "torch-csv", ".json": "json"}


def export_format(path: str | Path, given: str | None = None, flag: str | None = None) -> str:
    """The export format: `given`, else from the file's name (.trace.json a trace, .csv torch CSV,
    .json zbopt JSON); a name that tells none is an error, which names `flag` (the command's
    option that gives a format) where the command has one."""
    if given is not None:
        if given not in EXPORT_FORMATS:
            raise ZboptError(f"unknown export format '{given}' (known: {', '.join(EXPORT_FORMATS)})")
        return given
    name = Path(path).name.lower()
    for ending, chosen in EXPORT_EXTENSIONS.items():
        if name.endswith(ending):
            return chosen
    suffix = Path(path).suffix
    raise ZboptError(f"'{path}': cannot tell the export format from '{suffix or 'no extension'}' "
                     f"(.trace.json a trace, .csv torch CSV, .json zbopt JSON{f'; or give {flag}' if flag else ''})")


def check_export(path: str | Path, problem: Problem | None = None, given: str | None = None,
                 flag: str | None = None) -> str:
    """The format `path` is to be written in (see `export_format`), once it can be created and
    `problem` (when known yet) can be written in it; a ZboptError naming the culprit otherwise."""
    chosen = export_format(path, given, flag)
    if problem is not None:
        check_exportable(problem, chosen)
    check_writable(path)
    return chosen


def write_export(path: str | Path, simulation: Simulation, given: str | None = None, *,
                 with_times: bool = False, split: dict | None = None) -> str:
    """Write the simulated schedule to `path` in the format `given` (else told by the extension);
    return the format. `with_times` puts the simulated start times into a zbopt JSON (a solver's
    answer carries them; the torch and Megatron formats hold orders only). A plan's `split` (its
    layers per stage) is recorded in a zbopt JSON and a trace; the torch and Megatron formats have
    no place for it (the plan's own output carries it)."""
    problem = simulation.problem
    chosen = check_export(path, problem, given)
    schedule = simulation.timed_orders() if with_times else simulation.schedule
    if chosen == "torch-csv":
        write_torch_csv(path, problem, schedule)
    elif chosen == "torch-comms-csv":
        write_file(path, torch_comms_csv(simulation))
    elif chosen == "megatron":  # no microbatch ids: each chunk runs them as they come, so number them so
        order = entry_order(problem, schedule)
        inverse = sorted(range(len(order)), key=order.__getitem__)
        write_megatron_order(path, problem, relabelled(schedule, inverse, problem.num_microbatches))
    elif chosen == "chrome-trace":
        write_chrome_trace(path, simulation, split)
    else:
        save_schedule(path, schedule, problem, split)
    return chosen


def order_note(simulation: Simulation, chosen: str) -> str | None:
    """What a runtime must know when the schedule's microbatches enter out of their order in the
    problem (`entry_order`), for the export format `chosen`; None when they enter in order."""
    order = entry_order(simulation.problem, simulation.schedule)
    if order == tuple(range(len(order))):
        return None
    listed = ",".join(map(str, order))
    if chosen == "megatron":
        return (f"microbatches enter in the order {listed}: the runtime must feed them in that order (Megatron-LM's "
                "order has no microbatch ids: the file numbers them as they enter)")
    return (f"microbatches enter in the order {listed}: the file names each by its index in the problem (its tokens); "
            "a runtime that takes microbatches one at a time must feed them in that order (torch's step() splits "
            "its batch by index: give it the batch in the problem's order)")


def save_schedule(path: str | Path, schedule: Schedule, problem: Problem | None = None,
                  split: dict | None = None) -> None:
    """Write `schedule` (and the problem it is for, and a plan's split, when given) as JSON.

    Parameters
    ----------
    path : the file to write (whole or not at all: a temporary beside it, then renamed).
    schedule : the schedule.
    problem : the problem it is for, stored beside it so that `load_schedule` returns it.
    split : a plan's split (layers per stage), stored too.

    Raises
    ------
    ZboptError : where the file cannot be written, naming it.

    Examples
    --------
    See `load_schedule`, which reads the file back.
    """
    data = schedule.to_dict()
    if problem is not None:
        data["problem"] = problem.to_dict()
    if split is not None:
        data["split"] = split
    write_file(path, json.dumps(data, indent=1) + "\n")
