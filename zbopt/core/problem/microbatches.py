"""Microbatches that differ: what each one costs on each virtual stage.

Packed documents, long contexts and RL rollouts give microbatches of very different token counts,
so their F, B, W times and activations differ several-fold. A `Problem` says so in one of two ways:

- each microbatch's tokens (`microbatch_tokens`) with a cost rule: the per-stage costs are those of
  a microbatch of `reference_tokens` tokens (default: the mean); a microbatch of t tokens costs,
  with tau = t / reference_tokens, F (and R) and B: cost · ((1 - a) · tau + a · tau²), where a is
  the stage's `attention_share` (the part of the time causal attention takes at the reference
  length, which grows with the square of the length: ZB paper, Table 1, the 4bs²h and 8bs²h
  terms); W (matmuls only) and every memory amount and copy (bytes): cost · tau (linear, as with
  flash attention: Korthikanti et al., 2022). A microbatch packed from several documents, each
  attending only to itself, is given as the list of their lengths: tau is their sum over the
  reference, tau² becomes the sum of their squares over the reference's square;
- explicit tables: forward_times, backward_times, weight_times, activation_memory (or recompute_times,
  offload_times, reload_times, e.g. a solver's integer ticks per microbatch) given as rows,
  one per virtual stage, each with one value per microbatch. The Problem then keeps each row's
  mean as the stage's value (what a heuristic that plans by stage reads) and the rows themselves.
  What derives from a tabled key follows it per microbatch: R the forward (times the stage's
  recompute_times / forward_times), the kept part M_W and the checkpoint the activation (times
  the stage's share), a copy's time the activation's bytes.

With `iterations`, microbatch j of every iteration costs as microbatch j % m. The values per
microbatch (`per_microbatch`) are what the op table, and so the simulator, the DAG and the
solvers, read; microbatches of equal values form a class (`classes`), the only ones symmetry may
order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zbopt.core.errors import ProblemError
from zbopt.core.problem.checks import is_count, is_number, per_stage
from zbopt.core.problem.slices import Span, check_sequence_tokens, slice_bounds, span_factor, spans, total_tokens
from zbopt.core.tolerance import check_ranges

__all__ = ["EQUAL_MICROBATCHES", "FOLLOWS", "MAX_TOKEN_RATIO", "TABLE_KEYS", "WITH_ATTENTION", "Rows",
           "at_stage_values", "check_spread", "check_tokens", "classes", "every_microbatch_at", "is_table",
           "per_microbatch", "take_tables", "tokens_of"]

TABLE_KEYS = ("forward_times", "backward_times", "weight_times", "recompute_times", "offload_times", "reload_times",
              "activation_memory")
# every per-stage key whose value differs by microbatch, and the tabled key it follows
FOLLOWS = {"forward_times": "forward_times", "backward_times": "backward_times", "weight_times": "weight_times",
           "recompute_times": "forward_times", "activation_memory": "activation_memory",
           "weight_memory": "activation_memory", "checkpoint_memory": "activation_memory",
           "offload_times": "activation_memory", "reload_times": "activation_memory"}
WITH_ATTENTION = ("forward_times", "backward_times", "recompute_times")  # grow with the square of the length
# what makes a Problem's microbatches all cost their stage's value (`Problem.replace(**EQUAL_MICROBATCHES)`)
# (sequence slices stay: they are dependencies, not costs; `Problem.uniform_relaxation` drops them too)
EQUAL_MICROBATCHES = {"microbatch_tokens": None, "attention_share": None, "reference_tokens": None,
                      "microbatch_tables": None}

Rows = tuple[tuple[float, ...], ...]  # per virtual stage, per microbatch of one iteration


def is_table(value: object) -> bool:
    """Whether a per-stage value was given as rows (a list whose items are lists)."""
    return isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0 and \
        all(isinstance(row, Sequence) and not isinstance(row, str) for row in value)


def take_tables(given: dict[str, object], stored: object, stages: int, microbatches: int) -> tuple[dict, object]:
    """(given with each table replaced by its rows' means, the tables as stored ((key, rows), ...)
    or None). `stored` holds the tables of a Problem being copied (`Problem.replace`); a key given
    as rows again replaces its stored table."""
    tables = dict(stored or ())
    for key in tables:
        if key not in TABLE_KEYS:
            raise ProblemError("microbatch_tables", key, f"not a key that takes rows ({', '.join(TABLE_KEYS)} do)")
    values = dict(given)
    for key in TABLE_KEYS:
        if is_table(values.get(key)):
            tables[key] = _rows(key, values[key], stages, microbatches, positive=key != "activation_memory")
        elif key in tables:
            tables[key] = _rows(key, tables[key], stages, microbatches, positive=key != "activation_memory")
        if key in tables:
            values[key] = tuple(math.fsum(row) / len(row) for row in tables[key])  # exact, in any column order
    return values, tuple((key, tables[key]) for key in TABLE_KEYS if key in tables) or None


def _rows(key: str, value, stages: int, microbatches: int, positive: bool) -> Rows:
    """`value` as one row per virtual stage of one number per microbatch, each > 0 (a time) or
    >= 0 (memory)."""
    if len(value) != stages:
        raise ProblemError(key, value, f"expected one row per virtual stage ({stages}), got {len(value)}")
    rows = []
    for stage, row in enumerate(value):
        if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != microbatches:
            count = len(row) if isinstance(row, Sequence) else "not a list"
            raise ProblemError(key, value, f"row {stage}: expected one value per microbatch ({microbatches}), "
                                           f"got {count}")
        if not all(is_number(item) and (item > 0 if positive else item >= 0) for item in row):
            raise ProblemError(key, value, f"row {stage}: every value must be {'> 0' if positive else '>= 0'}")
        rows.append(tuple(float(item) for item in row))
    return tuple(rows)


MAX_TOKEN_RATIO = 1e9  # a microbatch's tokens over reference_tokens: beyond, its costs (squared) leave the range


def check_tokens(tokens, attention_share, reference_tokens, stages: int, microbatches: int,
                 tables, slices: int = 1) -> dict:
    """microbatch_tokens (positive integers, one per microbatch, or per sequence of `slices`
    microbatches), attention_share (per stage, in [0, 1], default 0) and reference_tokens (> 0,
    default the mean), or Nones without tokens (attention_share may come with slices alone)."""
    if tokens is None:
        if reference_tokens is not None:
            raise ProblemError("reference_tokens", reference_tokens, "needs microbatch_tokens")
        if slices == 1 or tables:
            if attention_share is not None:
                raise ProblemError("attention_share", attention_share, "needs microbatch_tokens" +
                                   ("" if tables else " or sequence_slices"))
            return {}
        return {"attention_share": _shares(attention_share, stages)}
    if tables:
        raise ProblemError("microbatch_tokens", tokens, f"give microbatch_tokens or rows per microbatch "
                                                        f"({tables[0][0]}), not both")
    sequences, what = microbatches // slices, "microbatch" if slices == 1 else "sequence"
    if not isinstance(tokens, Sequence) or isinstance(tokens, str) or len(tokens) != sequences:
        count = f", got {len(tokens)}" if isinstance(tokens, Sequence) else ""
        raise ProblemError("microbatch_tokens", tokens, f"expected one token count per {what} ({sequences}){count}")
    documents = []
    for index, count in enumerate(tokens):
        packed = isinstance(count, Sequence) and not isinstance(count, str)
        lengths = list(count) if packed else [count]
        if not lengths or not all(is_count(length) for length in lengths):
            raise ProblemError("microbatch_tokens", tokens, f"{what} {index}: expected a positive whole "
                                                            f"number of tokens (or a list, one per packed "
                                                            f"document), got {count!r}")
        documents.append(tuple(lengths) if packed else count)
    check_sequence_tokens(documents, slices)
    share = _shares(attention_share, stages)
    if reference_tokens is not None and (not is_number(reference_tokens) or reference_tokens <= 0):
        raise ProblemError("reference_tokens", reference_tokens, "expected a number > 0")
    largest = max(total_tokens(count) for count in documents)
    if reference_tokens is not None and largest > MAX_TOKEN_RATIO * reference_tokens:
        raise ProblemError("reference_tokens", reference_tokens, f"the largest microbatch's {largest} tokens are "
                                                                 f"more than {MAX_TOKEN_RATIO:g} times it")
    # None stays None (the mean, `slices.spans`): a copy with other tokens takes their mean
    reference = None if reference_tokens is None else float(reference_tokens)
    return {"microbatch_tokens": tuple(documents), "attention_share": share, "reference_tokens": reference}


def tokens_of(problem, microbatch: int) -> int | None:
    """Microbatch `microbatch`'s tokens (of any iteration): its count, its packed documents'
    together, or with sequence slices its slice's share of its sequence; None without tokens."""
    if problem.microbatch_tokens is None:
        return None
    k, place = problem.sequence_slices, microbatch % problem.num_microbatches
    bounds = slice_bounds(total_tokens(problem.microbatch_tokens[place // k]), k)
    return bounds[place % k + 1] - bounds[place % k]


def _shares(attention_share, stages: int) -> tuple[float, ...]:
    """attention_share per stage, each in [0, 1] (default 0)."""
    share = per_stage("attention_share", 0.0 if attention_share is None else attention_share, stages,
                      positive=False)
    if any(value > 1 for value in share):
        raise ProblemError("attention_share", attention_share, "expected values in [0, 1] (a share of the time)")
    return share


def per_microbatch(problem) -> dict[str, Rows] | None:
    """Per varying key the Problem has (`FOLLOWS`), its value per virtual stage and microbatch of
    one iteration; None when the problem gives no tokens and no tables (every microbatch costs
    its stage's value)."""
    tables = dict(problem.microbatch_tables or ())
    covered = None if tables else spans(problem)
    if covered is None and not tables:
        return None
    values = {}
    for key, source in FOLLOWS.items():
        stage_values = getattr(problem, key)
        if stage_values is None:
            continue
        if key in tables:
            values[key] = tables[key]
        elif covered is not None:
            values[key] = tuple(tuple(value * _token_factor(problem, key, stage, span) for span in covered)
                                for stage, value in enumerate(stage_values))
        elif source in tables:
            means = getattr(problem, source)
            values[key] = tuple(tuple(_following(value, mean, own) for own in row)
                                for value, mean, row in zip(stage_values, means, tables[source], strict=True))
        else:
            values[key] = tuple((value,) * problem.num_microbatches for value in stage_values)
    return values


def _following(value: float, mean: float, own: float) -> float:
    """A microbatch's value of a key that follows another: the stage's value in the ratio of the
    microbatch's own value of the other key (`own`) to that key's mean (exactly `own` for the key itself)."""
    if value == mean:
        return own
    return value * own / mean if mean > 0 else value


def _token_factor(problem, key: str, stage: int, covered: tuple[Span, ...]) -> float:
    """What a microbatch costs relative to one of reference_tokens tokens (module docstring): the
    parts of sequences it `covered` (`slices.spans`: one whole sequence, a slice of one, or each
    packed document), their tokens for the linear keys, `slices.span_factor` for attention."""
    if key not in WITH_ATTENTION:
        return sum(end - start for start, end in covered)
    return sum(span_factor(span, problem.attention_share[stage]) for span in covered)


def classes(values: dict[str, Rows] | None, microbatches: int, slices: int = 1) -> tuple[int, ...]:
    """Per microbatch of one iteration, the first microbatch whose values equal its own on every
    key and stage: microbatches of one class are interchangeable. Slices never are (each is tied
    to its sequence's others): each is a class of its own."""
    if slices > 1:
        return tuple(range(microbatches))
    if values is None:
        return (0,) * microbatches
    first: dict[tuple, int] = {}
    columns = [tuple(row[j] for rows in values.values() for row in rows) for j in range(microbatches)]
    return tuple(first.setdefault(column, j) for j, column in enumerate(columns))


def at_stage_values(problem) -> bool:
    """Whether every microbatch costs exactly its stage's value on every key (or none differs)."""
    values = problem.per_microbatch
    return values is None or all(value == stage for key, rows in values.items()
                                 for stage, row in zip(getattr(problem, key), rows, strict=True) for value in row)


def every_microbatch_at(problem, pick, **changes):
    """`problem` with every microbatch costing, per key and stage, `pick` (min, max) of what they
    cost: the one Problem the relaxation (`Problem.uniform_relaxation`, min), the range check and
    the promised peaks (max: each microbatch at most that large) read where microbatches differ."""
    values = {key: tuple(pick(row) for row in rows) for key, rows in problem.per_microbatch.items()}
    return problem.replace(**values, **EQUAL_MICROBATCHES, **changes)


def check_spread(problem) -> None:
    """Where microbatches differ, each extreme in range (`tolerance.check_ranges`: a row's largest
    and least values, not its mean, are what may be out of range; the relaxation the bounds solve
    must be a problem too), and the two together: a spread too wide is named as the culprit."""
    least = every_microbatch_at(problem, min, sequence_slices=1, memory_limit=None)
    check_ranges(least)
    most = every_microbatch_at(problem, max, sequence_slices=1, memory_limit=None)
    check_ranges(most)
    try:
        check_ranges(most, least)
    except ProblemError as error:
        tokens = problem.microbatch_tokens is not None
        raise ProblemError("microbatch_tokens" if tokens else error.key,
                           problem.microbatch_tokens if tokens else error.value,
                           f"the microbatches differ too much: {error.reason}") from None
