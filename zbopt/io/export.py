"""One writer for every schedule export: `zbopt export`, `zbopt solve --export` and Python.

`check_export` says before any work whether a file can be written (its format known, the problem
writable in it, its directory there); `write_export` writes a simulated schedule.
"""

from __future__ import annotations

from pathlib import Path

from zbopt.errors import ZboptError
from zbopt.io.torch_format import check_exportable, write_megatron_order, write_torch_csv
from zbopt.io.trace import TRACE_EXTENSION, write_chrome_trace
from zbopt.problem import Problem
from zbopt.schedule import save_schedule
from zbopt.simulation import Simulation

EXPORT_FORMATS = {"torch-csv": "torch CSV", "megatron": "Megatron-LM order", "json": "zbopt schedule JSON",
                  "chrome-trace": "Perfetto / chrome://tracing trace"}
# the formats told by the file's name, longest ending first (a trace is JSON too: .json alone is zbopt's)
EXPORT_EXTENSIONS = {TRACE_EXTENSION: "chrome-trace", ".csv": "torch-csv", ".json": "json"}


def export_format(path: str | Path, given: str | None = None) -> str:
    """The export format: `given`, else from the file's name (.trace.json a trace, .csv torch CSV,
    .json zbopt JSON)."""
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
                     f"(.trace.json a trace, .csv torch CSV, .json zbopt JSON; or give --format)")


def check_output_directory(path: str | Path) -> None:
    """Fail before any work when the file to write cannot be created."""
    if not Path(path).resolve().parent.is_dir():
        raise ZboptError(f"'{path}': no such directory")


def check_export(path: str | Path, problem: Problem | None = None, given: str | None = None) -> str:
    """The format `path` is to be written in (see `export_format`), once its directory exists and
    `problem` (when known yet) can be written in it; a ZboptError naming the culprit otherwise."""
    chosen = export_format(path, given)
    if problem is not None:
        check_exportable(problem, chosen)
    check_output_directory(path)
    return chosen


def write_export(path: str | Path, simulation: Simulation, given: str | None = None, *,
                 with_times: bool = False) -> str:
    """Write the simulated schedule to `path` in the format `given` (else told by the extension);
    return the format. `with_times` puts the simulated start times into a zbopt JSON (a solver's
    answer carries them; the torch and Megatron formats hold orders only)."""
    problem = simulation.problem
    chosen = check_export(path, problem, given)
    schedule = simulation.timed_orders() if with_times else simulation.schedule
    if chosen == "torch-csv":
        write_torch_csv(path, problem, schedule)
    elif chosen == "megatron":
        write_megatron_order(path, problem, schedule)
    elif chosen == "chrome-trace":
        write_chrome_trace(path, simulation)
    else:
        save_schedule(path, schedule, problem)
    return chosen
