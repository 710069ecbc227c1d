"""The incremental timeline generators build on times ops by the simulator's rules."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reference import problems, random_topological_schedule
from zbopt import Op, simulate
from zbopt.core.timeline import Timeline


@given(problems(chunks=(1, 2)), st.integers(0, 10_000))
def test_appending_a_schedule_op_by_op_gives_the_simulators_times_and_memory(problem, seed):
    """Ops appended in the order the simulator starts them get the simulator's start times, and
    each device ends holding what the simulator's memory steps end at (all freed: 0)."""
    simulation = simulate(problem, random_topological_schedule(problem, seed))
    ops = sorted(simulation.table.ops(), key=lambda op: (simulation.times_of(op)[0], problem.device_of(op.stage)))
    timeline = Timeline(problem)
    for op in ops:
        assert timeline.append(op) == simulation.times_of(op)[0]
    assert timeline.schedule().orders == simulation.schedule.orders
    assert timeline.held == pytest.approx([levels[-1] for _, levels in simulation.memory_steps], abs=1e-9)


@given(problems(chunks=(1, 2)))
def test_held_memory_after_the_forwards_is_each_devices_activations(problem):
    """After every forward of every microbatch, a device holds m times its stages' activations."""
    timeline = Timeline(problem)
    for microbatch in range(problem.num_microbatches):
        for stage in range(problem.num_stages):
            timeline.append(Op("F", stage, microbatch))
    for device, stages in enumerate(problem.stages_of_device):
        expected = problem.num_microbatches * sum(problem.activation_memory[s] for s in stages)
        assert abs(timeline.held[device] - expected) <= 1e-9 * max(1.0, expected)
