"""A split written for Megatron-LM and torchtitan: the documented examples of each format (Megatron's
docs, its TransformerConfig and parser docstrings and argument help; torchtitan's docstrings and job
config), the round trip split -> text -> split, the first/last-stage counts against Megatron's own
rule for where the layers go, and every bad input as one line naming its culprit."""

import random

import pytest

from zbopt.core.errors import ZboptError
from zbopt.planning.model import Layer, Model
from zbopt.planning.planner.exports import (
    FIRST_KEY,
    LAST_KEY,
    megatron_counts,
    megatron_first_last,
    megatron_layout,
    parse_megatron_layout,
    torchtitan_counts,
    torchtitan_modules,
)


def model(*groups: tuple[str, int]) -> Model:
    return Model.from_repeats([(Layer(name, 1.0, 1.0, 1.0, 0.1, 0.1), repeat) for name, repeat in groups])


def llm(decoders: int) -> Model:
    return model(("embedding", 1), ("decoder", decoders), ("lm_head", 1))


def random_split(rng: random.Random, layers: int, stages: int) -> list[int]:
    """Layers per stage at random cuts (empty stages too)."""
    cuts = sorted(rng.randint(0, layers) for _ in range(stages - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True)]


DEEPSEEK_V3 = model(("embedding", 1), ("decoder", 61), ("mtp", 1), ("lm_head", 1))  # the docs' example model
DEEPSEEK_COUNTS = [4] + [2] * 29 + [1, 1]


# ------------------------------------------------------------------------------ Megatron-LM: documented examples
def test_the_docs_deepseek_layout_reads_as_the_docs_table_says():
    """docs/api-guide/pipeline_parallel_layout.md: PP16 VPP2, "Et*3|(tt|)*29,m|L"; stage i = vpp * 16 + pp."""
    stages = parse_megatron_layout("Et*3|(tt|)*29,m|L")
    assert len(stages) == 32
    table = {(pp, vpp): stages[vpp * 16 + pp] for pp in range(16) for vpp in range(2)}
    assert table[0, 0] == "Ettt" and table[0, 1] == "tt"
    assert all(table[pp, vpp] == "tt" for pp in range(1, 14) for vpp in range(2))
    assert (table[14, 0], table[14, 1], table[15, 0], table[15, 1]) == ("tt", "m", "tt", "L")


def test_the_deepseek_split_exports_to_the_docs_string_and_back():
    assert megatron_layout(DEEPSEEK_V3, DEEPSEEK_COUNTS, num_devices=16, chunks=2) == "Et*3|(tt|)*29,m|L"
    assert megatron_counts(DEEPSEEK_V3, "Et*3|(tt|)*29,m|L", num_devices=16) == DEEPSEEK_COUNTS
    assert megatron_counts(DEEPSEEK_V3, "Ettt|(tt|)*29,m|L") == DEEPSEEK_COUNTS  # parse_str_to_list's docstring


@pytest.mark.parametrize("text, stages", [
    ("E||t|L", ["E", "", "t", "L"]),  # the docs: empty stages are legal
    ("E|(tt|)*2,(t|)*4,mL", ["E", "tt", "tt", "t", "t", "t", "t", "mL"]),  # TransformerConfig's docstring
    ("E|(t|)*3,m|m||L", ["E", "t", "t", "t", "m", "m", "", "L"]),  # --pipeline-model-parallel-layout's help
])
def test_documented_layouts_parse_to_their_stages(text, stages):
    assert parse_megatron_layout(text) == stages


def test_an_empty_stage_round_trips():
    assert megatron_layout(llm(1), [1, 0, 1, 1], num_devices=4) == "E||t|L"
    assert megatron_counts(llm(1), "E||t|L") == [1, 0, 1, 1]


def test_numpy_counts_are_taken_as_lists():
    numpy = pytest.importorskip("numpy")
    assert megatron_layout(llm(4), numpy.array([3, 3]), numpy.int64(2)) == "Ett|ttL"


def test_the_list_form_example_and_one_L_for_head_and_loss():
    """TransformerConfig: [['embedding', 'decoder'], ['decoder', 'decoder', 'decoder', 'loss']], pp = 2."""
    text = megatron_layout(model(("embedding", 1), ("decoder", 4), ("loss", 1)), [2, 4], num_devices=2)
    assert text == "Et|t*3L" and parse_megatron_layout(text) == ["Et", "tttL"]
    both = model(("embedding", 1), ("decoder", 4), ("lm_head", 1), ("loss", 1))  # Megatron's 'L' is both
    assert megatron_layout(both, [2, 5], num_devices=2) == "Et|t*3L"
    assert megatron_counts(both, "Et|t*3L") == [2, 5]


