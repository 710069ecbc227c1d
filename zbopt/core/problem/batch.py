"""The batch: how many microbatches a step has and what each holds.

The count from a global batch, as a training config states it: m = global_batch_size /
(micro_batch_size · data_parallel), Megatron-LM's rule (its num_microbatches calculator), so a
user need not divide by hand; or the microbatches packed from sequence lengths under a token
budget, the count and each one's documents.

Packing: the data loader's way, first-fit decreasing, and a balanced packing chosen by CP-SAT.
Packed documents attend only to themselves (document masking), so a microbatch's work is the sum
over its documents of a linear part and an attention part growing with the square of each
document's length (`zbopt.core.problem.microbatches`): the total over the batch is the same however it
is packed, and packing decides only how evenly it falls on the microbatches. An uneven batch costs
a pipeline twice: its longest microbatches stretch the steady state, and long ones at either end
stretch the fill and the drain. Balancing the microbatches' work is WLB-LLM's first remedy (Wang
et al., arXiv 2503.17924, Section 4: variable-length packing that balances workload). Each rule
returns the packing as lists of sequence indices, one list per microbatch; the lengths of a
microbatch's documents, in that order, are what `Problem(microbatch_tokens=...)` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from zbopt.core import interrupt
from zbopt.core.errors import ZboptError, shorten
from zbopt.core.problem.slices import span_factor

__all__ = ["BATCH_FLAGS", "BATCH_HELP", "COUNT_KEYS", "MAX_BALANCED_CHOICES", "PACKING_KEYS", "RULES", "WORK_SCALE",
           "batch_microbatches", "check_lengths", "document_work", "pack", "packed_microbatches", "packed_tokens"]

# config key -> its flag; micro_batch_size and data_parallel default to 1
BATCH_FLAGS = {"global_batch_size": "--global-batch", "micro_batch_size": "--micro-batch-size",
               "data_parallel": "--data-parallel"}
BATCH_HELP = {"global_batch_size": "samples per optimizer step: m = global batch / (micro-batch size × data "
                                   "parallel), instead of -b",
              "micro_batch_size": "samples per microbatch, with --global-batch (default 1)",
              "data_parallel": "data-parallel replicas, with --global-batch (default 1)"}
COUNT_KEYS = ("num_microbatches", "num_batches")  # the keys that give m directly


def batch_microbatches(values: dict, name: Callable[[str], str]) -> tuple[int, str] | None:
    """(m, "global_batch_size") from the batch keys in `values`, or None when none is given.

    `name(key)` is how a message names a key (its flag, or the key in its file). Raises ZboptError
    naming the keys for a value that is not a positive integer, a batch key without
    global_batch_size, a global batch that micro_batch_size · data_parallel does not divide, and
    a count given both ways.
    """
    given = {key: values[key] for key in BATCH_FLAGS if key in values}
    if not given:
        return None
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ZboptError(f"{name(key)}: {shorten(value)} is not a positive whole number")
    if "global_batch_size" not in given:
        raise ZboptError(f"{' and '.join(map(name, given))}: give the global batch too (global_batch_size, "
                         f"{BATCH_FLAGS['global_batch_size']}), which they divide into microbatches")
    counted = [key for key in COUNT_KEYS if key in values]
    if counted:
        raise ZboptError(f"{name('global_batch_size')} and {name(counted[0])} both give the number of "
                         "microbatches; give one")
    micro, parallel = given.get("micro_batch_size", 1), given.get("data_parallel", 1)
    if given["global_batch_size"] % (micro * parallel):
        factors = [name(key) for key in ("micro_batch_size", "data_parallel") if key in given]
        raise ZboptError(f"{name('global_batch_size')}: {given['global_batch_size']} is not a multiple of "
                         f"micro_batch_size × data_parallel = {micro} × {parallel}"
                         + (f" (from {' and '.join(factors)})" if factors else ""))
    return given["global_batch_size"] // (micro * parallel), "global_batch_size"


# config keys that pack sequences into microbatches (config files only: lists make poor flags)
PACKING_KEYS = ("sequence_lengths", "token_budget", "packing")


def packed_microbatches(values: dict, name: Callable[[str], str]) -> tuple[int, list[list[int]]] | None:
    """(m, each microbatch's document lengths) packed from `values`' sequence_lengths under its
    token_budget by its packing rule (default "loader": the data loader's own way, nothing
    reordered; "balanced" weighs attention by the config's attention_share where it is one
    number), or None when no packing key is given. Raises ZboptError naming the key for a
    packing key without sequence_lengths and token_budget, or microbatches given another way too."""
    given = {key: values[key] for key in PACKING_KEYS if key in values}
    if not given:
        return None
    missing = [key for key in ("sequence_lengths", "token_budget") if key not in given]
    if missing:
        raise ZboptError(f"{' and '.join(map(name, given))}: give {' and '.join(missing)} too, which packing needs")
    taken = [key for key in (*COUNT_KEYS, "microbatch_tokens", *BATCH_FLAGS) if key in values]
    if taken:
        raise ZboptError(f"{name('sequence_lengths')} and {name(taken[0])} both give the microbatches; give one")
    lengths = given["sequence_lengths"]
    if not isinstance(lengths, list):
        raise ZboptError(f"{name('sequence_lengths')}: {shorten(lengths)}: expected a list of token counts")
    share = values.get("attention_share", 0.0)
    packing = pack(lengths, given["token_budget"], given.get("packing", "loader"),
                   share if isinstance(share, (int, float)) and not isinstance(share, bool) else 0.0)
    return len(packing), packed_tokens(lengths, packing)


RULES = ("loader", "first-fit-decreasing", "balanced")
MAX_BALANCED_CHOICES = 100_000  # sequences x microbatches: the balanced packing's Booleans (measured in the note)
WORK_SCALE = 1000  # CP-SAT takes integers: each document's work in thousandths of the largest's


def check_lengths(lengths: Sequence[int], budget: int) -> None:
    """One ZboptError line naming the first bad value: a length that is not a positive whole
    number, or above the budget (no microbatch could hold it)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ZboptError(f"token_budget = {budget!r}: expected a positive whole number of tokens")
    if not lengths:
        raise ZboptError("sequence_lengths: expected at least one sequence")
    for index, length in enumerate(lengths):
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ZboptError(f"sequence_lengths: sequence {index} = {length!r}: expected a positive whole number")
        if length > budget:
            raise ZboptError(f"sequence_lengths: sequence {index} has {length} tokens, above token_budget {budget}")


def document_work(length: int, attention_share: float, reference: float) -> float:
    """One document's work relative to a document of `reference` tokens (the tokens rule)."""
    return span_factor((0.0, length / reference), attention_share)


def pack(lengths: Sequence[int], budget: int, rule: str = "first-fit-decreasing", attention_share: float = 0.0,
         microbatches: int | None = None, time_limit: float = 10.0) -> list[list[int]]:
    """The sequences packed into microbatches of at most `budget` tokens by `rule`:

    - "loader": in the loader's order, each microbatch filled until the next sequence does not fit;
    - "first-fit-decreasing": longest first, each into the first microbatch with room;
    - "balanced": into `microbatches` microbatches (default: as many as first-fit decreasing
      needs), the largest microbatch's work (`document_work`) least, by CP-SAT within
      `time_limit` seconds (its best packing then, never worse than first-fit decreasing's).
    """
    check_lengths(lengths, budget)
    if rule == "loader":
        return _next_fit(lengths, budget)
    if rule == "first-fit-decreasing":
        return _first_fit_decreasing(lengths, budget)
    if rule == "balanced":
        return _balanced(lengths, budget, attention_share, microbatches, time_limit)
    raise ZboptError(f"packing rule {rule!r}: unknown (known: {', '.join(RULES)})")


def _next_fit(lengths: Sequence[int], budget: int) -> list[list[int]]:
    packed: list[list[int]] = [[]]
    room = budget
    for index, length in enumerate(lengths):
        if length > room:
            packed.append([])
            room = budget
        packed[-1].append(index)
        room -= length
    return packed


def _first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    packed: list[list[int]] = []
    rooms: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = next((k for k, room in enumerate(rooms) if lengths[index] <= room), None)
        if slot is None:
            packed.append([])
            rooms.append(budget)
            slot = len(packed) - 1
        packed[slot].append(index)
        rooms[slot] -= lengths[index]
    return packed


def _balanced(lengths: Sequence[int], budget: int, attention_share: float, microbatches: int | None,
              time_limit: float) -> list[list[int]]:
    """CP-SAT: each sequence in one microbatch, each microbatch within the budget, the largest
    work least; microbatches ordered by work (they are interchangeable); first-fit decreasing as
    the hint (and the answer where it proves nothing better)."""
    from ortools.sat.python import cp_model

    start = _first_fit_decreasing(lengths, budget)
    count = len(start) if microbatches is None else microbatches
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= len(lengths):
        raise ZboptError(f"microbatches = {count!r}: expected a whole number from 1 to the {len(lengths)} sequences")
    if sum(lengths) > count * budget:
        raise ZboptError(f"microbatches = {count}: {sum(lengths)} tokens do not fit in {count} of {budget}")
    if len(lengths) * count > MAX_BALANCED_CHOICES:
        raise ZboptError(f"packing: balanced: {len(lengths)} sequences into {count} microbatches are "
                         f"{len(lengths) * count:,} choices, more than the {MAX_BALANCED_CHOICES:,} its CP-SAT model "
                         "builds in seconds; use first-fit-decreasing, or pack fewer sequences at a time")
    reference = max(lengths)
    work = [round(WORK_SCALE * document_work(length, attention_share, reference)) for length in lengths]
    model = cp_model.CpModel()
    where = [[model.new_bool_var(f"x{d}_{b}") for b in range(count)] for d in range(len(lengths))]
    loads = [model.new_int_var(0, sum(work), f"load{b}") for b in range(count)]
    for d, row in enumerate(where):
        model.add_exactly_one(row)
        for b, chosen in enumerate(row):
            model.add_hint(chosen, b < len(start) and d in start[b])
    for b in range(count):
        model.add(sum(lengths[d] * where[d][b] for d in range(len(lengths))) <= budget)
        model.add(loads[b] == sum(work[d] * where[d][b] for d in range(len(lengths))))
        if b:
            model.add(loads[b - 1] >= loads[b])
    largest = model.new_int_var(0, sum(work), "largest")
    model.add_max_equality(largest, loads)
    model.minimize(largest)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = 2
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is Python's: it stops the search and the command
    status = interrupt.watched(lambda: solver.solve(model), solver.stop_search)
    if status == cp_model.INFEASIBLE:
        raise ZboptError(f"microbatches = {count}: the sequences fit in no {count} microbatches of {budget} tokens "
                         f"(first-fit decreasing needs {len(start)})")
    if status != cp_model.OPTIMAL and status != cp_model.FEASIBLE:
        if count >= len(start):
            return start
        raise ZboptError(f"microbatches = {count}: no packing into {count} microbatches of {budget} tokens found "
                         f"within {time_limit:g} s")
    return [[d for d in range(len(lengths)) if solver.boolean_value(where[d][b])] for b in range(count)]


def packed_tokens(lengths: Sequence[int], packing: list[list[int]]) -> list[list[int]]:
    """The documents' lengths of each microbatch: what `Problem(microbatch_tokens=...)` takes."""
    return [[lengths[index] for index in microbatch] for microbatch in packing]
