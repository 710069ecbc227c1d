"""The model description: layers as written (units, repeats, defaults), profiles, costs from an
architecture against hand-counted FLOPs and bytes, presets against published parameter counts,
`zbopt costs`, and every bad input as one line naming its key."""

import json
from pathlib import Path

import pytest

from zbopt import Device, Layer, Model, ZboptError, load_model
from zbopt.core.paper_tables import ZERO_BUBBLE_MODELS
from zbopt.interfaces.cli import main
from zbopt.planning.model import Architecture

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ISSUE_LAYERS = [  # issue 31's example, as written
    {"name": "embedding", "forward": "0.4 ms", "backward": "0.5 ms", "weight": "0.9 ms", "activation": "0.2 GB",
     "parameters": "4.2 GB"},
    {"name": "decoder", "repeat": 32, "forward": "1.7 ms", "backward": "1.8 ms", "weight": "1.3 ms",
     "activation": "0.8 GB", "parameters": "1.2 GB"},
    {"name": "lm_head", "forward": "4.6 ms", "backward": "4.8 ms", "weight": "3.5 ms", "activation": "2.1 GB",
     "parameters": "4.2 GB"},
]


def layers_by_name(model: Model) -> dict[str, Layer]:
    return {layer.name: layer for layer in model.layers}


# ------------------------------------------------------------------------------ layers as written
def test_the_issue_example_expands_its_repeat_and_names_layers_as_written():
    model, device = load_model(EXAMPLES / "model_layers.yaml")
    assert len(model.layers) == 34 and model.groups == (("embedding", 1), ("decoder", 32), ("lm_head", 1))
    assert model.labels[:3] == ("embedding", "decoder 0", "decoder 1")
    assert model.labels[-2:] == ("decoder 31", "lm_head")
    assert all(layer == model.layers[1] for layer in model.layers[1:33])
    decoder = model.layers[5]
    assert (decoder.forward_ms, decoder.backward_ms, decoder.weight_ms) == (1.7, 1.8, 1.3)
    assert (decoder.activation_gb, decoder.weight_activation_gb, decoder.parameters_gb) == (0.8, 0.4, 1.2)  # M_W: M_B/2
    assert device == Device(memory_gb=80.0, flops=None, p2p_ms=0.0)


def test_units_convert_once_gib_is_not_gb_and_seconds_are_milliseconds():
    entry = {"name": "loss", "forward": "2 s", "backward": "300 us", "weight": "0 ms", "activation": "1 GiB",
             "weight_activation": "512 MiB", "parameters": "0 GB"}
    layer = Model.from_config({"layers": [entry]}).layers[0]
    assert (layer.forward_ms, layer.backward_ms, layer.weight_ms) == (2000.0, pytest.approx(0.3), 0.0)
    assert layer.activation_gb == 2**30 / 1e9 and layer.weight_activation_gb == 2**29 / 1e9


def test_a_layer_without_weight_has_a_fused_backward():
    entry = {"name": "decoder", "repeat": 3, "forward": "1 ms", "backward": "2.5 ms", "activation": "1 GB",
             "parameters": "1 GB"}
    model = Model.from_config({"layers": [entry]})
    assert model.labels == ("decoder 0", "decoder 1", "decoder 2")
    assert all(layer.fused and layer.backward_ms == 2.5 and layer.weight_activation_gb is None
               for layer in model.layers)


def test_a_name_written_twice_is_numbered_across_the_model_and_groups_keep_the_spelling():
    one = Layer("mlp", 1.0, 1.0, 1.0, 0.1, 0.1)
    other = Layer("attention", 2.0, 2.0, 1.0, 0.2, 0.1)
    model = Model.from_repeats([(one, 2), (other, 1), (one, 1)])
    assert model.labels == ("mlp 0", "mlp 1", "attention", "mlp 2")
    assert model.groups == (("mlp", 2), ("attention", 1), ("mlp", 1))
    assert Model((one, one, other)).groups == (("mlp", 2), ("attention", 1))  # runs of equal layers by default
    with pytest.raises(ZboptError, match="groups cover 2 layers, the model has 3"):
        Model((one, one, other), groups=(("mlp", 2),))


