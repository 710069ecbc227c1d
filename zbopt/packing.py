"""Packing sequences into microbatches under a token budget: the data loader's way, first-fit
decreasing, and a balanced packing chosen by CP-SAT.

Packed documents attend only to themselves (document masking), so a microbatch's work is the sum
over its documents of a linear part and an attention part growing with the square of each
document's length (`zbopt.microbatches`): the total over the batch is the same however it is
packed, and packing decides only how evenly it falls on the microbatches. An uneven batch costs a
pipeline twice: its longest microbatches stretch the steady state, and long ones at either end
stretch the fill and the drain. Balancing the microbatches' work is WLB-LLM's first remedy
(Wang et al., arXiv 2503.17924, Section 4: variable-length packing that balances workload).

Each rule returns the packing as lists of sequence indices, one list per microbatch; the lengths
of a microbatch's documents, in that order, are what `Problem(microbatch_tokens=...)` takes.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbopt.errors import ZboptError
from zbopt.slices import span_factor

RULES = ("loader", "first-fit-decreasing", "balanced")
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
    status = solver.solve(model)
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


def order_makespans(problem, name: str) -> dict[str, float | None]:
    """Per order rule (`zbopt.microbatch_order.ORDER_RULES`), schedule `name`'s makespan on
    `problem` with its microbatches in that order; None where it does not apply or overruns the
    memory limit."""
    from zbopt.errors import NotApplicableError
    from zbopt.microbatch_order import ORDER_RULES
    from zbopt.schedules import generate
    from zbopt.simulation import simulate

    by_order = {}
    for order in ORDER_RULES:
        try:
            result = simulate(problem, generate(name, problem, order=order))
        except NotApplicableError:
            by_order[order] = None
            continue
        by_order[order] = result.makespan if result.valid else None
    return by_order


def best_order_of(by_order: dict[str, float | None]) -> tuple[str | None, float | None]:
    """The order rule with the shortest makespan of `order_makespans` (the first of equals), and it."""
    found = {order: value for order, value in by_order.items() if value is not None}
    best = min(found, key=found.get) if found else None
    return best, found.get(best)


def packing_gains(lengths: Sequence[int], budget: int, problem: dict, schedules: Sequence[str] = ("1f1b", "zb-h1"),
                  attention_share: float = 0.0, time_limit: float = 10.0) -> list[dict]:
    """What packing and order gain over the data loader: per packing rule (`RULES`) and schedule,
    the makespan with the microbatches in the loader's order ("given") and in the best of the
    order rules (`zbopt.microbatch_order.ORDER_RULES`), and how much shorter that is than the
    loader's packing in its given order. `problem`: the Problem's other keys (devices, costs,
    memory), its costs those of a microbatch of `budget` tokens unless it gives reference_tokens
    (one reference for every packing, so each holds the same work); a schedule that does not
    apply, or overruns the memory limit in an order, has no value there (None)."""
    from zbopt.problem import Problem

    rows, baseline = [], {}
    for rule in RULES:
        tokens = packed_tokens(lengths, pack(lengths, budget, rule, attention_share, time_limit=time_limit))
        chosen = Problem(**{"reference_tokens": budget, **problem}, num_microbatches=len(tokens),
                         microbatch_tokens=tokens, attention_share=attention_share)
        for name in schedules:
            by_order = order_makespans(chosen, name)
            best_order, best = best_order_of(by_order)
            baseline.setdefault(name, by_order["given"])
            base = baseline[name]
            rows.append({"packing": rule, "microbatches": len(tokens), "schedule": name, "given": by_order["given"],
                         "best_order": best_order, "best": best,
                         "gain": None if base is None or best is None else 1 - best / base})
    return rows
