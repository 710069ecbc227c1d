"""A user's own model end to end: profiled, planned, and the plan run in torch.distributed.pipelining
with the model cut at the plan's split; the gradients equal one process's for v = 1, v = 2 (loop
and V) and a split backward; bad plans and models are one line. Run alone: pytest -m torch."""

import json
import re
import sys
import textwrap
from types import SimpleNamespace

import pytest

from tests.conftest import require_extra

torch = require_extra("torch", "needs the optional extra zbopt[torch]")

from zbopt.core.errors import ZboptError  # noqa: E402
from zbopt.core.ops import Op  # noqa: E402
from zbopt.interfaces.cli import main  # noqa: E402
from zbopt.interfaces.runtime.model import CutModel  # noqa: E402
from zbopt.interfaces.runtime.plan_run import PlanEntry, PlannedRun, format_plan_runs, run_plan  # noqa: E402

pytestmark = pytest.mark.torch

MODULE = textwrap.dedent("""
    import torch

    def transformer():
        torch.manual_seed(0)
        layers = [torch.nn.Embedding(50, 16)]
        layers += [torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True) for _ in range(4)]
        layers.append(torch.nn.Linear(16, 50))
        return layers, torch.randint(0, 50, (2, 6)), lambda logits: torch.logsumexp(logits, -1).mean()
""")


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """MODULE as `tiny.py` in the working folder, profiled into a model file."""
    (tmp_path / "tiny.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "tiny", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["profile-model", "tiny:transformer", "-o", "layers.csv", "--repeats", "3", "--warmup", "1"]) == 0
    (tmp_path / "model.yaml").write_text("model: {profile: layers.csv}\ndevice: {memory: 1 GB}\n")
    return tmp_path


def _plan(capsys, *flags) -> dict:
    capsys.readouterr()
    assert main(["plan", "model.yaml", "--devices", "2", "--microbatches", "4", "--time-limit", "4", "--json",
                 *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flags", [(), ("--chunks", "2"), ("--chunks", "2", "--placement", "v")],
                         ids=["v1", "v2-loop", "v2-V"])
def test_the_plan_runs_on_the_users_model_with_the_reference_gradients(user_folder, capsys, flags):
    """The plan's best (a split backward: its orders hold W) runs on the model cut at its split; the
    output gives the predicted and measured step times and the gradients' verdict."""
    plan = _plan(capsys, *flags)
    assert any(Op.from_str(op).kind == "W" for order in plan["best"]["orders"] for op in order)
    (user_folder / "plan.json").write_text(json.dumps(plan))
    assert main(["run-torch", "plan.json", "--model", "tiny:transformer", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["split"] == plan["best"]["split"] and run["predicted_ms"] == plan["best"]["makespan_ms"]
    assert run["report"]["passed"] and run["report"]["num_stages"] == len(plan["best"]["split"])
    assert run["measured_ms"] > 0


def test_a_cut_model_is_the_same_model_whatever_the_split(user_folder):
    """The stages of any split chain to the whole model's output (the same weights from the seed)."""
    whole = CutModel("tiny:transformer", (6,), 2, folder=str(user_folder))
    halves = CutModel("tiny:transformer", (1, 2, 3), 2, folder=str(user_folder))
    sample = whole.batches(1)[0][0]
    with torch.no_grad():
        expected = whole.stage_modules()[0](*sample)
        got = sample
        for stage in halves.stage_modules():
            got = (stage(*got),)
    assert torch.equal(got[0], expected)


BAD = [
    (["plan.json", "--model", "tiny:transformer", "--row", "99"], r"--row 99: no row 99 with a schedule"),
    (["plan.json", "--model", "tiny:transformer", "--row", "gpipe-x"], r"--row 'gpipe-x': no row of that schedule"),
    (["plan.csv", "--model", "tiny:transformer"], r"a torch CSV holds no split"),
    (["plan.json", "--model", "tiny:transformer", "--hidden", "8"], r"--hidden: not with --model"),
    (["plan.json", "--row", "0"], r"--row picks a plan's row to run on your model: give --model too"),
    (["other.json", "--model", "tiny:transformer"], r"expected the JSON `zbopt plan --json` prints"),
    (["wrong.json", "--model", "tiny:transformer"], r"the plan's split \[3, 2\] is for 5"),
    (["plan.json", "--model", "tiny:nothing"], r"model 'tiny:nothing': tiny has no function 'nothing'"),
]


def test_a_bad_plan_or_model_is_one_line_and_exit_2(user_folder, capsys):
    plan = _plan(capsys)
    (user_folder / "plan.json").write_text(json.dumps(plan))
    (user_folder / "other.json").write_text(json.dumps({"rows": []}))
    plan["best"]["split"] = [3, 2]
    (user_folder / "wrong.json").write_text(json.dumps(plan))
    for argv, message in BAD:
        assert main(["run-torch", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and re.search(message, err), (argv, err)


def test_the_command_looks_for_the_model_in_the_folder_it_runs_in(user_folder, capsys, monkeypatch):
    """The ranks start in another folder: run-torch hands them the working folder to import the
    factory's module from (not its scratch folder for the CSVs)."""
    from zbopt.interfaces.runtime import plan_run

    plan = _plan(capsys)
    (user_folder / "plan.json").write_text(json.dumps(plan))
    given = {}

    def recorded(csv, **options):
        given.update(options, csv=str(csv))
        raise ZboptError("recorded")

    monkeypatch.setattr(plan_run, "run_torch", recorded)
    assert main(["run-torch", "plan.json", "--model", "tiny:transformer"]) == 2
    assert given["folder"] == str(user_folder) and not given["csv"].startswith(str(user_folder))
    assert given["model"] == "tiny:transformer" and list(given["split"]) == plan["best"]["split"]


def _run(label: str, predicted: float, measured: float) -> PlannedRun:
    entry = PlanEntry(label, (1, 1), 1, "loop", (("0F0",), ("1F0",)), predicted)
    report = SimpleNamespace(step_time_s=(measured / 1e3,), passed=True, max_abs_diff=0.0)
    return PlannedRun(entry, report)


@pytest.mark.parametrize(("predicted", "measured", "ranks", "held"), [
    ((2.0, 1.0, 3.0), (20.0, 10.0, 30.0), ["2 / 2", "1 / 1", "3 / 3"], True),
    ((1.0, 1.0, 3.0), (11.0, 10.0, 30.0), ["1 / 2", "1 / 1", "3 / 3"], True),  # a tie orders nothing
    ((1.0, 2.0, 3.0), (10.0, 30.0, 20.0), ["1 / 1", "2 / 3", "3 / 2"], False),
])
def test_the_rankings_share_ranks_on_ties_and_hold_only_if_every_strict_order_does(predicted, measured, ranks, held):
    text = format_plan_runs([_run(f"row {index}", one, other)
                             for index, (one, other) in enumerate(zip(predicted, measured, strict=True))])
    lines = text.splitlines()[1:4]
    assert [re.search(r"(\d+ / \d+)\s+match$", line).group(1) for line in lines] == ranks
    assert text.endswith("held" if held else "did not hold")


@pytest.mark.parametrize(("change", "message"), [
    (lambda best: best.update(orders=[]), r"best: zb-h1: orders = \[\]: expected each device's ops as text"),
    (lambda best: best.update(orders=[["0F0", "0Q1"]]), r"best: zb-h1: '0Q1' is not an op"),
    (lambda best: best.update(split=[3.5, 3]), r"best: zb-h1: split = \[3\.5, 3\]: expected layers per stage"),
    (lambda best: best.update(makespan_ms="fast"), r"best: zb-h1: makespan_ms = 'fast': expected a number"),
])
def test_a_malformed_plan_row_is_one_line_naming_the_plan(tmp_path, change, message):
    plan = {"best": {"schedule": "zb-h1", "split": [3, 3], "chunks": 1, "placement": "loop", "makespan_ms": 1.0,
                     "orders": [["0F0"], ["1F0"]]}, "rows": []}
    change(plan["best"])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(ZboptError, match=rf"^plan '{re.escape(str(path))}': {message}"):
        run_plan(path, "tiny:transformer")