def test_layouts_round_trip_over_random_splits():
    rng = random.Random(31)
    for _ in range(200):
        p, v = rng.randint(1, 6), rng.randint(1, 3)
        decoders = rng.randint(1, 40)
        counts = random_split(rng, decoders + 2, p * v)
        text = megatron_layout(llm(decoders), counts, p, v)
        assert megatron_counts(llm(decoders), text, p) == counts, text
        assert [len(stage) for stage in parse_megatron_layout(text)] == counts


def test_v_placement_is_refused_for_megatron_with_its_reason():
    with pytest.raises(ZboptError, match=r"interleaved.*no V"):
        megatron_layout(llm(6), [2, 2, 2, 2], num_devices=2, chunks=2, placement="v")
    with pytest.raises(ZboptError, match="placement 'v'"):
        megatron_first_last(llm(6), [2, 2, 2, 2], num_devices=2, chunks=2, placement="v")
    assert megatron_layout(llm(2), [2, 2], num_devices=2, placement="v") == "Et|tL"  # one chunk: same order


# ------------------------------------------------------------------------------ Megatron-LM: first/last counts
def megatron_decoders(first: int, last: int, num_layers: int, p: int, v: int) -> list[int]:
    """Decoder layers per virtual stage (chunk * p + rank) as Megatron-LM places them for
    --decoder-first/last-pipeline-num-layers (TransformerConfig checks; get_transformer_layer_offset)."""
    middle = (num_layers - first - last) // (p - 2) if p > 2 else 0
    row = [first // v] + [middle // v] * (p - 2) + [last // v]
    return row * v


@pytest.mark.parametrize("counts, p, v, expected", [
    ([8, 9, 9, 8], 4, 1, (7, 7)),  # the 32-layer model: one layer fewer on each end stage
    ([4, 5, 5, 3, 3, 5, 5, 4], 4, 2, (6, 6)),  # v = 2: three per chunk on the end ranks
    ([20, 14], 2, 1, (19, 13)),  # two ranks: no middle
    ([8, 9, 10, 7], 4, 1, None),  # middle ranks differ
    ([1, 11, 11, 11], 4, 1, None),  # the embedding alone: no positive first count
    ([4, 5, 5, 4, 3, 5, 5, 4], 4, 2, None),  # the chunks' last stages differ
])
def test_first_last_counts(counts, p, v, expected):
    got = megatron_first_last(llm(sum(counts) - 2), counts, p, v)
    if expected is None:
        assert got is None
        return
    assert got == {FIRST_KEY: expected[0], LAST_KEY: expected[1]}
    decoders = [count - (stage == 0) - (stage == len(counts) - 1) for stage, count in enumerate(counts)]
    assert megatron_decoders(*expected, sum(decoders), p, v) == decoders


def test_first_last_needs_ends_and_mtp_where_megatron_builds_them():
    assert megatron_first_last(llm(2), [2, 0, 2], 3) is None  # an empty middle rank: Megatron refuses it
    assert megatron_first_last(llm(4), [3, 2, 1], 3) is None  # lm_head alone: no positive last count
    mtp = model(("embedding", 1), ("decoder", 6), ("mtp", 1), ("lm_head", 1))
    assert megatron_first_last(mtp, [3, 2, 4], 3) == {FIRST_KEY: 2, LAST_KEY: 2}
    assert megatron_first_last(mtp, [3, 3, 1, 2], 4) is None  # the MTP layer before the last stage
    assert megatron_first_last(llm(4), [6], 1) is None


# ------------------------------------------------------------------------------ torchtitan
def test_torchtitan_documented_examples():
    # pipeline_module_split's docstring: embeddings + first layer, middle layers, final norm + output
    assert torchtitan_modules(llm(3), [2, 2, 1], num_devices=3) == [
        ["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], ["norm", "output"]]
    # generate_llm_fqn_per_model_part(2, 3, input_weight=2, output_weight=2): 7 effective layers, 4 + 3
    split = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "norm", "output"]]
    assert torchtitan_modules(llm(3), [3, 2], num_devices=2) == split and torchtitan_counts(llm(3), split) == [3, 2]
    # job_config's module_fqns_per_model_part example: a model without a head
    headless = model(("embedding", 1), ("decoder", 5))
    example = [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "layers.4"]]
    assert torchtitan_counts(headless, example) == [2, 2, 2]
    assert torchtitan_modules(llm(2), [4], num_devices=1) == [["tok_embeddings", "layers.0", "layers.1", "norm",
                                                               "output"]]  # one stage gets everything


def test_torchtitan_names_a_norm_layer_of_its_own_and_leaves_the_loss_to_the_last_stage():
    named = model(("tok_embeddings", 1), ("decoder", 2), ("norm", 1), ("output", 1), ("loss", 1))
    modules = torchtitan_modules(named, [2, 1, 3], num_devices=3)
    assert modules == [["tok_embeddings", "layers.0"], ["layers.1"], ["norm", "output"]]
    assert torchtitan_counts(named, modules) == [2, 1, 3]


