"""The microbatch count from a global batch: m = global / (micro · dp) from flags and config keys,
and every inconsistent combination refused in one line naming its keys."""

import pytest

from zbopt.interfaces.cli import main
from zbopt.interfaces.cli.inputs import run_config


@pytest.mark.parametrize(("flags", "microbatches"), [
    ({"global_batch_size": 64, "micro_batch_size": 2, "data_parallel": 4}, 8),
    ({"global_batch_size": 12}, 12),  # micro-batch size and data parallel default to 1
    ({"global_batch_size": 96, "data_parallel": 8}, 12),
    ({"global_batch_size": 30, "micro_batch_size": 5}, 6),
])
def test_the_global_batch_gives_m(flags, microbatches):
    assert run_config(None, flags).problem.num_microbatches == microbatches


def test_config_keys_and_flags_combine(tmp_path):
    config = tmp_path / "batch.yaml"
    config.write_text("num_stages: 2\nglobal_batch_size: 48\nmicro_batch_size: 2\n")
    assert run_config(config, {}).problem.num_microbatches == 24
    assert run_config(config, {"data_parallel": 3}).problem.num_microbatches == 8


@pytest.mark.parametrize(("argv", "message"), [
    (["--global-batch", "60", "--micro-batch-size", "4", "--data-parallel", "2"],
     "--global-batch: 60 is not a multiple of micro_batch_size × data_parallel = 4 × 2 "
     "(from --micro-batch-size and --data-parallel)"),
    (["--global-batch", "64", "-b", "8"],
     "--global-batch and --num-microbatches both give the number of microbatches; give one"),
    (["--micro-batch-size", "2"],
     "--micro-batch-size: give the global batch too (global_batch_size, --global-batch), which they divide"),
    (["--global-batch", "0"], "--global-batch: 0 is not a positive whole number"),
    (["--global-batch", "8", "--data-parallel", "-2"], "--data-parallel: -2 is not a positive whole number"),
])
def test_bad_combinations_are_one_line_naming_the_flags(capsys, argv, message):
    status = main(["simulate", "-s", "2", *argv])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "") and err.count("\n") == 1 and message in err


def test_a_config_conflict_names_the_key_and_its_file(tmp_path, capsys):
    config = tmp_path / "batch.yaml"
    config.write_text("num_microbatches: 8\nglobal_batch_size: 64\nmicro_batch_size: 3\n")
    assert main(["simulate", str(config)]) == 2
    assert capsys.readouterr().err == (f"zbopt: global_batch_size ({config}) and num_microbatches ({config}) both "
                                       "give the number of microbatches; give one\n")
    config.write_text("global_batch_size: 64\nmicro_batch_size: true\n")
    assert main(["simulate", str(config)]) == 2
    assert f"micro_batch_size ({config}): True is not a positive whole number" in capsys.readouterr().err
