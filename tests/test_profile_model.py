"""A user's own model profiled layer by layer (`profile_model`, `zbopt profile-model`): the FLOPs,
saved bytes and parameter bytes of known layers in closed form, times ordered as the FLOPs, the
profile CSV read back by plan's reader, and every bad input one line."""

import json
import re
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.conftest import require_extra

torch = require_extra("torch", "needs the optional extra zbopt[torch]")

from zbopt import profile_model  # noqa: E402
from zbopt.core.errors import ZboptError  # noqa: E402
from zbopt.interfaces.cli import main  # noqa: E402
from zbopt.planning.model.profile import profile_text, read_profile  # noqa: E402

BATCH, WIDTH = 64, 256
FLOAT = 4  # bytes


def _widening():
    """Linear layers w -> w, w -> 2w, 2w -> 4w: 2·b·in·out FLOPs = 2bw², 4bw², 16bw²."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, 2 * WIDTH),
                               torch.nn.Linear(2 * WIDTH, 4 * WIDTH))


def test_known_layers_have_their_closed_form_flops_saved_bytes_and_parameter_bytes():
    """Linear(in, out) on b rows: 2·b·in·out forward FLOPs, saves its input (b·in floats), holds
    (in·out + out) weights, as many gradients and Adam's two state tensors (SGD: none)."""
    layers = _widening()
    adam = profile_model(layers, torch.randn(BATCH, WIDTH), repeats=2, warmup=1)
    sgd = profile_model(layers, torch.randn(BATCH, WIDTH), repeats=2, warmup=1, optimizer="sgd")
    for cost, plain, layer in zip(adam.layers, sgd.layers, layers, strict=True):
        inputs, outputs = layer.in_features, layer.out_features
        assert cost.forward_flops == 2 * BATCH * inputs * outputs
        assert cost.activation_gb * 1e9 == BATCH * inputs * FLOAT
        weights = (inputs * outputs + outputs) * FLOAT
        assert cost.parameters_gb * 1e9 == pytest.approx(4 * weights)
        assert plain.parameters_gb * 1e9 == pytest.approx(2 * weights)
    assert [cost.name for cost in adam.layers] == ["0", "1", "2"]


def test_times_follow_the_flops():
    """The 16bw² layer's forward, input gradient and weight gradient each take longer than the 2bw²
    layer's, and its forward at most 32 times as long (8x the FLOPs; CPU matmuls of these sizes run
    within a factor of 4 of one rate). Each time is the least of five profiles' medians: a busy
    machine (the suite's other worker) only adds time, to one layer's rounds at once."""
    profiles = [profile_model(_widening(), torch.randn(BATCH, WIDTH), repeats=9, warmup=3) for _ in range(5)]

    def least(index: int, kind: str) -> float:
        return min(getattr(profile.layers[index], kind) for profile in profiles)

    for kind in ("forward_ms", "backward_ms", "weight_ms"):
        assert least(2, kind) > least(0, kind), kind
    assert least(2, "forward_ms") < 32 * least(0, "forward_ms")


