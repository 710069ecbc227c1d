"""The solve driver's shared steps, run with stand-in backends (this module's `search`) and CP-SAT:
warm start, the one rule for "optimal", the gap, tick resolution, the second phase and the budget."""

import _thread
import signal
import threading
import time

import pytest

from tests.reference import brute_force_least_peak, brute_force_optimum, timed_search_optimum
from tests.test_cpsat import TINY
from zbopt import MemoryLimitError, Problem, ZboptError, generate, simulate, solve
from zbopt.core.interrupt import Interrupted, TimeUp, deadline_scope
from zbopt.io.trace import chrome_trace
from zbopt.presentation.plot import plot_gantt
from zbopt.solvers import api
from zbopt.solvers.answer import start_times
from zbopt.solvers.bounds import lower_bounds
from zbopt.solvers.task import Found
from zbopt.solvers.warm import best_heuristic, warm_start_simulation

ANSWER: dict = {}  # what the stand-in backend returns: set by each test


def search(problem, task, **options):
    """A stand-in backend: records its task and returns ANSWER["found"] (a function of the task)."""
    ANSWER["task"] = task
    return ANSWER["found"](problem, task)


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setitem(api.BACKENDS, "stand-in", api.Backend(search))
    return ANSWER


# a problem the independent bounds cannot settle, so the backend is called
LOOSE = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=1, weight_times=1,
                weight_memory=0.5, memory_limit=2)


def test_a_backend_answer_worse_than_the_warm_start_is_replaced_by_it(stand_in):
    gpipe = simulate(LOOSE.replace(memory_limit=None), generate("gpipe", LOOSE))  # no limit: any order runs
    stand_in["found"] = lambda problem, task: Found("feasible", start_times(gpipe), 0.0, None, 1.0)
    # gpipe breaks the limit, and the driver re-simulates strictly: device 0 runs its forwards back to
    # back (F = 1), so its third, 0F2 at t = 2, brings it to 3 activations of M_B = 1, over the limit 2
    with pytest.raises(MemoryLimitError, match=r"^device 0 holds 3 at t=2, over its memory limit 2$"):
        solve(LOOSE, "stand-in", lower_peak=False)
    warm_name, warm = best_heuristic(LOOSE)
    slower = {op: start + 100.0 for op, start in start_times(warm).items()}  # the warm start, shifted: valid, worse
    stand_in["found"] = lambda problem, task: Found("feasible", slower, 0.0, None, 1.0)
    result = solve(LOOSE, "stand-in", lower_peak=False)
    assert (result.status, result.warm_start, result.objective) == ("feasible", warm_name, warm.makespan)
    assert stand_in["task"].warm is not None and stand_in["task"].independent_bound == lower_bounds(LOOSE).best


def test_status_and_gap_agree_when_only_rounded_costs_are_proven(stand_in):
    """A proof on rounded costs (inexact ticks) does not make the status optimal: the gap left by
    the rounding is reported, and so is what decided."""
    _, warm = best_heuristic(LOOSE)
    value = warm.makespan
    stand_in["found"] = lambda problem, task: Found("optimal", start_times(warm), value - 0.01, value, 0.001,
                                                    error_bound=0.01, exact=False)
    result = solve(LOOSE, "stand-in", lower_peak=False)
    assert result.status == "feasible" and result.gap == pytest.approx(0.01 / value)
    assert "tick resolution 0.001" in result.decided_by and result.resolution == 0.001
    # the same proof on exact costs closes the gap
    stand_in["found"] = lambda problem, task: Found("optimal", start_times(warm), value, value, 1.0)
    exact = solve(LOOSE, "stand-in", lower_peak=False)
    assert (exact.status, exact.gap, exact.lower_bound, exact.decided_by) == ("optimal", 0.0, value, "solver")


def highs_optimum(problem: Problem) -> float:
    """The optimum as the MILP proves it: another model and another solver than CP-SAT's."""
    result = solve(problem, "highs", time_limit=60)
    assert result.status == "optimal"
    return result.objective


# each with an optimum found apart from CP-SAT: an exhaustive search over device orders for TINY, in
# time for the integer-cost LOOSE at m = 2 (the search grows too fast beyond), HiGHS at m = 4
EXHAUSTED = [*((problem, brute_force_optimum) for problem in TINY),
             (LOOSE.replace(num_microbatches=2), timed_search_optimum),
             (LOOSE.replace(num_microbatches=4), highs_optimum)]


