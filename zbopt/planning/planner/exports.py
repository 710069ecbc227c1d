"""A split as the training frameworks spell it, and read back from their spelling.

A split is `counts`: how many of the model's layers each virtual stage holds, in model order (stage
s holds the next counts[s] layers), the ends (embedding, LM head, loss, MTP) counted as layers. zbopt
chooses splits; a training run needs one in its framework's own words, and an engineer who runs a
split already wants it read back to compare. Each format is checked against its source:

- Megatron-LM's `--pipeline-model-parallel-layout` string (docs/api-guide/pipeline_parallel_layout.md;
  `PipelineParallelLayerLayout.parse_str_to_list` and `__init__` in
  megatron/core/transformer/pipeline_parallel_layer_layout.py): one stage per '|'-separated part in
  the order i = chunk * p + rank (the interleaved order; there is no V order), symbols E embedding,
  t transformer (decoder) layer, m MTP layer, L loss (the output layer and the loss, built where L
  is), "x*n" and "(...)*n" repeat, commas are cosmetic, empty stages are legal.
- Megatron-LM's `--decoder-first/last-pipeline-num-layers` (TransformerConfig's
  num_layers_in_first/last_pipeline_stage and its __post_init__ checks; the offsets in
  `get_transformer_layer_offset`, megatron/core/transformer/transformer_layer.py): decoder layers
  only, on pipeline rank 0 and rank p-1 summed over their chunks, each chunk holding 1/v of them;
  the ranks between share the rest equally; the embedding and the loss are not counted.
- torchtitan's `module_fqns_per_model_part` (torchtitan/config/job_config.py), read by
  `pipeline_module_split` (torchtitan/distributed/pipeline_parallel.py): one list of module names
  per model chunk in stage order, "tok_embeddings", "layers.<i>", "norm", "output", the names
  `generate_llm_fqn_per_model_part` writes; the schedule, not the list, places the stages (loop, or
  V with exactly two stages per rank).

>>> from zbopt.planning.model import Layer, Model
>>> layer = lambda name: Layer(name, forward_ms=1, backward_ms=1, weight_ms=1, activation_gb=1, parameters_gb=1)
>>> model = Model.from_repeats([(layer("embedding"), 1), (layer("decoder"), 6), (layer("lm_head"), 1)])
>>> megatron_layout(model, [2, 2, 2, 2], num_devices=2, chunks=2)
'Et|(tt|)*2,tL'
>>> megatron_counts(model, "Et|(tt|)*2,tL"), megatron_first_last(model, [2, 2, 2, 2], 2, chunks=2)
([2, 2, 2, 2], None)
>>> megatron_first_last(model, [2, 2, 2, 2], num_devices=4)
{'decoder_first_pipeline_num_layers': 1, 'decoder_last_pipeline_num_layers': 1}
>>> torchtitan_modules(model, [3, 5], num_devices=2)
[['tok_embeddings', 'layers.0', 'layers.1'], ['layers.2', 'layers.3', 'layers.4', 'layers.5', 'norm', 'output']]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import groupby

from zbopt.core.errors import ZboptError, clip, shorten
from zbopt.core.placement import PLACEMENTS
from zbopt.core.problem.checks import plain
from zbopt.planning.model import Model

__all__ = ["END_KINDS", "FIRST_KEY", "FQN", "KIND_NAMES", "KIND_OF_NAME", "LAST_KEY", "MAX_EXPANDED", "MEGATRON_SYMBOL",
           "SYMBOL_NAMES", "check_split", "layer_kinds", "megatron_counts", "megatron_first_last", "megatron_layout",
           "megatron_symbols", "parse_megatron_layout", "stage_of_layers", "torchtitan_counts", "torchtitan_modules",
           "torchtitan_names"]

KIND_NAMES = {  # a layer's name (lower case, '_' for spaces and '-') -> what kind of layer it is
    "embedding": ("embedding", "embeddings", "embed", "embed_tokens", "tok_embeddings", "word_embeddings", "wte"),
    "decoder": ("decoder", "decoder_layer", "transformer", "transformer_layer", "layer", "block", "dense", "moe"),
    "mtp": ("mtp", "mtp_layer"),
    "norm": ("norm", "final_norm", "final_layernorm", "ln_f"),
    "head": ("lm_head", "head", "output", "output_layer"),
    "loss": ("loss", "cross_entropy"),
}
KIND_OF_NAME = {name: kind for kind, names in KIND_NAMES.items() for name in names}
END_KINDS = ("norm", "head", "loss")  # Megatron-LM's 'L': the final norm, output layer and loss
MEGATRON_SYMBOL = {"embedding": "E", "decoder": "t", "mtp": "m", "norm": "L", "head": "L", "loss": "L"}
SYMBOL_NAMES = "E embedding, t decoder, m MTP, L loss"
MAX_EXPANDED = 1_000_000  # the most characters a layout may expand to (a model has far fewer layers)
FIRST_KEY, LAST_KEY = "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"
FQN = re.compile(r"\w+(\.\w+)*", re.ASCII)  # a module's fully qualified name in torch: "layers.0", "0"


def _check_model(model: object) -> None:
    if not isinstance(model, Model):
        raise ZboptError(f"model = {shorten(model)}: expected a zbopt.planning.model.Model")


def _kind_key(name: str) -> str:
    """A layer's name as KIND_NAMES spells it: lower case, '_' for spaces and '-'."""
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


