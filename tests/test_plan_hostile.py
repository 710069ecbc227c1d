"""Issue 42 on `plan` and the model readers: outputs never over an input, checked before any work;
numbers beyond zbopt's range refused in one line naming the key as written, not a traceback;
a plan that no time could make says why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_hostile_input import refused

LAYERS = ("model:\n  layers:\n    - {name: decoder, repeat: 4, forward: 1 ms, backward: 1 ms, weight: 1 ms, "
          "activation: 1 GB, parameters: 1 GB}\ndevice: {memory: 80 GB}\n")
PROFILE = "name,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb\n" + "d,1,1,1,1,1\n" * 4


def _profiled(tmp_path):
    (tmp_path / "layers.csv").write_text(PROFILE)
    model = tmp_path / "model.yaml"
    model.write_text("{model: {profile: layers.csv}, device: {memory: 80 GB}}\n")
    return model, tmp_path / "layers.csv"


@pytest.mark.parametrize("flag, target", [("--export", "model"), ("-o", "model"), ("--export", "profile"),
                                          ("--export", "symlink"), ("--export", "hard link")])
def test_plan_never_writes_over_its_model_file_or_the_profile_it_names(tmp_path, capsys, flag, target):
    model, profile = _profiled(tmp_path)
    if flag == "-o":  # a model file whose name is the report's
        model = model.rename(tmp_path / "model.html")
    written = {"model": model, "profile": profile, "symlink": tmp_path / "link.csv",
               "hard link": tmp_path / "hard.csv"}[target]
    if target == "symlink":
        written.symlink_to(profile)
    elif target == "hard link":
        os.link(profile, written)
    if target == "model" and flag == "--export":
        model = model.rename(tmp_path / "model.json")
        model.write_text('{"model": {"profile": "layers.csv"}, "device": {"memory": "80 GB"}}')
        written = model
    before = {path: path.read_bytes() for path in (model, profile)}
    message = refused(capsys, "plan", model, "--devices", "2", "--time-limit", "5", flag, written)
    what = "the model file" if target == "model" else "the profile the model file names"
    assert message == f"zbopt: {flag} '{written}': is {what}; writing it would replace it (give another file)"
    assert {path: path.read_bytes() for path in (model, profile)} == before


def test_plan_refuses_a_directory_for_its_report_before_any_work(tmp_path, capsys):
    model = tmp_path / "model.yaml"
    model.write_text(LAYERS)
    (tmp_path / "x.html").mkdir()
    assert refused(capsys, "plan", model, "--devices", "2", "--time-limit", "5", "-o", tmp_path / "x.html") \
        == f"zbopt: -o '{tmp_path / 'x.html'}': is a directory"


@pytest.mark.parametrize("change, flags, message", [
    (None, ["--device-memory", "1e308 GB"], "zbopt: --device-memory = '1e308 GB': at most 1e+15 GB (zbopt's range)"),
    (None, ["--device-memory", "1e16 GB"], "zbopt: --device-memory = '1e16 GB': at most 1e+15 GB (zbopt's range)"),
    (("forward: 1 ms", "forward: 1e16 ms"), [],
     "zbopt: {path}: model.layers[0] (decoder).forward = '1e16 ms': at most 1e+15 ms (zbopt's range)"),
    (("forward: 1 ms", "forward: 1e13 ms"), ["--microbatches", "1000"],
     "zbopt: plan: the model's work over m = 1000 microbatches, 4e+16 ms, is beyond zbopt's range (1e+15 ms); "
     "layer 'decoder' adds most"),
    (("forward: 1 ms", "forward: 1e10 ms"), ["--devices", "1"],
     # one stage of 4 layers: F 4e10 against B 4 and W 4 (the span rule's closed form)
     "zbopt: plan: no split could be solved; the even one is refused: forward_times = 40000000000.0: one "
     "microbatch's ops take 4e+10, more than 1e7 x the shortest cost (backward_times 4); at most 3.99e+07 allowed "
     "here or the shortest cost at least 4.01e+03"),
])
def test_numbers_beyond_the_range_are_one_line_naming_the_key_as_written(tmp_path, capsys, change, flags, message):
    model = tmp_path / "model.yaml"
    model.write_text(LAYERS if change is None else LAYERS.replace(*change, 1))
    argv = ["plan", model, "--devices", "2", "--time-limit", "5", *flags]
    if "--devices" in flags:
        argv[2:4] = []
    assert refused(capsys, *argv) == message.format(path=model)


def test_an_architecture_on_a_device_too_slow_to_time_blames_the_device(tmp_path, capsys):
    model = tmp_path / "gpt.yaml"
    model.write_text("model: {architecture: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, "
                     "seq_length: 128, vocab_size: 1000}}\ndevice: {flops: 1e-300 GFLOPS, memory: 80 GB}\n")
    message = refused(capsys, "plan", model, "--devices", "2", "--time-limit", "5")
    assert message.startswith(f"zbopt: {model}: layer 'embedding': forward_ms = ")
    assert message.endswith("at most 1e+15 (zbopt's range), from the architecture at device.flops = 1e-291 FLOP/s")


def test_an_architecture_deeper_than_the_layer_cap_is_refused_before_it_is_built(tmp_path, capsys):
    model = tmp_path / "deep.yaml"
    model.write_text("model: {architecture: {num_layers: 100000000, hidden_size: 64, num_attention_heads: 4, "
                     "seq_length: 128, vocab_size: 1000}}\ndevice: {flops: 100 TFLOPS}\n")
    assert refused(capsys, "costs", model) == (f"zbopt: {model}: model.architecture.num_layers = 100000000: more "
                                               "than 100,000 layers")


def test_a_megatron_layout_with_a_huge_count_is_refused_in_python_too():
    from zbopt import ZboptError
    from zbopt.planning.model import Layer, Model
    from zbopt.planning.planner.exports import MAX_EXPANDED, megatron_counts

    model = Model.from_repeats([(Layer("decoder", 1, 1, 1, 1, 1), 4)])
    with pytest.raises(ZboptError, match=rf"expands to more than {MAX_EXPANDED} symbols$"):
        megatron_counts(model, "Et*99999999999999999999|L")


def test_a_model_beyond_the_plans_layer_cap_is_refused_up_front(tmp_path, capsys):
    from zbopt.planning.planner.search import MAX_PLAN_LAYERS

    model = tmp_path / "deep.yaml"
    model.write_text(LAYERS.replace("repeat: 4", f"repeat: {MAX_PLAN_LAYERS + 1}"))
    assert refused(capsys, "plan", model, "--devices", "4", "--time-limit", "5").startswith(
        f"zbopt: plan: {MAX_PLAN_LAYERS + 1:,} layers, more than the {MAX_PLAN_LAYERS:,} its split models hold")


ROOT = Path(__file__).resolve().parent.parent


def test_a_plan_of_a_thousand_microbatches_keeps_its_time_limit():
    """Issue 42 item 2: m = 1000 ran 11.7 s under --time-limit 5; the limit bounds the whole call
    (start-up included) within 5%, measured here by the test itself."""
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "zbopt", "plan", "examples/model_layers.yaml", "--devices", "4",
                          "--microbatches", "1000", "--time-limit", "5", "--json"], capture_output=True, text=True,
                         cwd=ROOT)
    took = time.perf_counter() - began
    assert run.returncode == 0, run.stderr[-500:]
    assert took <= 5 * 1.05, took


def test_ctrl_c_stops_a_plan_of_thousands_of_microbatches_within_a_second():
    """Issue 42 item 2: with m = 3000, SIGINT at 3 s exited 28 s later; now within a second, with
    the plan so far (or none) and exit 130."""
    process = subprocess.Popen([sys.executable, "-m", "zbopt", "plan", "examples/model_layers.yaml", "--devices", "4",
                                "--microbatches", "3000", "--time-limit", "120"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT)
    time.sleep(3)
    sent = time.perf_counter()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert (process.returncode, err) == (130, "zbopt: interrupted\n")
    assert time.perf_counter() - sent <= 1.0


def test_a_pipeline_too_large_to_hold_blames_the_flag_that_made_it(capsys):
    message = refused(capsys, "plan", ROOT / "examples" / "model_layers.yaml", "--devices", "4", "--microbatches",
                      "100000000", "--time-limit", "2")
    assert message.startswith("zbopt: --microbatches: num_microbatches = 100000000: the problem has 800,000,000 ops")