@pytest.mark.parametrize(("problem", "search"), EXHAUSTED,
                         ids=lambda case: case.describe() if isinstance(case, Problem) else case.__name__)
def test_status_is_optimal_exactly_when_the_gap_is_zero(problem, search):
    """Where an exhaustive search gives the optimum, CP-SAT meets it: "optimal" with gap 0 and the
    optimum as its lower bound (a value above it would have to be "feasible" with a gap)."""
    optimum = search(problem)
    result = solve(problem, "cpsat", time_limit=30)
    assert result.objective == pytest.approx(optimum) and result.lower_bound == pytest.approx(optimum)
    assert (result.status, result.gap) == ("optimal", 0)


def test_equal_makespan_prefers_less_peak_memory():
    """The issue's example: without a memory limit gpipe and 1f1b both take (m + p - 1)(F + B) = 33,
    gpipe holding m = 8 activations on device 0 and 1f1b p = 4: solve returns the leaner one."""
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    result = solve(problem, "cpsat", time_limit=30)
    assert result.status == "optimal" and result.objective == 33
    assert max(result.simulation.peak_memory) == 4


@pytest.mark.parametrize("problem", [
    Problem(num_devices=2, num_microbatches=3, forward_times=1, backward_times=2),
    Problem(num_devices=2, num_microbatches=2, forward_times=1, backward_times=1, weight_times=1),
    Problem(num_devices=3, num_microbatches=2, forward_times=[1, 1, 2], backward_times=1, weight_times=1,
            p2p_time=0.5),
    TINY[0].replace(memory_limit=None),
], ids=lambda p: p.describe())
def test_the_second_phase_reaches_the_least_peak_at_the_optimal_makespan(problem):
    result = solve(problem, "cpsat", time_limit=60)
    assert result.objective == pytest.approx(brute_force_optimum(problem))
    assert max(result.simulation.peak_memory) == pytest.approx(brute_force_least_peak(problem, result.objective))


def test_the_second_phase_lowers_the_peak_to_the_least_at_that_makespan():
    """p = 2, v = 2, F = B = W = 1: the search's optimum holds 5 activations, the second phase 4 at
    the same makespan 25; and 4 is the least, as a limit of 3.5 makes the optimum longer."""
    problem = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, forward_times=1, backward_times=1,
                      weight_times=1)
    # from interleaved 1F1B (26), so the search runs (greedy reaches 25 at once, and a warm start the
    # bound proves optimal skips both phases)
    first = solve(problem, "cpsat", time_limit=60, lower_peak=False, warm_start="interleaved-1f1b")
    second = solve(problem, "cpsat", time_limit=60, warm_start="interleaved-1f1b")
    assert first.status == second.status == "optimal" and first.objective == second.objective == 25
    assert max(second.simulation.peak_memory) < max(first.simulation.peak_memory)
    tighter = solve(problem.replace(memory_limit=max(second.simulation.peak_memory) - 0.5), "cpsat", time_limit=60)
    assert tighter.status == "optimal" and tighter.objective > 25


def test_the_time_limit_bounds_the_second_phase(stand_in):
    """The backend's second-phase deadline lies within the call's time limit."""
    _, warm = best_heuristic(LOOSE)
    deadlines = []

    def found(problem, task):
        deadlines.append(task.deadline)
        return Found("feasible", start_times(warm), 0.0, None, 1.0)

    stand_in["found"] = found
    began = time.perf_counter()
    solve(LOOSE, "stand-in", time_limit=5)
    assert len(deadlines) == 2 and all(deadline <= began + 5 + 1e-3 for deadline in deadlines)


def _interrupt_soon(seconds: float = 0.3) -> None:
    """Ctrl-C as a terminal would send it, to this (the main) thread, a moment from now."""
    threading.Timer(seconds, _thread.interrupt_main).start()


