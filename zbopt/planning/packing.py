"""What packing and the order of microbatches gain, schedule by schedule (the packing rules
themselves are `zbopt.core.problem.batch`): a schedule's makespan in each order rule, and the best."""

from __future__ import annotations

from collections.abc import Sequence

from zbopt.core.problem.batch import RULES, pack, packed_tokens

__all__ = ["best_order_of", "order_makespans", "packing_gains"]


def order_makespans(problem, name: str) -> dict[str, float | None]:
    """Per order rule (`zbopt.core.problem.order.ORDER_RULES`), schedule `name`'s makespan on
    `problem` with its microbatches in that order; None where it does not apply or overruns the
    memory limit."""
    from zbopt.core.errors import NotApplicableError
    from zbopt.core.problem.order import ORDER_RULES
    from zbopt.core.simulation import simulate
    from zbopt.schedules import generate

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
    order rules (`zbopt.core.problem.order.ORDER_RULES`), and how much shorter that is than the
    loader's packing in its given order. `problem`: the Problem's other keys (devices, costs,
    memory), its costs those of a microbatch of `budget` tokens unless it gives reference_tokens
    (one reference for every packing, so each holds the same work); a schedule that does not
    apply, or overruns the memory limit in an order, has no value there (None)."""
    from zbopt.core.problem import Problem

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
