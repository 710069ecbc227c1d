import pytest
from hypothesis import given

from tests.reference import problems
from zbopt import NotApplicableError, Problem, UnknownScheduleError, critical_path, device_work, generate, simulate
from zbopt.schedules import registered


def test_registry_lists_the_reference_schedules():
    assert {"gpipe", "1f1b"} <= {entry.name for entry in registered()}


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


@given(problems(max_devices=6, max_microbatches=10, chunks=(1, 2, 3), iterations=(1, 2), recompute=True))
def test_every_schedule_is_valid_and_keeps_its_memory_promise(problem):
    """Every registered schedule, on random problems meeting its preconditions: the simulator
    accepts it, its makespan respects both lower bounds, its peak memory its stated bound."""
    bound = max(critical_path(problem), max(device_work(problem)))
    for entry in registered():
        try:
            schedule = generate(entry.name, problem)
        except NotApplicableError:
            continue
        result = simulate(problem, schedule)
        assert result.makespan >= bound - 1e-9, entry.name
        if entry.peak_memory_bound is not None:
            promised = entry.peak_memory_bound(problem)
            assert all(peak <= limit + 1e-9 for peak, limit in zip(result.peak_memory, promised, strict=True)), \
                (entry.name, result.peak_memory, promised)
