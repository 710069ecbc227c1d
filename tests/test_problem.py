import json
import subprocess
import sys
import textwrap

import pytest

from zbopt import Problem, ProblemError
from zbopt.core.problem.checks import MAX_OPS
from zbopt.core.problem.parameters import PARAMETERS, config_keys


def test_loop_placement_puts_stage_s_on_device_s_mod_p():
    problem = Problem(num_devices=4, num_microbatches=4, chunks_per_device=2, placement="loop")
    assert [problem.device_of(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert problem.stages_of_device[1] == (1, 5)


def test_v_placement_zig_zags_back_and_forth():
    problem = Problem(num_devices=4, num_microbatches=4, chunks_per_device=2, placement="v")
    assert [problem.device_of(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    three = Problem(num_devices=2, num_microbatches=4, chunks_per_device=3, placement="v")
    assert [three.device_of(s) for s in range(6)] == [0, 1, 1, 0, 0, 1]


def test_scalars_expand_to_one_value_per_virtual_stage():
    problem = Problem(num_devices=2, num_microbatches=3, chunks_per_device=2, forward_times=1.5, weight_times=1)
    assert problem.forward_times == (1.5,) * 4
    assert problem.weight_memory == (0.5,) * 4  # default M_W: half of M_B
    assert problem.kinds == ("F", "B", "W") and problem.num_ops == 3 * 4 * 3


@pytest.mark.parametrize("kinds", [{}, {"weight_times": 1.0, "weight_memory": 0.3}])
def test_memory_deltas_of_a_microbatch_sum_to_zero(kinds):
    problem = Problem(num_devices=3, num_microbatches=2, activation_memory=[1, 2, 0.5], **kinds)
    for stage in range(3):
        assert sum(problem.memory_delta(kind, stage) for kind in problem.kinds) == pytest.approx(0)
    if problem.split_backward:
        assert problem.memory_delta("B", 1) == pytest.approx(-(2 - 0.3))
        assert problem.memory_delta("W", 1) == pytest.approx(-0.3)


@pytest.mark.parametrize(
    ("parameters", "key", "reason"),
    [
        ({"forward_times": [1, 2, 3]}, "forward_times", "expected one value per virtual stage (4), got 3"),
        ({"backward_times": 0}, "backward_times", "every value must be > 0"),
        ({"weight_times": [1, -1, 1, 1]}, "weight_times", "virtual stage 1"),
        ({"num_microbatches": True}, "num_microbatches", "positive integer"),
        ({"chunks_per_device": 0}, "chunks_per_device", "positive integer"),
        ({"placement": "zigzag"}, "placement", "loop, v"),
        ({"p2p_time": -0.1}, "p2p_time", ">= 0"),
        ({"weight_memory": 0.3}, "weight_memory", "needs weight_times"),
        ({"weight_times": 1, "weight_memory": 2}, "weight_memory", "exceeds activation_memory"),
        ({"memory_limit": 0.5}, "memory_limit", "device 0 must hold one microbatch"),
        ({"memory_limit": [1, 1, 1]}, "memory_limit", "one value per device (4)"),
    ],
)
def test_invalid_parameters_name_their_key(parameters, key, reason):
    with pytest.raises(ProblemError) as error:
        Problem(**{"num_devices": 4, "num_microbatches": 8, **parameters})
    assert error.value.key == key
    assert reason in str(error.value)


def test_op_count_is_capped_at_max_ops_naming_the_largest_count():
    # the largest documented workload (the benchmarks' p = 64, m = 4096, v = 2, split) fits with room
    assert 12 * Problem(num_devices=64, num_microbatches=4096, chunks_per_device=2, weight_times=1).num_ops < MAX_OPS
    assert Problem(num_devices=1, num_microbatches=MAX_OPS // 2).num_ops == MAX_OPS  # F and BW each
    with pytest.raises(ProblemError) as error:
        Problem(num_devices=2, num_microbatches=MAX_OPS // 4, iterations=3, weight_times=1)
    assert (error.value.key, error.value.value) == ("num_microbatches", MAX_OPS // 4)
    assert error.value.reason == (f"the problem has {3 * 2 * (MAX_OPS // 4) * 3:,} ops, more than zbopt holds "
                                  f"(MAX_OPS = {MAX_OPS:,})")


def test_minimum_memory_limit_is_a_microbatch_on_all_of_a_devices_stages():
    problem = Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, placement="v",
                      activation_memory=[1, 2, 3, 4])
    # v placement: device 0 holds stages 0 and 3, device 1 holds stages 1 and 2
    assert problem.min_memory_limit == (5, 5)
    with pytest.raises(ProblemError, match="device 1 must hold"):
        problem.replace(memory_limit=[5, 4.5])


def test_dict_round_trip_gives_an_equal_problem():
    problem = Problem(num_devices=3, num_microbatches=5, forward_times=[1, 2, 3], backward_times=2,
                      weight_times=1, weight_memory=0.25, memory_limit=[4, 4, 5], iterations=2)
    data = problem.to_dict()
    assert data["backward_times"] == 2.0 and data["forward_times"] == [1.0, 2.0, 3.0]
    assert Problem.from_dict(data) == problem
    with pytest.raises(ProblemError, match="unknown problem parameter"):
        Problem.from_dict({**data, "speed": 3})


def test_a_parameter_added_to_the_table_is_a_keyword_a_config_key_a_flag_and_in_to_dict():
    """One row in the table (a mechanism's new parameter) is all it
    takes: the constructor takes it, a config file's key and its flag set it, to_dict writes it
    where its mechanism is in use, the docstring lists it. Run before the Problem class is built."""
    code = textwrap.dedent('''
        import json, sys
        import zbopt.core.problem.parameters as table
        table.PARAMETERS += (table.Parameter("loss_times", "per stage", None, "iterations",
                                             "the loss's time per stage", unit="time"),)
        from zbopt.core.problem import Problem
        from zbopt.core.problem.config import problem_from_config
        from zbopt.interfaces.cli.parser import build_parser
        made = Problem(num_devices=2, num_microbatches=2, loss_times=[1.5, 2.5])
        read = problem_from_config({"num_stages": 2, "loss_times": 3})
        flags = build_parser().parse_args(["simulate", "--loss-times", "4", "5"])
        print(json.dumps([made.to_dict()["loss_times"], read.loss_times, flags.loss_times,
                          "loss_times : the loss's time per stage" in Problem.__doc__,
                          "loss_times" in Problem(num_devices=2, num_microbatches=2).to_dict()]))
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [[1.5, 2.5], 3, [4.0, 5.0], True, True]


def test_the_table_derives_the_config_keys_and_the_flags_that_were_spelled_by_hand():
    """The keys and flags the config reader and the CLI took before the table, each still there."""
    keys = config_keys()
    for alias, name in (("num_stages", "num_devices"), ("num_batches", "num_microbatches"),
                        ("overlap_times", "overlap_times"), ("sequence_slices", "sequence_slices")):
        assert keys[alias] == name
    assert "microbatch_tables" not in keys  # stored, not written by a user
    flags = {flag for entry in PARAMETERS for flag in entry.flags}
    assert {"-s", "--num-devices", "-b", "--num-batches", "-v", "-f", "-bw", "-w", "--memory-limit",
            "--allow-recompute", "--shared-host-link", "--flush"} <= flags
    assert not {flag for flag in flags if "overlap" in flag or "microbatch-tokens" in flag}


def test_each_optional_mechanism_is_one_record_or_none_with_its_defaults_filled_in():
    """`problem.offload is not None` instead of four fields: a record holds the mechanism's values
    as the checks expanded them (reload = offload, recompute = forward, one cost per device), and
    a problem without the mechanism has None."""
    from zbopt.core.problem.mechanisms import MicrobatchSizes, Offload, OverlappedPairs, Recomputation

    plain = Problem(num_devices=2, num_microbatches=4)
    assert (plain.recomputation, plain.offload, plain.pairs, plain.microbatch_sizes) == (None, None, None, None)
    given = Problem(num_devices=2, num_microbatches=4, chunks_per_device=2, forward_times=[1, 2, 3, 4],
                    allow_recompute=True, checkpoint_memory=0.25, allow_offload=True, offload_times=0.5,
                    shared_host_link=True, overlap_times={"FBW": [2.5, 3]}, memory_limit=8)
    assert given.recomputation == Recomputation(times=(1, 2, 3, 4), checkpoint_memory=(0.25,) * 4)
    assert given.offload == Offload(offload_times=(0.5,) * 4, reload_times=(0.5,) * 4, shared_host_link=True)
    assert given.pairs == OverlappedPairs((("FBW", (2.5, 3.0)),))
    assert (given.pairs.kinds, given.pairs.cost("FBW", 1), given.pairs.cost("FB", 1)) == (("FBW",), 3.0, None)
    assert [given.host_link(device) for device in range(2)] == [0, 0]  # the pair (0, 1) shares one link
    sized = Problem(num_devices=2, num_microbatches=3, microbatch_tokens=[100, 200, 300], attention_share=0.5)
    assert sized.microbatch_sizes == MicrobatchSizes(tokens=(100, 200, 300), attention_share=(0.5, 0.5),
                                                     reference_tokens=None)
