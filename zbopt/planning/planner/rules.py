"""Named split rules, the baselines a plan compares with the joint optimum.

- `even`: Megatron-LM's default. The repeated layers (the model's most repeated name) in equal
  parts, the layers before them (embedding) on the first virtual stage, those after them (LM
  head, loss) on the last; where p·v does not divide the repeated layers, the first stages take
  one more each.
- `first-last`: Megatron-LM's `decoder_first_pipeline_num_layers` and
  `decoder_last_pipeline_num_layers`: the first and last devices (pipeline ranks) take their own
  counts of repeated layers, each of their chunks an equal part of it, the other devices equal
  parts (Megatron's `get_num_layers_to_build`); the counts with the least longest stage time.
- `stage-balanced`: the contiguous split with the least longest stage time, as torch's
  `auto_partition` balances stages (a dynamic program over split prefixes).
- `device-balanced`: the split with the least longest device time (the sum of its stages'
  times; then the least longest stage), every stage with some F, B and W time: with v = 2 a device
  holds two stages apart, so no prefix DP; a small CP-SAT model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from zbopt.core import interrupt
from zbopt.core.errors import ZboptError
from zbopt.planning.model import Layer, Model
from zbopt.planning.planner.split import Pipeline, Split, stage_layers

__all__ = ["RULES", "body", "device_balanced_split", "even_split", "first_last_split", "layer_time", "split_by_rule",
           "stage_balanced_split", "stage_times"]

RULES = ("even", "first-last", "stage-balanced", "device-balanced")


def layer_time(layer: Layer) -> float:
    """What a layer costs per microbatch on its device: F + B + W (B is the fused BW without W)."""
    return layer.forward_ms + layer.backward_ms + (layer.weight_ms or 0.0)


def split_by_rule(rule: str, model: Model, pipeline: Pipeline, seconds: float = 10.0) -> Split:
    """The split `rule` (one of RULES) gives (`device-balanced` searches up to `seconds`); a
    ZboptError in one line when the model has fewer repeated layers than the rule needs."""
    rules: dict[str, Callable[[Model, Pipeline], Split]] = {
        "even": even_split, "first-last": first_last_split, "stage-balanced": stage_balanced_split,
        "device-balanced": lambda model, pipeline: device_balanced_split(model, pipeline, seconds)}
    if rule not in rules:
        raise ZboptError(f"split rule {rule!r} is unknown (known: {', '.join(RULES)})")
    if len(model.layers) < pipeline.num_stages:
        raise ZboptError(f"model: {len(model.layers)} layers for {pipeline.num_stages} virtual stages; a stage "
                         "needs at least one layer")
    return rules[rule](model, pipeline)


def body(model: Model) -> tuple[int, int]:
    """(first, end) of the repeated layers: from the first to the last layer named as the model's
    most repeated name (ties: the first such name); the ends are the layers outside. A model whose
    names all differ (a per-layer profile) is all body."""
    counts: dict[str, int] = {}
    for name, repeat in model.groups:
        counts[name] = counts.get(name, 0) + repeat
    name = max(counts, key=counts.get)
    if counts[name] == 1:
        return 0, len(model.layers)
    indices = [index for index, layer in enumerate(model.layers) if layer.name == name]
    return indices[0], indices[-1] + 1


def _with_ends(model: Model, parts: list[int], first: int, end: int) -> Split:
    """The repeated layers' counts per stage (the body, layers first..end - 1: `body`), the leading
    ends added to the first stage and the trailing ends to the last."""
    parts = list(parts)
    parts[0] += first
    parts[-1] += len(model.layers) - end
    return tuple(parts)


def even_split(model: Model, pipeline: Pipeline) -> Split:
    first, end = body(model)
    stages, repeated = pipeline.num_stages, end - first
    if repeated < stages:
        raise ZboptError(f"split rule 'even': {repeated} repeated layers for {stages} virtual stages")
    share, extra = divmod(repeated, stages)
    return _with_ends(model, [share + (stage < extra) for stage in range(stages)], first, end)


def first_last_split(model: Model, pipeline: Pipeline) -> Split:
    first, end = body(model)
    repeated, p, v = end - first, pipeline.num_devices, pipeline.chunks_per_device
    if p < 3:
        return stage_balanced_split(model, pipeline)  # no middle devices: the two counts are the split
    candidates = []
    for head in range(v, repeated, v):  # each of the first device's v chunks takes head / v
        interrupt.check()  # quadratic in the layers: at 10^5 a deadline or Ctrl-C stops it
        for tail in range(v, repeated - head, v):
            middle, left = divmod(repeated - head - tail, (p - 2) * v)
            if middle >= 1 and not left:
                share = {0: head // v, p - 1: tail // v}
                parts = [share.get(pipeline.device_of(stage), middle) for stage in range(pipeline.num_stages)]
                candidates.append(_with_ends(model, parts, first, end))
    if not candidates:
        raise ZboptError(f"split rule 'first-last': {repeated} repeated layers do not split as Megatron-LM's "
                         f"first and last counts over {p} devices x {v} chunks")
    return min(candidates, key=lambda split: (_longest_stage(model, split), split))


def stage_times(model: Model, split: Split) -> list[float]:
    """Each virtual stage's F + B + W per microbatch (ms)."""
    return [sum(layer_time(model.layers[index]) for index in layers) for layers in stage_layers(split)]