def test_a_first_layer_without_input_gradient_runs_its_backward_in_w_and_the_loss_is_saved():
    """An embedding's token ids take no gradient: B is 0 and W the whole backward (torch's first
    stage); the last layer's activation includes what the loss saves (its input, b·out floats)."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Embedding(100, WIDTH), torch.nn.Linear(WIDTH, 8))
    tokens = torch.randint(0, 100, (4, 16))
    profile = profile_model(layers, tokens, loss=lambda y: y.pow(2).mean(), repeats=2, warmup=1)
    embedding, head = profile.layers
    assert embedding.backward_ms == 0 and embedding.weight_ms > 0
    assert head.activation_gb * 1e9 == (4 * 16 * WIDTH + 4 * 16 * 8) * FLOAT  # Linear's input, pow's input


def test_a_model_and_its_fqns_name_the_layers():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(8, 8)
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    profile = profile_model(Model(), torch.randn(2, 8), fqns=["embed", "blocks.0", "blocks.1"], repeats=1, warmup=0)
    assert [cost.name for cost in profile.layers] == ["embed", "blocks.0", "blocks.1"]
    with pytest.raises(ZboptError, match=r"^profile_model: fqns: 'blocks\.7' is not a submodule"):
        profile_model(Model(), torch.randn(2, 8), fqns=["embed", "blocks.7"])


def test_the_profile_csv_reads_back_as_the_layers_with_tiny_memory_kept():
    """Six significant digits: a layer of 1 kB (1e-6 GB) is not written as 0, and every value reads
    back within that rounding."""
    profile = profile_model(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), torch.randn(2, 4),
                            repeats=2, warmup=0)
    rows = [cost.profile_row() for cost in profile.layers]
    path = _write(profile_text(rows), "layers.csv")
    for (layer, repeat), row in zip(read_profile(path), rows, strict=True):
        assert repeat == 1 and layer.name == row["name"]
        for key in ("forward_ms", "backward_ms", "weight_ms", "activation_gb", "parameters_gb"):
            assert getattr(layer, key) == pytest.approx(row[key], rel=1e-5), key
    assert 0 < rows[0]["activation_gb"] < 1e-7


def _write(text: str, name: str):
    path = Path(tempfile.mkdtemp()) / name
    path.write_text(text)
    return path


MODULE = textwrap.dedent("""
    import torch

    def good():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)), torch.randn(2, 8)

    def unchained():
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(9, 8)), torch.randn(2, 8)

    def empty():
        return torch.nn.Sequential(), torch.randn(2, 8)

    def not_a_pair():
        return torch.nn.Linear(8, 8)

    def broken():
        raise RuntimeError("the user's bug")
""")


def _user_module(folder, monkeypatch) -> None:
    """MODULE as user_layers.py in `folder`, the working folder, imported afresh."""
    (folder / "user_layers.py").write_text(MODULE)
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "user_layers", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader puts the working folder on it


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module:good", r"model 'no_such_module:good': cannot import no_such_module: ModuleNotFoundError"),
    ("user_layers:missing", r"model 'user_layers:missing': user_layers has no function 'missing'"),
    ("user_layers", r"model 'user_layers': expected PACKAGE\.MODULE:FACTORY"),
    ("user_layers:empty", r"model 'user_layers:empty': no layers"),
    ("user_layers:not_a_pair", r"must return \(layers, sample\) or \(layers, sample, loss\), got Linear"),
    ("user_layers:broken", r"broken\(\) failed: RuntimeError: the user's bug"),
    ("user_layers:unchained", r"layer '1' does not take its input \(tensor \(2, 8\)\): RuntimeError: mat1 and mat2"),
])
def test_a_bad_model_is_one_line_naming_it_and_exit_2(spec, message, tmp_path, monkeypatch, capsys):
    _user_module(tmp_path, monkeypatch)
    assert main(["profile-model", spec, "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zbopt: ") and "Traceback" not in err, err
    assert re.search(message, err), err


def test_the_command_writes_the_profile_plan_reads_and_never_over_the_model(tmp_path, monkeypatch, capsys):
    _user_module(tmp_path, monkeypatch)
    assert main(["profile-model", "user_layers:good", "-o", "layers.csv", "--repeats", "2", "--warmup", "0"]) == 0
    assert [layer.name for layer, _ in read_profile(tmp_path / "layers.csv")] == ["0", "1", "2"]
    (tmp_path / "model.yaml").write_text("model: {profile: layers.csv}\ndevice: {memory: 1 GB}\n")
    capsys.readouterr()
    assert main(["costs", "model.yaml", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["layers"]) == 3
    assert main(["profile-model", "user_layers:good", "-o", "user_layers.csv", "--repeats", "1"]) == 0
    (tmp_path / "linked.csv").symlink_to(tmp_path / "user_layers.py")
    assert main(["profile-model", "user_layers:good", "-o", "linked.csv"]) == 2
    assert "is the model's module" in capsys.readouterr().err