@pytest.fixture(autouse=True)
def _ctrl_c_handled():
    """Python's own Ctrl-C handler, as in a terminal: a suite started in the background by a
    non-interactive shell inherits SIGINT ignored, and `interrupt_main` then does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_calls_the_backends_stop_hook_and_keeps_its_best(stand_in):
    _, warm = best_heuristic(LOOSE)

    def found(problem, task):
        stopped = threading.Event()
        task.on_stop(stopped.set)
        _interrupt_soon()  # once the backend runs (the heuristics before it take a machine-dependent while)
        assert stopped.wait(30), "the stop hook was not called"
        return Found("feasible", start_times(warm), 0.0, None, 1.0)

    stand_in["found"] = found
    with pytest.raises(Interrupted) as caught:  # a KeyboardInterrupt, with the best so far
        solve(LOOSE, "stand-in", time_limit=60)
    result = caught.value.partial
    assert (result.status, result.objective) == ("feasible", warm.makespan)
    assert stand_in["task"].stopped.is_set() and result.solve_time_s < 30


def test_ctrl_c_leaves_a_backend_that_does_not_stop_behind_with_the_warm_start(stand_in):
    release = threading.Event()
    _, warm = best_heuristic(LOOSE)

    def found(problem, task):
        _interrupt_soon()  # once the backend runs
        release.wait(30)

    stand_in["found"] = found
    try:
        with pytest.raises(Interrupted) as caught:
            solve(LOOSE, "stand-in", time_limit=60)
    finally:
        release.set()
    assert caught.value.partial.objective == warm.makespan and caught.value.partial.solve_time_s < 30


def test_an_error_in_the_backend_reaches_the_caller(stand_in):
    def found(problem, task):
        raise RuntimeError("model broke")

    stand_in["found"] = found
    with pytest.raises(RuntimeError, match="model broke"):
        solve(LOOSE, "stand-in", time_limit=60)


def test_an_option_the_backend_does_not_take_is_refused_before_any_work():
    with pytest.raises(ZboptError, match=r"solver 'highs'.*memory_model"):
        solve(LOOSE, "highs", memory_model="reservoir")


def test_span_names_its_own_bound():
    """With the span objective the bound is the busiest device's work, not a makespan bound
    (here device_load, 25, is above the optimal span, 24)."""
    problem = Problem(num_devices=2, num_microbatches=8, forward_times=1, backward_times=1, weight_times=1)
    result = solve(problem, "cpsat", objective="span", time_limit=30)
    assert (result.status, result.objective, result.binding_bound) == ("optimal", 24, "device_work")
    assert result.decided_by in ("solver", *(f"lower bound (device_work on device {d})" for d in (0, 1)))


def test_a_backend_still_busy_past_the_deadline_is_left_behind(stand_in):
    """A backend that ignores its stop hook (say, still building a huge model) does not hold the
    call: past the deadline and a grace, the warm start is the answer."""
    release = threading.Event()
    stand_in["found"] = lambda problem, task: release.wait(60) and None
    try:
        result = solve(LOOSE, "stand-in", time_limit=0.5)
    finally:
        release.set()
    # the warm start stands (which heuristics ran before their share of 0.5 s ended depends on the load)
    assert (result.status, result.schedule.name) == ("feasible", result.warm_start)
    assert result.objective == simulate(LOOSE, generate(result.warm_start, LOOSE)).makespan


def test_past_the_heuristics_deadline_the_first_valid_heuristic_is_the_warm_start():
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    assert best_heuristic(problem, deadline=0.0)[0] == "gpipe"  # the first registered, valid without a limit
    assert best_heuristic(problem.replace(memory_limit=4), deadline=0.0)[0] == "1f1b"  # gpipe holds 8


V_SHAPE = Problem(num_devices=4, num_microbatches=8, chunks_per_device=2, placement="v", forward_times=1,
                  backward_times=1.2, weight_times=0.8)


@pytest.mark.parametrize("name", ["zb-v", "zb-v-auto", "v-half", "v-min", "block-v-min", "greedy"])
def test_a_heuristic_stops_once_its_deadline_has_passed(name):
    """The heuristics that take seconds at scale stop at the enclosing deadline (`interrupt.check`);
    outside any deadline they run to the end (after the cut runs: zb-v keeps its answer)."""
    problem = V_SHAPE.replace(p2p_time=0.125)  # a problem of its own: no answer cached by another test
    with deadline_scope(time.perf_counter() + 3600), deadline_scope(0.0), pytest.raises(TimeUp):
        generate(name, problem)  # the earlier of two nested deadlines holds
    with deadline_scope(0.0), deadline_scope(time.perf_counter() + 3600), pytest.raises(TimeUp):
        generate(name, problem)
    assert simulate(problem, generate(name, problem)).valid


def test_a_warm_start_cut_by_the_time_limit_is_skipped_or_named():
    """Past both deadlines every heuristic stops (its Schedule checks the time device by device), so
    there is no warm start; past the deadline alone the first valid one is; a named warm start that
    cannot finish is an error naming it."""
    problem = V_SHAPE.replace(p2p_time=0.25)
    assert best_heuristic(problem, deadline=0.0, cutoff=0.0) is None
    with pytest.raises(ZboptError, match=r"^warm start 'zb-v' did not finish within the time limit$"):
        warm_start_simulation(problem, "zb-v", "makespan", 0.0, 0.0)
    assert best_heuristic(problem, deadline=0.0)[0] == "zb-v"


def test_bounds_cut_by_a_deadline_are_still_bounds():
    """With no time, only the bounds that need no graph: one microbatch's critical path and the
    busiest device's work, each at most the full bound; the device sequencing bound reports 0."""
    from zbopt.core.dag import critical_path, device_work

    problem = LOOSE.replace(num_microbatches=6)
    full, cut = lower_bounds(problem), lower_bounds(problem, deadline=0.0)
    assert full.complete and not cut.complete
    assert (cut["critical_path"], cut["device_load"]) == (critical_path(problem), max(device_work(problem)))
    assert cut.best <= full.best and cut["device_sequencing"] == 0