def layer_kinds(model: Model) -> tuple[str, ...]:
    """Each layer's kind (a key of KIND_NAMES), read from its name: the formats name layers by role,
    the model by whatever the user wrote, and a name no rule knows is refused, not guessed."""
    _check_model(model)
    kinds = []
    for index, layer in enumerate(model.layers):
        kind = KIND_OF_NAME.get(_kind_key(layer.name))
        if kind is None:
            raise ZboptError(f"model layer {index} {layer.name!r}: no export knows this name (known: embedding, "
                             "decoder, mtp, norm, lm_head, loss and the synonyms in planner.exports.KIND_NAMES)")
        kinds.append(kind)
    return tuple(kinds)


def check_split(model: Model, counts: Sequence[int], num_devices: int, chunks: int, placement: str) -> list[int]:
    """`counts` as a list, after the checks every export needs: one whole count per virtual stage
    (num_devices × chunks of them), none negative, covering the model's layers exactly."""
    _check_model(model)
    counts, num_devices, chunks = plain(counts), plain(num_devices), plain(chunks)  # numpy as Python
    for key, value in (("num_devices", num_devices), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ZboptError(f"{key} = {shorten(value)}: expected a positive whole number")
    if placement not in PLACEMENTS:
        raise ZboptError(f"placement = {shorten(placement)}: expected one of {', '.join(PLACEMENTS)}")
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence):
        raise ZboptError(f"counts = {shorten(counts)}: expected a list of layer counts, one per virtual stage")
    counts = list(counts)
    for stage, count in enumerate(counts):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ZboptError(f"counts[{stage}] = {shorten(count)}: expected a whole number of layers, at least 0")
    if len(counts) != num_devices * chunks:
        raise ZboptError(f"counts has {len(counts)} stages: expected num_devices × chunks = {num_devices * chunks}")
    if sum(counts) != len(model.layers):
        raise ZboptError(f"counts cover {sum(counts)} layers: the model has {len(model.layers)}")
    return counts


def stage_of_layers(counts: Sequence[int]) -> list[int]:
    """The virtual stage of each layer, in model order."""
    return [stage for stage, count in enumerate(counts) for _ in range(count)]


def _interleaved_only(placement: str, chunks: int) -> None:
    """Megatron-LM builds virtual stage i on rank i mod p (the interleaved order is fixed in
    PipelineParallelLayerLayout); with one chunk per device every placement is that order."""
    if placement != "loop" and chunks > 1:
        raise ZboptError(f"placement {placement!r}: Megatron-LM's pipeline layout puts virtual stage i on rank "
                         "i mod p (interleaved) and has no V or bidirectional order; use placement 'loop', or "
                         "torchtitan_modules for V")


