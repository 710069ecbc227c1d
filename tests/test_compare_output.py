"""What `compare` prints for a training engineer: every device's own limit, the device whose memory
binds, the schedules that do not apply folded into one line, and no bound (not a zero gap) when
the bounds are skipped."""

import json

import pytest

from tests.test_compare import applicable, run
from zbopt import Problem, compare, registered
from zbopt.core.errors import ZboptError
from zbopt.presentation.plot import plot_comparison
from zbopt.presentation.tables import format_comparison

# 1F1B's peaks on p = 4 with a split backward are 4, 3, 2, 1: device 1 has no room under 3, device 0
# has 0.5 under 4.5, so device 1 binds though device 0 holds the most
PER_DEVICE = dict(num_devices=4, num_microbatches=8, weight_times=1, memory_limit=[4.5, 3, 6, 6])
PER_DEVICE_FLAGS = ("-s", "4", "-b", "8", "-w", "1", "--memory-limit", "4.5", "3", "6", "6")


def test_every_devices_limit_appears_and_the_device_with_least_room_binds():
    comparison = compare(Problem(**PER_DEVICE), ["1f1b", "gpipe"])
    text = format_comparison(comparison)
    assert "memory limit  4.5, 3, 6, 6 (devices 0-3)" in text.splitlines()
    one_f_one_b = next(row for row in comparison.rows if row.name == "1f1b")
    assert list(one_f_one_b.simulation.peak_memory) == [4, 3, 2, 1] and one_f_one_b.within_memory_limit
    assert one_f_one_b.binding_device == 1 and one_f_one_b.cells()["binding_device"] == "device 1: 3 of 3"
    # GPipe holds all 8 on every device: the least room is the smallest limit's, device 1 (8 of 3)
    gpipe = next(row for row in comparison.rows if row.name == "gpipe")
    assert gpipe.binding_device == 1 and gpipe.to_dict()["peak_memory_per_device"] == [8, 8, 8, 8]
    # no limit: the highest peak binds; one limit: said once, for every device
    assert compare(Problem(num_devices=4, num_microbatches=8), ["1f1b"]).rows[0].cells()["binding_device"] == \
        "device 0"
    assert "memory limit  2.5 on every device" in format_comparison(
        compare(Problem(num_devices=2, num_microbatches=4, memory_limit=2.5), ["1f1b"])).splitlines()


def test_the_schedules_that_do_not_apply_fold_into_one_line_with_reasons_on_request(capsys):
    problem = Problem(**PER_DEVICE)
    left_out = [entry.name for entry in registered() if entry.name not in applicable(problem)]
    assert len(left_out) > 10
    status, out, _ = run(capsys, "compare", *PER_DEVICE_FLAGS)
    folded = [line for line in out.splitlines() if line.startswith("not applicable")]
    assert status == 0 and folded == [f"not applicable ({len(left_out)}, reasons with --verbose): "
                                      + ", ".join(left_out)]
    assert not any(f"{name} needs" in out for name in left_out)
    status, out, _ = run(capsys, "compare", *PER_DEVICE_FLAGS, "--verbose")
    reasons = out.split("not applicable:\n")[1].split("\n\n")[0].splitlines()
    assert status == 0 and [line.split()[0] for line in reasons] == left_out
    assert all(line.startswith(f"  {name} needs ") for line, name in zip(reasons, left_out, strict=True))
    assert run(capsys, "compare", *PER_DEVICE_FLAGS, "--verbose", "--json")[0] == 2


def test_without_bounds_there_is_no_bound_and_no_gap_rather_than_zero(capsys, tmp_path):
    problem = Problem(**PER_DEVICE)
    comparison = compare(problem, bounds=False)
    bounded = compare(problem)
    assert comparison.lower_bound is None and bounded.lower_bound > 0
    assert [(row.name, row.makespan) for row in comparison.rows] == [(row.name, row.makespan) for row in bounded.rows]
    assert all(row.gap is None and row.to_dict()["lower_bound"] is None for row in comparison.rows)
    status, out, err = run(capsys, "compare", *PER_DEVICE_FLAGS, "--no-bounds")
    lines = out.splitlines()
    assert status == 0 and "lower bound   none: bounds=False (--no-bounds) skips them" in lines
    assert "%" not in out and lines[-1] == f"best within the limit: {bounded.best_within_limit.name} (no bound)"
    status, out, _ = run(capsys, "compare", *PER_DEVICE_FLAGS, "--no-bounds", "--json")
    assert status == 0 and {(row["lower_bound"], row["gap"]) for row in json.loads(out)} == {(None, None)}
    figure = plot_comparison(comparison)  # no bound line, no gap in the labels
    assert not [line for line in figure.axes[0].get_lines() if line.get_gid() == "lower-bound"]
    with pytest.raises(ZboptError, match=r"bounds=False \(--no-bounds\) with optimal=True"):
        compare(problem, optimal=True, bounds=False)
    status, out, err = run(capsys, "compare", *PER_DEVICE_FLAGS, "--no-bounds", "--optimal")
    assert (status, out) == (2, "") and len(err.splitlines()) == 1 and "--no-bounds" in err
