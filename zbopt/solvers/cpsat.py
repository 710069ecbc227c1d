"""The backend users call "cpsat" (the default): the full CP-SAT model, then LNS on large problems.

The full model (`full_model`) proves optima where it can (one chunk per device up to p = 32; small v = 2
problems) and on mid-sized ones keeps improving for the whole time limit, but on larger ones it
creeps down by single ticks near the warm start, where large-neighbourhood search (`lns`) keeps
improving one window at a time. Measured (`benchmarks/bench_scale.py`, interleaved, v = 2, 120 s):
p = 6, memory 6 (432 ops): full model 625.5-638.9 over three runs, LNS alone 693.7; p = 8,
memory 4 (768 ops): full model 1296.9-1359.5 over three runs, LNS alone 1231.2, this rule
1262.4-1266.4. So on problems of at least LNS_MIN_OPS ops the full model gets the first half of
the search time and, unless it proved its answer (optimal or infeasible), LNS continues from its
best schedule for the rest; smaller problems get the full model alone. Not LNS alone on large
problems: the full model keeps its own bound and proves what it can in its half, and neither
order wins everywhere (V-Min, p = 8, m = 16: this rule 1139.3, LNS alone 1158.9). The full
model's bound stays the answer's bound: LNS proves nothing. LNS applies to the makespan of one
iteration from a warm start (`lns.applies`); otherwise the full model runs alone.

Under a memory limit, on problems of at least BLOCK_MIN_OPS ops, the search first spends
BLOCK_SHARE of its time on the optimal repeating block and starts from it, repeated and squeezed,
where that beats the warm start (`_from_the_block`); the answer is never longer than that start.
"""

from __future__ import annotations

from dataclasses import replace

from zbopt.core import interrupt
from zbopt.core.problem import Problem
from zbopt.core.simulation import simulate
from zbopt.solvers import full_model, lns
from zbopt.solvers.answer import simulated_answer, start_times
from zbopt.solvers.blocks.build import block_schedule
from zbopt.solvers.blocks.search import block_refusal, optimal_block
from zbopt.solvers.task import Found, SearchTask

__all__ = ["BLOCK_MIN_OPS", "BLOCK_SHARE", "LNS_MIN_OPS", "LNS_SHARE", "search"]

LNS_MIN_OPS = 600  # between the sizes measured: the full model wins at 432 ops, LNS at 768
LNS_SHARE = 0.5  # of the search time, for LNS after the full model
BLOCK_SHARE = 0.1  # of the search time, for the optimal block a memory-bound search may start from
BLOCK_MIN_OPS = 100  # below, the full model proves its optimum in seconds and the block search only costs time


def search(problem: Problem, task: SearchTask, *, memory_model: str = "cumulative", symmetry_breaking: bool = True,
           lns_share: float | None = None, pair_window: int | None = None) -> Found:
    """The full model (`full_model.search`, with its options), then LNS (`lns.search`) from its best for
    `lns_share` of the search time unless the full model proved its answer first, where LNS applies
    (the makespan, one iteration, not the driver's second phase). `lns_share` None: LNS_SHARE on
    problems of at least LNS_MIN_OPS ops, else 0 (the full model alone)."""
    if lns_share is None:
        lns_share = LNS_SHARE if problem.num_ops >= LNS_MIN_OPS else 0.0
    if not 0 <= lns_share < 1:
        raise ValueError(f"lns_share {lns_share}: must be at least 0 and below 1")
    started = _from_the_block(problem, task)
    found = _full_then_lns(problem, started, lns_share, dict(memory_model=memory_model,
                                                              symmetry_breaking=symmetry_breaking,
                                                              pair_window=pair_window))
    block = started.warm
    if block is task.warm:
        return found
    answer = simulated_answer(problem, found, task.objective, "cpsat")  # not `modelled`: rounded, or None
    if answer is not None and answer.makespan <= block.makespan:
        return found
    return replace(found, status="feasible", starts=start_times(block), modelled=block.makespan)


def _full_then_lns(problem: Problem, task: SearchTask, lns_share: float, model_options: dict) -> Found:
    """The full model, then LNS from its best for `lns_share` of the search time (see `search`)."""
    if lns_share == 0 or task.warm is None or not lns.applies(problem, task):
        # without a warm start the full model may find no schedule in its share, and LNS none without one
        return full_model.search(problem, task, **model_options)
    first = replace(task, deadline=interrupt.now() + (1 - lns_share) * task.remaining())
    found = full_model.search(problem, first, **model_options)
    if found.status in ("optimal", "infeasible") or task.stopped.is_set() or task.remaining() <= 0:
        return found
    start = simulated_answer(problem, found, task.objective, "cpsat") or task.warm
    improved = lns.search(problem, replace(task, warm=start))
    if improved.starts is None:
        return found
    if improved.modelled > start.makespan:  # rounded ticks: keep the better
        return found
    return replace(found, status="feasible", starts=improved.starts, modelled=improved.modelled)


def _from_the_block(problem: Problem, task: SearchTask) -> SearchTask:
    """`task`, starting instead from the optimal repeating block (`optimal_block`, BLOCK_SHARE of
    the search time) repeated for the problem's m and squeezed (`block_schedule`: a fill, the
    steady state, a drain) where that is shorter than its warm start. Only under a memory limit,
    where the best schedules are block-shaped and the heuristics' warm-up counts miss the limit;
    on problems of at least BLOCK_MIN_OPS ops (a test's 36-op splits lost a second each to it);
    for the makespan of one iteration without its ends, every activation kept and equal
    microbatches (what the block search models); from a warm start (a caller who gave none wants no hint)."""
    if (problem.memory_limit is None or problem.num_ops < BLOCK_MIN_OPS or task.objective != "makespan"
            or task.peak_cap is not None or task.warm is None or problem.iterations != 1
            or problem.iteration_ends is not None
            or block_refusal(problem) is not None or task.remaining() <= 0 or task.stopped.is_set()):
        return task
    found = optimal_block(problem, time_limit=BLOCK_SHARE * task.remaining(), workers=task.workers, seed=task.seed)
    built = simulate(problem, block_schedule(found.block))
    if not built.valid or built.makespan >= task.warm.makespan:
        return task
    task.report(built.makespan, None)
    # what the driver answers with if it must leave the search behind
    task.kept["incumbent"] = Found("feasible", start_times(built), 0.0, built.makespan, None)
    return replace(task, warm=built)
