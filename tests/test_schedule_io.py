import json

import pytest

from zbopt import Op, Problem, Schedule, ZboptError, generate, load_schedule, save_schedule, simulate


def test_json_round_trip_keeps_orders_times_name_and_problem(tmp_path):
    problem = Problem(num_devices=3, num_microbatches=4, weight_times=0.5, p2p_time=0.1, memory_limit=3)
    timed = simulate(problem, generate("1f1b", problem)).timed_orders()
    path = tmp_path / "s.json"
    save_schedule(path, timed, problem)
    loaded, loaded_problem = load_schedule(path)
    assert loaded == timed and loaded_problem == problem
    assert json.loads(path.read_text())["orders"][2][:3] == ["2F0", "2B0", "2W0"]


def test_ops_may_be_given_as_strings_or_tuples():
    schedule = Schedule([["0F0", ("BW", 0, 0)]])
    assert schedule.orders == ((Op("F", 0, 0), Op("BW", 0, 0)),)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{", "not valid JSON"),
        ('{"orders": [["0F0", "0Q0"]]}', "'0Q0' is not an op"),
        ('{"orders": 3}', "one list of ops per device"),
        ('{"orders": [["0F0"]], "start_times": [[0, 1]]}', "device 0: 1 ops but 2 start times"),
    ],
)
def test_malformed_schedule_files_name_the_culprit(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ZboptError, match=needle):
        load_schedule(path)


def test_missing_schedule_file():
    with pytest.raises(ZboptError, match=r"schedule file 'nowhere\.json' not found"):
        load_schedule("nowhere.json")