# ------------------------------------------------------------------------------ Megatron-LM
def megatron_symbols(model: Model) -> list[str]:
    """Each layer's layout symbol, "" for an end layer after the first (Megatron's one 'L' is the
    final norm, the output layer and the loss together), after Megatron's own checks
    (`validate_layer_layout`): the embedding once and first, the 'L' layers last, no decoder after an MTP."""
    kinds = layer_kinds(model)
    labels = model.labels
    if kinds[0] != "embedding" or kinds.count("embedding") > 1:
        culprit = labels[0] if kinds[0] != "embedding" else labels[kinds.index("embedding", 1)]
        raise ZboptError(f"model layer {culprit!r}: Megatron-LM's layout needs one embedding, the model's first layer")
    ends = len(kinds)
    while ends > 1 and kinds[ends - 1] in END_KINDS:
        ends -= 1
    if ends == len(kinds):
        raise ZboptError(f"model layer {labels[-1]!r}: Megatron-LM's layout needs the loss (an lm_head, output or "
                         "loss layer) last")
    stray = next((i for i in range(ends) if kinds[i] in END_KINDS), None)
    if stray is not None:
        raise ZboptError(f"model layer {labels[stray]!r}: Megatron-LM's 'L' (norm, output layer, loss) comes after "
                         "every other layer")
    if "mtp" in kinds and "decoder" in kinds[kinds.index("mtp"):]:
        raise ZboptError(f"model layer {labels[kinds.index('mtp')]!r}: Megatron-LM puts MTP layers after every decoder")
    return [MEGATRON_SYMBOL[kind] for kind in kinds[:ends]] + ["L"] + [""] * (len(kinds) - ends - 1)


def _megatron_stages(model: Model, counts: list[int], num_devices: int) -> list[str]:
    """Each virtual stage's symbols, after the checks a split must pass: the 'L' layers on one
    stage, each MTP layer on its rank's last chunk (Megatron's `validate_layer_layout`)."""
    symbols = megatron_symbols(model)
    stages = stage_of_layers(counts)
    head = symbols.index("L")
    if len({stages[i] for i in range(head, len(symbols))}) > 1:
        raise ZboptError(f"counts put {model.labels[head]!r} and {model.labels[-1]!r} on different stages: "
                         "Megatron-LM's 'L' builds them together")
    last_chunk = len(counts) // num_devices - 1
    for index, symbol in enumerate(symbols):
        if symbol == "m" and stages[index] // num_devices != last_chunk:
            raise ZboptError(f"counts put {model.labels[index]!r} on virtual stage {stages[index]}: Megatron-LM "
                             "builds an MTP layer only in its rank's last chunk")
    texts = [""] * len(counts)
    for index, symbol in enumerate(symbols):
        texts[stages[index]] += symbol
    return texts


def _short_stage(symbols: str) -> str:
    """A stage's symbols with runs of three or more as 'x*n', as Megatron's docs write them ("Et*3")."""
    runs = [(symbol, len(list(run))) for symbol, run in groupby(symbols)]
    return "".join(f"{symbol}*{n}" if n >= 3 else symbol * n for symbol, n in runs)


def _join_stages(texts: list[str]) -> str:
    """Stages joined by '|', a run of equal stages as "(S|)*n," (the comma cosmetic, as in the docs'
    "Et*3|(tt|)*29,m|L"); a run at the end keeps its last stage outside, as no '|' may trail."""
    runs = [(text, len(list(run))) for text, run in groupby(texts)]
    out = []
    for index, (text, n) in enumerate(runs):
        last = index == len(runs) - 1
        if n == 1:
            out.append(text if last else text + "|")
        elif not last:
            out.append(f"({text}|)*{n},")
        else:
            out.append(f"({text}|)*{n - 1},{text}" if n > 2 else f"{text}|{text}")
    return "".join(out)


def megatron_layout(model: Model, counts: Sequence[int], num_devices: int, chunks: int = 1,
                    placement: str = "loop") -> str:
    """The split as Megatron-LM's `--pipeline-model-parallel-layout` string (stages in the order
    chunk * p + rank), with `--pipeline-model-parallel-size num_devices`; `megatron_counts` reads it back."""
    counts = check_split(model, counts, num_devices, chunks, placement)
    _interleaved_only(placement, chunks)
    return _join_stages([_short_stage(text) for text in _megatron_stages(model, counts, num_devices)])


def parse_megatron_layout(text: str) -> list[str]:
    """Each virtual stage's symbols (e.g. "Ettt"), in the layout's order, as Megatron-LM's
    `parse_str_to_list` reads the string: commas dropped, "(...)*n" then "x*n" unrolled (no nesting),
    split at '|'; any other character is refused with its stage."""
    if not isinstance(text, str):
        raise ZboptError(f"Megatron layout = {shorten(text)}: expected a string such as 'Et*3|(tt|)*29,m|L'")
    produced = 0

    def unroll(match: re.Match) -> str:
        nonlocal produced
        produced += len(match.group(1)) * (int(match.group(2)) if len(match.group(2)) < 10 else MAX_EXPANDED + 1)
        if produced > MAX_EXPANDED:
            raise ZboptError(f"Megatron layout {clip(text)}: expands to more than {MAX_EXPANDED} symbols")
        return match.group(1) * int(match.group(2))

    flat = re.sub(r"\(([^)]+)\)\*(\d+)", unroll, text.replace(",", ""))
    produced = 0
    flat = re.sub(r"(.)\*(\d+)", unroll, flat)
    stages = flat.split("|")
    for index, stage in enumerate(stages):
        bad = next((char for char in stage if char not in "EtmL"), None)
        if bad is not None:
            raise ZboptError(f"Megatron layout {clip(text)}: stage {index} holds {bad!r}, not a layer symbol "
                             f"({SYMBOL_NAMES})")
    return stages