# ------------------------------------------------------------------------------ profiles
def test_a_csv_profile_reads_repeats_and_an_empty_weight_as_fused(tmp_path):
    (tmp_path / "p.csv").write_text("name,repeat,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb\n"
                                    "embedding,1,0.4,0.5,0.9,0.2,4.2\ndecoder,4,1.7,3.1,,0.8,1.2\n")
    (tmp_path / "m.yaml").write_text("model: {profile: p.csv}\n")  # relative to the model file
    model, _ = load_model(tmp_path / "m.yaml")
    assert model.labels == ("embedding", "decoder 0", "decoder 1", "decoder 2", "decoder 3")
    assert model.layers[0].weight_activation_gb == 0.1 and model.layers[1].fused and model.layers[1].backward_ms == 3.1


def test_costs_json_reads_back_as_a_profile(tmp_path, capsys):
    assert main(["costs", str(EXAMPLES / "model_llama3_8b.yaml"), "--json"]) == 0
    (tmp_path / "p.json").write_text(capsys.readouterr().out)
    model, _ = load_model(EXAMPLES / "model_llama3_8b.yaml")
    profile = Model.from_profile(tmp_path / "p.json")  # the layers, gradients included; not how they are trained
    assert (profile.layers, profile.groups) == (model.layers, model.groups)


@pytest.mark.parametrize(("text", "message"), [
    ("name,forward_ms,backward_ms,weight_ms,activation_gb\n", "missing column parameters_gb"),
    ("name,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb,speed\n", "unknown column 'speed'"),
    ("name,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb\nx,1,fast,1,1,1\n",
     "line 2: backward_ms = 'fast': not a number"),
    ("name,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb\nx,1,-2,1,1,1\n",
     "line 2: backward_ms = -2.0: cannot be negative"),
    ("name,repeat,forward_ms,backward_ms,weight_ms,activation_gb,parameters_gb\nx,0,1,1,1,1,1\n",
     "line 2: repeat = 0: expected a positive whole number"),
])
def test_a_bad_profile_is_one_line_naming_file_line_and_column(tmp_path, text, message):
    (tmp_path / "p.csv").write_text(text)
    with pytest.raises(ZboptError, match=message):
        Model.from_profile(tmp_path / "p.csv")


# ------------------------------------------------------------------------------ costs from an architecture
GPT = dict(num_layers=4, hidden_size=2048, num_attention_heads=16, seq_length=1024, micro_batch_size=2,
           vocab_size=51200, flash_attention=False)


def test_gpt_costs_match_the_zero_bubble_and_korthikanti_counts_by_hand():
    """b = 2, s = 1024, h = 2048, a = 16, f = 4h, V = 51200, no flash attention, bf16, 100 TFLOPS:
    ZB Table 1 (F 24bsh² + 4bs²h, B 24bsh² + 8bs²h, W 24bsh²), Korthikanti's sbh(34 + 5as/h) and
    ZB's M_W = 32sbh, Megatron's 12h² + 13h weights at 18 bytes (2 + 4 + 12) each."""
    model = Model.from_architecture(GPT, Device(flops=100e12))
    layers = layers_by_name(model)
    decoder, embedding, head = layers["decoder"], layers["embedding"], layers["lm_head"]
    ms = 1e3 / 100e12  # per FLOP
    assert decoder.forward_ms == pytest.approx((24 * 2 * 1024 * 2048**2 + 4 * 2 * 1024**2 * 2048) * ms, rel=1e-12)
    assert decoder.backward_ms == pytest.approx((24 * 2 * 1024 * 2048**2 + 8 * 2 * 1024**2 * 2048) * ms, rel=1e-12)
    assert decoder.weight_ms == pytest.approx(24 * 2 * 1024 * 2048**2 * ms, rel=1e-12)
    assert decoder.activation_gb == pytest.approx(1024 * 2 * 2048 * (34 + 5 * 16 * 1024 / 2048) / 1e9, rel=1e-12)
    assert decoder.weight_activation_gb == pytest.approx(32 * 1024 * 2 * 2048 / 1e9, rel=1e-12)
    assert decoder.parameters_gb == pytest.approx((12 * 2048**2 + 13 * 2048) * 18 / 1e9, rel=1e-12)
    # the head: a 2048 x 51200 matmul three times; the norm and projection inputs, fp32 logits
    assert head.forward_ms == head.backward_ms == head.weight_ms == pytest.approx(2 * 2 * 1024 * 2048 * 51200 * ms)
    assert head.activation_gb == pytest.approx((4 * 1024 * 2 * 2048 + 4 * 1024 * 2 * 51200) / 1e9, rel=1e-12)
    assert head.weight_activation_gb == pytest.approx((4 * 1024 * 2 * 2048 + 2 * 1024 * 2 * 51200) / 1e9, rel=1e-12)
    assert head.parameters_gb == pytest.approx((51200 * 2048 + 2 * 2048) * 18 / 1e9, rel=1e-12)
    # the embedding: word and learned position tables, a dropout mask, a copy and a scatter
    assert embedding.parameters_gb == pytest.approx((51200 + 1024) * 2048 * 18 / 1e9, rel=1e-12)
    assert (embedding.activation_gb, embedding.backward_ms) == (pytest.approx(1024 * 2 * 2048 / 1e9), 0.0)
    assert embedding.forward_ms == embedding.weight_ms == pytest.approx(2 * 1024 * 2048 * ms)
    assert model.labels == ("embedding", "decoder 0", "decoder 1", "decoder 2", "decoder 3", "lm_head")