def test_torchtitan_round_trips_and_takes_v_with_two_chunks():
    rng = random.Random(7)
    for _ in range(100):
        p, v = rng.randint(1, 5), rng.choice([1, 2])
        decoders = rng.randint(1, 30)
        counts = random_split(rng, decoders + 2, p * v)
        modules = torchtitan_modules(llm(decoders), counts, p, v, placement=rng.choice(["loop", "v"]))
        assert torchtitan_counts(llm(decoders), modules) == counts
    with pytest.raises(ZboptError, match="exactly two stages per rank"):
        torchtitan_modules(llm(4), [1] * 6, num_devices=2, chunks=3, placement="v")


# ------------------------------------------------------------------------------ bad input: one line, the culprit
@pytest.mark.parametrize("call, culprit", [
    (lambda: megatron_layout(model(("embedding", 1), ("attention_sink", 2), ("lm_head", 1)), [2, 2], 2),
     "'attention_sink'"),
    (lambda: megatron_layout(llm(4), [2, 2, 2], 2), "counts has 3 stages"),
    (lambda: megatron_layout(llm(4), [2, 2], 2), "counts cover 4 layers: the model has 6"),
    (lambda: megatron_layout(llm(4), [3, -1, 2, 2], 4), "counts[1] = -1"),
    (lambda: megatron_layout(llm(4), [3, 3], 2, placement="zigzag"), "placement = 'zigzag'"),
    (lambda: megatron_layout(model(("decoder", 4), ("lm_head", 1)), [2, 3], 2), "'decoder 0'"),
    (lambda: megatron_layout(model(("embedding", 1), ("decoder", 4)), [2, 3], 2), "'decoder 3'"),
    (lambda: megatron_layout(model(("embedding", 1), ("decoder", 2), ("lm_head", 1), ("loss", 1)), [3, 1, 1], 3),
     "'lm_head' and 'loss' on different stages"),
    (lambda: megatron_layout(model(("embedding", 1), ("decoder", 6), ("mtp", 1), ("lm_head", 1)), [4, 4, 0, 1], 2, 2),
     "'mtp' on virtual stage 1: Megatron-LM builds an MTP layer only in its rank's last chunk"),
    (lambda: parse_megatron_layout("Et|tx|L"), "stage 1 holds 'x'"),
    (lambda: parse_megatron_layout("E|t*99999999|L"), "expands to more than"),
    (lambda: parse_megatron_layout("E|(t|)*" + "9" * 5000 + ",L"), "expands to more than"),
    (lambda: parse_megatron_layout(["E", "L"]), "expected a string"),
    (lambda: megatron_counts(llm(3), "Et|tm|tL"), "stage 1 has 'm' where the model has 'decoder 2'"),
    (lambda: megatron_counts(llm(3), "Et|tt"), "ends before the model's 'lm_head'"),
    (lambda: megatron_counts(llm(3), "Et|tt|tL", num_devices=2), "3 stages do not divide among 2 ranks"),
    (lambda: torchtitan_modules(DEEPSEEK_V3, DEEPSEEK_COUNTS, 16, 2), "'mtp': torchtitan's LLM split names no MTP"),
    (lambda: torchtitan_counts(llm(3), [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]),
     "'layers.2' (decoder 2) is in no model chunk; torchtitan would drop it"),
    (lambda: torchtitan_counts(llm(1), [["tok_embeddings", "layers.0"], ["layers.0", "norm", "output"]]),
     "'layers.0' is in model chunk 0 already"),
    (lambda: torchtitan_counts(llm(1), [["tok_embeddings", "layer.0"], ["norm", "output"]]), "'layer.0' is no module"),
    (lambda: torchtitan_counts(llm(1), [["tok_embeddings", "layers.0", "norm"], ["output"]]),
     "norm and output (lm_head) are in different model chunks"),
    (lambda: torchtitan_counts(llm(2), [["tok_embeddings", "layers.1"], ["layers.0", "norm", "output"]]),
     "'decoder 1' is in model chunk 0, after layers in chunk 1"),
    (lambda: torchtitan_modules(model(("embedding", 1), ("decoder", 2), ("lm_head", 1), ("loss", 1)), [2, 2, 1], 2),
     "counts has 3 stages"),
    (lambda: torchtitan_modules(model(("embedding", 1), ("decoder", 1), ("loss", 1), ("lm_head", 1)), [2, 2], 2),
     "'loss': torchtitan computes the loss last"),
    (lambda: torchtitan_modules("a model", [1], 1), "expected a zbopt.planning.model.Model"),
])
def test_bad_input_is_one_line_naming_the_culprit(call, culprit):
    with pytest.raises(ZboptError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and culprit in message, message