def megatron_counts(model: Model, text: str, num_devices: int | None = None) -> list[int]:
    """The split a Megatron-LM layout string describes for `model` (the inverse of `megatron_layout`):
    each stage's symbols matched against the model's layers in order."""
    stages = parse_megatron_layout(text)
    if num_devices is not None and len(stages) % num_devices:
        raise ZboptError(f"Megatron layout {clip(text)}: {len(stages)} stages do not divide among "
                         f"{num_devices} ranks")
    symbols, labels = megatron_symbols(model), model.labels
    counts, position = [], 0
    for index, stage in enumerate(stages):
        start = position
        for symbol in stage:
            if position == len(symbols) or symbols[position] != symbol:
                found = repr(labels[position]) if position < len(symbols) else "no layer left"
                raise ZboptError(f"Megatron layout {clip(text)}: stage {index} has {symbol!r} where the model has "
                                 f"{found} ({SYMBOL_NAMES})")
            position += 1
            while position < len(symbols) and symbols[position] == "":
                position += 1
        counts.append(position - start)
    if position < len(symbols):
        raise ZboptError(f"Megatron layout {clip(text)}: ends before the model's {labels[position]!r}")
    return counts


def megatron_first_last(model: Model, counts: Sequence[int], num_devices: int, chunks: int = 1,
                        placement: str = "loop") -> dict | None:
    """{"decoder_first_pipeline_num_layers": F, "decoder_last_pipeline_num_layers": L} when Megatron-LM's
    uneven split gives exactly this split, else None (then only the layout string describes it).

    The split has that shape when the embedding sits on stage 0, the 'L' and MTP layers on the last
    stage, every chunk holds the same decoder counts, and the ranks between the first and last hold
    equal ones, more than none (Megatron refuses empty middle ranks). F and L count decoder layers
    on rank 0 and rank p-1 summed over their chunks (each chunk then holds F/v and L/v).
    """
    counts = check_split(model, counts, num_devices, chunks, placement)
    _interleaved_only(placement, chunks)
    symbols, stages = megatron_symbols(model), stage_of_layers(counts)
    last = len(counts) - 1
    if num_devices == 1 or stages[0] != 0 or any(stages[i] != last for i, s in enumerate(symbols) if s not in "Et"):
        return None
    decoders = [0] * len(counts)
    for index, symbol in enumerate(symbols):
        decoders[stages[index]] += symbol == "t"
    rows = [decoders[chunk * num_devices:(chunk + 1) * num_devices] for chunk in range(chunks)]
    firsts, lasts = {row[0] for row in rows}, {row[-1] for row in rows}
    middles = {count for row in rows for count in row[1:-1]}
    if len(firsts) > 1 or len(lasts) > 1 or len(middles) > 1 or 0 in firsts | lasts | middles:
        return None
    return {FIRST_KEY: firsts.pop() * chunks, LAST_KEY: lasts.pop() * chunks}


# ------------------------------------------------------------------------------ torchtitan
def torchtitan_names(model: Model) -> list[tuple[str, ...]]:
    """Each layer's module names in torchtitan's LLMs: the embedding "tok_embeddings", the i-th
    decoder "layers.<i>", a norm layer "norm", the head "output" (with "norm" when the model has no
    norm layer of its own: zbopt's lm_head is then the final norm and the output projection), the
    loss none (torchtitan computes it after the last stage's output). A model whose layers are
    named by their modules' FQNs (what `profile-model` writes: "layers.0", "0"), each once and some
    a module path (dotted, or an index), keeps its names: they are its own modules."""
    names = [layer.name for layer in model.layers]
    if len(set(names)) == len(names) and all(FQN.fullmatch(name) for name in names) and \
            any("." in name or name.isdigit() for name in names):  # module paths, not roles
        return [(name,) for name in names]
    kinds, labels = layer_kinds(model), model.labels
    has_norm, decoders, names, seen = "norm" in kinds, 0, [], set()
    for index, kind in enumerate(kinds):
        if kind == "mtp":
            raise ZboptError(f"model layer {labels[index]!r}: torchtitan's LLM split names no MTP module "
                             "(tok_embeddings, layers.<i>, norm, output)")
        if kind == "loss" and index != len(kinds) - 1:
            raise ZboptError(f"model layer {labels[index]!r}: torchtitan computes the loss last, after every module")
        if kind == "decoder":
            decoders += 1
        layer = {"embedding": ("tok_embeddings",), "decoder": (f"layers.{decoders - 1}",), "norm": ("norm",),
                 "head": ("output",) if has_norm else ("norm", "output"), "loss": ()}[kind]
        if seen & set(layer):
            raise ZboptError(f"model layer {labels[index]!r}: a second {kind} (torchtitan's {layer[0]!r} is one "
                             "module)")
        seen |= set(layer)
        names.append(layer)
    return names