def test_llama_like_costs_with_grouped_queries_swiglu_flash_and_a_sharded_optimizer_by_hand():
    """b = 1, s = 4096, h = 4096, a = 32, g = 8 (K, V 1024 wide), f = 14336, SwiGLU, RMSNorm, no
    biases, flash attention (its backward recomputes QKᵀ: 5 attention matmuls), bf16 with Adam
    sharded over 8 ranks: 2 + 4 + 12/8 = 7.5 bytes per parameter."""
    arch = dict(num_layers=2, hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                seq_length=4096, vocab_size=128256, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
                position_embedding_type="rope")
    model = Model.from_architecture(arch, Device(flops=400e12), data_parallel=8, use_distributed_optimizer=True)
    decoder = layers_by_name(model)["decoder"]
    tokens, ms = 4096, 1e3 / 400e12
    # per token: Q 4096x4096, K and V 4096x1024 each, output 4096x4096, gate, up, down 4096x14336
    weights = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336
    attention = 2 * 4096 * 4096 * 4096  # QKᵀ (or its product with V): 2·s·s·h per sequence
    assert decoder.forward_ms == pytest.approx((2 * tokens * weights + 2 * attention) * ms, rel=1e-12)
    assert decoder.backward_ms == pytest.approx((2 * tokens * weights + 5 * attention) * ms, rel=1e-12)
    assert decoder.weight_ms == pytest.approx(2 * tokens * weights * ms, rel=1e-12)
    # bytes per token: 2 norm inputs, QKV input, Q, attention output, MLP input (2 B each, 4096
    # wide), K and V (2 B, 1024 wide), gate+up and their product (2 B, 3 x 14336), 2 dropout masks
    kept = 2 * (6 * 4096 + 2 * 1024) + 2 * 3 * 14336
    assert decoder.activation_gb == pytest.approx(tokens * (kept + 2 * 4096) / 1e9, rel=1e-12)
    assert decoder.weight_activation_gb == pytest.approx(tokens * kept / 1e9, rel=1e-12)
    assert decoder.parameters_gb == pytest.approx((weights + 2 * 4096) * 7.5 / 1e9, rel=1e-12)
    head = layers_by_name(model)["lm_head"]
    assert head.parameters_gb == pytest.approx((128256 * 4096 + 4096) * 7.5 / 1e9, rel=1e-12)
    assert layers_by_name(model)["embedding"].parameters_gb == pytest.approx(128256 * 4096 * 7.5 / 1e9, rel=1e-12)


@pytest.mark.parametrize(("preset", "published"), [("llama-3-8b", 8_030_261_248), ("llama-3-70b", 70_553_706_496),
                                                   ("llama-2-7b", 6_738_415_616)])