def test_an_answer_proven_by_a_bound_names_the_bound_its_device_and_the_schedule_it_is():
    """p = 2, V placement, memory for one microbatch: device 0's sequencing bound is the optimum
    (tests/test_bounds.py derives it), so no model is searched; the answer is the warm start,
    labelled by its own name in the result, the text, the Gantt title and the trace."""
    problem = Problem(num_devices=2, num_microbatches=3, chunks_per_device=2, placement="v", forward_times=1,
                      backward_times=2, p2p_time=0.25, memory_limit=2)
    result = solve(problem, time_limit=30)
    assert (result.status, result.objective) == ("optimal", pytest.approx((9 + 0.5) * 3 + 3.5))
    assert (result.binding_bound, result.binding_devices) == ("device_sequencing", (0,))
    assert result.decided_by == "lower bound (device_sequencing on device 0)"
    assert result.schedule.name == result.warm_start != "cpsat"
    assert "binding_bound   device_sequencing on device 0, bounds complete" in str(result)
    data = result.to_dict()
    assert (data["binding_devices"], data["bounds"]["best"]) == ([0], result.objective)
    assert set(data["bound_seconds"]) == set(data["bounds"]) - {"best"}
    figure = plot_gantt(result.simulation)
    assert figure.axes[0].get_title().startswith(f"{result.warm_start}: ")
    assert chrome_trace(result.simulation)["otherData"]["schedule"] == result.warm_start


@pytest.mark.parametrize("overrun", [False, True])
def test_bounds_are_incomplete_when_a_device_method_uses_up_its_share(overrun):
    """A device's method (its DP, its relaxation) still running when its share of the time ran out
    was cut short: the bounds are then not complete, though every device had its turn."""
    from zbopt.solvers.bounds import _share_by_gain

    def method(device, best, seconds):
        if overrun:
            time.sleep(seconds + 0.01)
        return best + 1.0

    bound, finished = _share_by_gain("device_sequencing", [20.0, 20.0], [5.0, 6.0], 10.0,
                                     time.perf_counter() + 0.2, method)
    assert finished is not overrun
    if not overrun:  # device 1 (the larger one-machine bound) first proves 11, then device 0 12
        assert (bound.value, bound.devices) == (12.0, (0,))


def test_a_backend_left_behind_answers_with_the_incumbent_it_kept(stand_in):
    """A backend that does not return by the call's limit is left behind; its kept incumbent (as
    CP-SAT's callback keeps it) is the answer, not nothing (issue 41: a 600 s run whose CP-SAT did
    not stop in time answered with the warm start, its own better schedules lost)."""
    zb = simulate(LOOSE, generate("zb-h1", LOOSE.replace(memory_limit=None)))
    kept = Found("feasible", start_times(zb), 0.0, zb.makespan, 1.0)

    def stuck(problem, task):
        task.kept["incumbent"] = kept
        time.sleep(task.remaining() + 2 * api.STOP_GRACE_S + 1)  # past the call's limit: left behind
        return Found("unknown", None, 0.0, None, 1.0)

    stand_in["found"] = stuck
    result = solve(LOOSE.replace(memory_limit=None), "stand-in", time_limit=2, use_warm_start=False,
                   lower_peak=False)
    assert result.objective == pytest.approx(zb.makespan) and result.status in ("feasible", "optimal")