def torchtitan_modules(model: Model, counts: Sequence[int], num_devices: int, chunks: int = 1,
                       placement: str = "loop") -> list[list[str]]:
    """The split as torchtitan's `module_fqns_per_model_part`: one list of module names per model
    chunk, in stage order (torchtitan's schedule places stage i on rank i mod p, or, for its V
    schedules ZBVZeroBubble and DualPipeV, stages i and 2p-1-i on rank i); `torchtitan_counts` reads it back."""
    counts = check_split(model, counts, num_devices, chunks, placement)
    if placement == "bidirectional" or (placement == "v" and chunks not in (1, 2)):
        raise ZboptError(f"placement {placement!r} with {chunks} chunks: torchtitan places stages in loop order, "
                         "or V with exactly two stages per rank (pipeline_module_split)")
    names, stages = torchtitan_names(model), stage_of_layers(counts)
    loss = [index for index, layer in enumerate(names) if not layer]
    if loss and stages[loss[0]] != len(counts) - 1:
        raise ZboptError(f"counts put {model.labels[loss[0]]!r} on virtual stage {stages[loss[0]]}: torchtitan "
                         "computes the loss on the last stage")
    modules: list[list[str]] = [[] for _ in counts]
    for index, layer in enumerate(names):
        modules[stages[index]].extend(layer)
    return modules


def _chunk_of_names(modules: object, known: set[str]) -> dict[str, int]:
    """Each module name's model chunk, after checking the lists: names of this model, each once."""
    if isinstance(modules, (str, bytes)) or not isinstance(modules, Sequence) or not modules:
        raise ZboptError(f"modules = {shorten(modules)}: expected a list of module-name lists, one per model chunk")
    chunk_of: dict[str, int] = {}
    for chunk, names in enumerate(modules):
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
            raise ZboptError(f"modules[{chunk}] = {shorten(names)}: expected a list of module names")
        for name in names:
            if name not in known:
                raise ZboptError(f"modules[{chunk}]: {shorten(name)} is no module of this model "
                                 "(tok_embeddings, layers.<i>, norm, output)")
            if name in chunk_of:
                raise ZboptError(f"modules[{chunk}]: {name!r} is in model chunk {chunk_of[name]} already")
            chunk_of[name] = chunk
    return chunk_of


def torchtitan_counts(model: Model, modules: Sequence[Sequence[str]]) -> list[int]:
    """The split a torchtitan `module_fqns_per_model_part` describes for `model` (the inverse of
    `torchtitan_modules`). A module in no chunk is refused: torchtitan would silently drop it."""
    names = torchtitan_names(model)
    chunk_of = _chunk_of_names(modules, {name for layer in names for name in layer})
    counts, previous = [0] * len(modules), 0
    for index, layer in enumerate(names):
        label = model.labels[index]
        missing = [name for name in layer if name not in chunk_of]
        if missing:
            raise ZboptError(f"modules: {missing[0]!r} ({label}) is in no model chunk; torchtitan would drop it")
        chunks = {chunk_of[name] for name in layer} or {len(modules) - 1}
        if len(chunks) > 1:
            raise ZboptError(f"modules: {' and '.join(layer)} ({label}) are in different model chunks; zbopt's "
                             f"layer {label!r} is one")
        chunk = chunks.pop()
        if chunk < previous:
            raise ZboptError(f"modules: {label!r} is in model chunk {chunk}, after layers in chunk {previous}: a chunk "
                             "holds consecutive layers")
        counts[chunk] += 1
        previous = chunk
    return counts