def test_presets_hold_their_published_parameter_counts(preset, published):
    """The released checkpoints' parameter counts; each layer's parameters_gb at 16 bytes (fp32)."""
    model = Model.from_config({"preset": preset, "dtype": "fp32"}, Device(flops=1e15))
    assert sum(layer.parameters_gb for layer in model.layers) * 1e9 / 16 == pytest.approx(published, rel=1e-12)


@pytest.mark.parametrize("name", sorted(ZERO_BUBBLE_MODELS))
def test_zero_bubble_presets_keep_the_papers_m_w_share_and_size(name):
    """M_W / M_B as paper_tables computes it from Table 1; the parameters (once each, the head's
    copy of the embedding left out) within 1.5% of the model's name: a layer count off by two
    would miss by 9% or more."""
    model = Model.from_config({"preset": f"zb-{name.lower()}"}, Device(flops=1e15))  # bf16: 18 B a parameter
    decoder = layers_by_name(model)["decoder"]
    assert decoder.weight_activation_gb / decoder.activation_gb == pytest.approx(
        ZERO_BUBBLE_MODELS[name].weight_memory, rel=1e-12)
    held = sum(layer.parameters_gb for layer in model.layers[:-1]) * 1e9 / 18
    assert held == pytest.approx(float(name.rstrip("B")) * 1e9, rel=0.015)


def test_architecture_keys_beside_a_preset_override_it():
    model = Model.from_config({"preset": "llama-3-8b", "architecture": {"num_layers": 2}}, Device(flops=1e15))
    assert model.groups == (("embedding", 1), ("decoder", 2), ("lm_head", 1))
    assert Architecture(num_layers=1, hidden_size=3072, num_attention_heads=24, seq_length=8, vocab_size=8,
                        swiglu=True).ffn_hidden_size == 8192  # Megatron-LM's SwiGLU default: int(8h/3/64)·64


# ------------------------------------------------------------------------------ bad input: one line, the key
@pytest.mark.parametrize(("section", "message"), [
    ({"layers": [{**ISSUE_LAYERS[1], "forward": "1.7 min"}]},
     r"model.layers\[0\] \(decoder\).forward = '1.7 min': unknown unit 'min' \(known: ms, s, us, µs\)"),
    ({"layers": [{**ISSUE_LAYERS[1], "activation": 0.8}]},
     r"model.layers\[0\] \(decoder\).activation = 0.8: write the unit, e.g. '0.8 GB'"),
    ({"layers": [{**ISSUE_LAYERS[1], "backward": "-1.8 ms"}]},
     r"model.layers\[0\] \(decoder\).backward = '-1.8 ms': a time cannot be negative"),
    ({"layers": [{**ISSUE_LAYERS[1], "repeat": 0}]}, r"model.layers\[0\] \(decoder\).repeat = 0: expected a positive"),
    ({"layers": [{**ISSUE_LAYERS[1], "repeat": "32"}]}, r"\(decoder\).repeat = '32': expected a positive whole"),
    ({"layers": [{**ISSUE_LAYERS[1], "repeat": 2.5}]}, r"\(decoder\).repeat = 2.5: expected a positive whole"),
    ({"layers": [{**ISSUE_LAYERS[1], "speed": "1 ms"}]}, r"\(decoder\): unknown key 'speed' \(known: name, repeat"),
    ({"layers": [{"name": "x", "forward": "1 ms", "backward": "1 ms", "activation": "1 GB"}]},
     r"model.layers\[0\] \(x\): missing key parameters"),
    ({"layers": [{**ISSUE_LAYERS[0], "weight_activation": "0.5 GB"}]},
     r"\(embedding\): layer 'embedding': weight_activation_gb = 0.5: more than its activation_gb 0.2"),
    ({"layers": [{"name": "x", "forward": "1 ms", "backward": "1 ms", "activation": "1 GB", "parameters": "0 GB",
                  "weight_activation": "0.1 GB"}]}, r"weight_activation = '0.1 GB': a fused backward"),
    ({"layers": []}, r"model.layers = \[\]: expected a non-empty list"),
    ({"layer": []}, r"model: unknown key 'layer' \(known: layers, profile"),
    ({}, r"model: give exactly one of layers, profile, architecture \(or preset\), not none"),
    ({"layers": ISSUE_LAYERS, "preset": "llama-3-8b"}, r"not layers and preset"),
    ({"layers": ISSUE_LAYERS, "dtype": "bf16"}, r"model.dtype: applies to costs from an architecture only"),
    ({"preset": "llama-4"}, r"model.preset = 'llama-4': unknown preset \(known: zb-1.5b, "),
    ({"architecture": {**GPT, "hidden_sise": 1}}, r"model.architecture: unknown key 'hidden_sise' \(known: num_layers"),
    ({"architecture": {"num_layers": 2, "hidden_size": 64}}, r"model.architecture: missing key num_attention_heads"),
    ({"architecture": {**GPT, "num_layers": 0}}, r"model.architecture.num_layers = 0: expected a positive whole"),
    ({"architecture": {**GPT, "num_attention_heads": 3}}, r"num_attention_heads = 3: does not divide hidden_size"),
    ({"architecture": {**GPT, "swiglu": "yes"}}, r"model.architecture.swiglu = 'yes': expected true or false"),
    ({"architecture": GPT, "dtype": "int8"}, r"model.dtype = 'int8': expected one of bf16, fp16, fp32"),
    ({"architecture": GPT, "data_parallel": 0}, r"model.data_parallel = 0: expected a positive whole number"),
])
def test_bad_model_sections_are_one_line_naming_the_key_and_value(section, message):
    with pytest.raises(ZboptError, match=message) as error:
        Model.from_config(section, Device(flops=1e15))
    assert "\n" not in str(error.value)