def _longest_stage(model: Model, split: Split) -> float:
    return max(stage_times(model, split))


def stage_balanced_split(model: Model, pipeline: Pipeline) -> Split:
    """The linear-partition DP: least longest stage over contiguous splits (ties: the earliest
    cuts, as the DP's order finds them)."""
    prefix = [0.0]
    for layer in model.layers:
        prefix.append(prefix[-1] + layer_time(layer))
    count = len(model.layers)

    @cache
    def best(stage: int, start: int) -> tuple[float, Split]:
        """Least longest stage for layers start.. on stages stage..S-1."""
        stages_left = pipeline.num_stages - stage
        if stages_left == 1:
            return prefix[count] - prefix[start], (count - start,)
        options = []
        interrupt.check()  # S x n^2 steps: at 10^5 layers a deadline or Ctrl-C stops it
        for end in range(start + 1, count - stages_left + 2):
            rest, split = best(stage + 1, end)
            options.append((max(prefix[end] - prefix[start], rest), (end - start, *split)))
        return min(options)

    return best(0, 0)[1]


def device_balanced_split(model: Model, pipeline: Pipeline, seconds: float = 10.0) -> Split:
    """Least longest device time, then least longest stage, every stage with some F, B and W time:
    CP-SAT over the stage boundaries (times in microseconds, each stage's time read off the
    prefix sums by an element constraint)."""
    from zbopt.planning.planner.split_model import BoundaryModel

    boundaries = BoundaryModel(model, pipeline)
    cp, stages = boundaries.model, range(pipeline.num_stages)
    fused = any(layer.fused for layer in model.layers)
    kinds = ("forward", "backward") if fused else ("forward", "backward", "weight")
    for stage in stages:
        for kind in kinds:
            cp.Add(boundaries.stage_sum(f"timed {kind}", stage) >= 1)
    work = [sum(boundaries.stage_sum("time", stage) for stage in pipeline.stages_on(device))
            for device in range(pipeline.num_devices)]
    longest = cp.NewIntVar(0, boundaries.horizon, "longest")
    longest_stage = cp.NewIntVar(0, boundaries.horizon, "longest stage")
    cp.AddMaxEquality(longest, work)
    cp.AddMaxEquality(longest_stage, [boundaries.stage_sum("time", stage) for stage in stages])
    cp.Minimize(longest * (boundaries.prefix["time"][-1] + 1) + longest_stage)
    split = boundaries.solve(seconds)
    if split is None:
        raise ZboptError(f"split rule 'device-balanced': no split found in {seconds:.3g} s")
    return split
