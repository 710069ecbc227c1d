"""The research notebooks in notebooks/: committed without outputs, and each one runs from top to bottom.

Each notebook executes in a temporary copy with its small CI sizes (ZBOPT_NOTEBOOK_FULL unset). The
notebooks assert the invariants their text claims (the optimum is never worse than a heuristic at
the same memory, lower bounds hold, the published Table 5 values are reproduced, ...), so a claim
that stops holding fails here as the cell's error.
"""

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.conftest import require_extra

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300
FULL_VARIABLE = "ZBOPT_NOTEBOOK_FULL"


def read(path: Path):
    return nbformat.read(path, as_version=nbformat.NO_CONVERT)


def test_the_eleven_notebooks_are_there():
    assert [path.name for path in NOTEBOOKS] == [
        "01_quickstart.ipynb", "02_zero_bubble_table5.ipynb", "03_memory_frontier.ipynb",
        "04_heterogeneous_stages.ipynb", "05_building_blocks.ipynb", "06_recompute_offload.ipynb",
        "07_dualpipe.ipynb", "08_model_to_plan.ipynb", "09_microbatches_that_differ.ipynb", "10_own_model.ipynb",
        "11_iteration_ends.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_committed_stripped_and_shaped(path):
    """No outputs or execution counts in the repository; an opening markdown cell, a parameter cell
    reading ZBOPT_NOTEBOOK_FULL near the top, and a closing "What to take away" cell."""
    notebook = read(path)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code), "strip the outputs"
    assert notebook.cells[0].cell_type == "markdown"
    assert FULL_VARIABLE in code[0].source
    last = notebook.cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## What to take away")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_runs_in_ci_mode(path, tmp_path, monkeypatch):
    """Every cell runs without error (the notebooks' own assertions included) and the figures render."""
    if path.stem == "10_own_model":
        require_extra("torch", "runs a model in torch.distributed.pipelining")
    monkeypatch.delenv(FULL_VARIABLE, raising=False)  # the kernel inherits this environment
    copy = tmp_path / path.name
    shutil.copyfile(path, copy)
    notebook = read(copy)
    # kernel "python3": jupyter_client starts it with this interpreter (sys.executable)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as error:
        pytest.fail(f"{path.name}: {error}")
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    assert any("image/png" in output.get("data", {}) for output in outputs), "no figure was drawn"
