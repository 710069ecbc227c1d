from collections import Counter

import pytest
from hypothesis import example, given

from tests.reference import PAPER_PEAKS, assert_paper_peak, order_peak_memory, problems
from zbopt import NotApplicableError, Problem, UnknownScheduleError, critical_path, device_work, generate, simulate
from zbopt.schedules import registered


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_the_registry_names_the_reference_schedules_and_each_takes_its_closed_form(name):
    """Registered under its name, and what the name generates is that schedule: without latency
    both take (m + p - 1)(F + B), and GPipe holds all m activations on device 0, 1F1B only p."""
    assert sum(entry.name == name for entry in registered()) == 1
    problem = Problem(num_devices=4, num_microbatches=8, forward_times=1, backward_times=2)
    result = simulate(problem, generate(name, problem))
    assert result.makespan == pytest.approx((8 + 4 - 1) * (1 + 2))
    assert result.peak_memory[0] == {"gpipe": 8, "1f1b": 4}[name]


def test_unknown_schedule_suggests_a_close_name():
    with pytest.raises(UnknownScheduleError, match="unknown schedule '1fb1'; did you mean '1f1b'"):
        generate("1fb1", Problem(num_devices=2, num_microbatches=2))


def test_1f1b_needs_one_chunk_per_device():
    with pytest.raises(NotApplicableError, match="1f1b needs chunks_per_device = 1"):
        generate("1f1b", Problem(num_devices=2, num_microbatches=2, chunks_per_device=2))


@given(problems(max_devices=6, max_microbatches=10, iterations=(1, 2)))
def test_reference_schedules_are_valid_and_respect_lower_bounds(problem):
    bound = max(critical_path(problem), max(device_work(problem)))
    for name in ("gpipe", "1f1b"):
        result = simulate(problem, generate(name, problem))
        assert result.schedule.name == name
        assert result.makespan >= bound - 1e-9
        assert sum(result.busy) == pytest.approx(sum(device_work(problem)))


@given(problems(max_devices=4, max_microbatches=6, chunks=(2, 3)))
def test_looped_bfs_runs_any_number_of_chunks_and_placement(problem):
    result = simulate(problem, generate("looped-bfs", problem))
    assert result.makespan >= critical_path(problem) - 1e-9
    per_device = [sum(problem.activation_memory[s] for s in stages) * problem.num_microbatches
                  for stages in problem.stages_of_device]
    assert list(result.peak_memory) == pytest.approx(per_device)


# The registered schedules the random problems below cannot reach, and where they are tested instead.
ELSEWHERE = {"dualpipe": "bidirectional placement (test_dualpipe.py)",
             "chimera": "bidirectional placement (test_bidirectional.py)", "pipeoffload": "offload (test_offload.py)",
             "bitpipe": "bidirectional placement with two V's (test_bitpipe.py)",
             "serial-offload": "offload (test_offload.py)", "full-offload": "offload (test_offload.py)",
             "seq1f1b": "sequence slices (test_slices.py)", "1f1b-overlap": "overlapped pairs (test_combined.py)",
             "interleaved-1f1b-overlap": "overlapped pairs (test_combined.py)"}
RANDOMLY_CHECKED = (  # the other 33
    "gpipe", "looped-bfs", "1f1b", "eager-1f1b", "1f1b-2bw", "eager-1f1b-2bw", "interleaved-1f1b",
    "torch-zb-interleaved", "hanayo",
    "zb-h1", "zb-h2", "zb-auto", "zb-1p", "zb-2p", "zb-v", "torch-zbv", "v-min", "v-half", "v-half-squeezed", "v-zb",
    "zb-v-auto", "dualpipe-v", "greedy",
    "block-1f1b", "block-zb-h1", "block-interleaved-1f1b", "block-v-min", "block-v-half", "block-v-zb",
    "1f1b-recompute", "interleaved-1f1b-recompute", "mario-1f1b", "serial-recompute",
)
# One problem per family, so that every other schedule runs whatever hypothesis draws.
FAMILIES = [
    Problem(num_devices=3, num_microbatches=6, forward_times=[1, 1.5, 1], backward_times=2, weight_times=1,
            weight_memory=0.3, activation_memory=[1, 2, 0.5], p2p_time=0.05),
    Problem(num_devices=3, num_microbatches=5, forward_times=1, backward_times=2, allow_recompute=True,
            checkpoint_memory=0.1, recompute_times=1),
    Problem(num_devices=3, num_microbatches=6, chunks_per_device=2, placement="v", weight_times=1,
            activation_memory=[1, 2, 0.5, 1, 1, 2]),
    Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, allow_recompute=True, checkpoint_memory=0.5,
            recompute_times=1, iterations=2),
    Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, weight_times=0.5, activation_memory=[1, 2, 1, 2]),
]


def test_every_schedule_is_valid_and_keeps_its_memory_promise():
    """Every registered schedule, on random problems meeting its preconditions: the simulator
    accepts it, its makespan respects both lower bounds, its peak memory is what its order holds
    (counted op by op, `order_peak_memory`), equals or stays within its paper's closed form
    (`PAPER_PEAKS`) and its stated bound. Every schedule but those of ELSEWHERE ran."""
    applied = Counter()

    @given(problems(max_devices=6, max_microbatches=10, chunks=(1, 2, 3), iterations=(1, 2), recompute=True))
    def check(problem):
        bound = max(critical_path(problem), max(device_work(problem)))
        for entry in registered():
            try:
                schedule = generate(entry.name, problem)
            except NotApplicableError:
                continue
            applied[entry.name] += 1
            result = simulate(problem, schedule)
            assert result.makespan >= bound - 1e-9, entry.name
            assert list(result.peak_memory) == pytest.approx(order_peak_memory(problem, schedule)), entry.name
            if entry.name in PAPER_PEAKS:
                assert_paper_peak(entry.name, problem, result.peak_memory)
            if entry.peak_memory_bound is not None:
                promised = entry.peak_memory_bound(problem)
                assert all(peak <= limit + 1e-9 for peak, limit in zip(result.peak_memory, promised, strict=True)), \
                    (entry.name, result.peak_memory, promised)

    for family in FAMILIES:
        check = example(family)(check)
    check()
    assert {entry.name for entry in registered()} - set(ELSEWHERE) == set(RANDOMLY_CHECKED)
    assert set(RANDOMLY_CHECKED) <= set(applied), sorted(set(RANDOMLY_CHECKED) - set(applied))
    assert set(PAPER_PEAKS) <= set(RANDOMLY_CHECKED)