def test_an_architecture_needs_the_devices_flops():
    with pytest.raises(ZboptError, match=r"device.flops: missing; .* e.g. flops: 400 TFLOPS"):
        Model.from_config({"architecture": GPT}, Device(memory_gb=80.0))


@pytest.mark.parametrize(("text", "message"), [
    ("model: {preset: llama-3-8b}\ndevice: {flops: 400}\n",
     "zbopt: {path}: device.flops = 400: write the unit, e.g. '400 TFLOPS'"),
    ("model: {preset: llama-3-8b}\ndevice: {flops: 1 PFLOPS, speed: 3}\n",
     "zbopt: {path}: device: unknown key 'speed' (known: memory, flops, p2p, reserve, dp_bandwidth, dp_latency, "
     "memory_bandwidth, comm_slowdown)"),
    ("modle: {preset: llama-3-8b}\n", "zbopt: model file '{path}': unknown key 'modle' (known: model, device)"),
    ("device: {memory: 80 GB}\n", "zbopt: model file '{path}': missing key model"),
])
def test_costs_on_bad_input_exits_2_with_one_line_and_no_traceback(tmp_path, capsys, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    assert main(["costs", str(path)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message.format(path=path) + "\n")


# ------------------------------------------------------------------------------ zbopt costs
def test_costs_prints_one_row_per_group_with_units_in_the_header(capsys):
    assert main(["costs", str(EXAMPLES / "model_layers.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("  ")[0] == "layer" and "F (ms)" in lines[0] and "parameters (GB)" in lines[0]
    # the gradient reduced: none given, so 4 of bf16 Adam's 18 bytes per parameter
    assert lines[2].split() == ["decoder", "32", "1.7", "1.8", "1.3", "0.8", "0.4", "1.2", "0.2667"]
    assert lines[4].split() == ["total", "34", "59.4", "62.9", "46", "27.9", "13.95", "46.8",
                                "10.4"]  # 0.4 + 32·1.7 + 4.6 ..., 46.8 · 4 / 18


def test_costs_json_lists_the_layers_with_their_units_in_the_keys(capsys):
    assert main(["costs", str(EXAMPLES / "model_gpt.yaml"), "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert [(row["name"], row["repeat"]) for row in layers] == [("embedding", 1), ("decoder", 30), ("lm_head", 1)]
    assert {"name", "forward_ms", "backward_ms", "weight_ms", "activation_gb", "parameters_gb"} <= set(layers[1])
    # ZB 6.2B at 200 TFLOPS, b = 3: F = 24bsh² + 4bs²h
    assert layers[1]["forward_ms"] == pytest.approx((24 * 3 * 1024 * 4096**2 + 4 * 3 * 1024**2 * 4096) / 200e12 * 1e3)
