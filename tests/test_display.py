"""Results show themselves: print() gives the CLI's table, Jupyter the table and its chart, and
to_dataframe() the simulator's numbers for pandas."""

import sys

import pytest

from zbopt import Problem, ZboptError, compare, generate, simulate, solve
from zbopt.interfaces.cli import main

PROBLEM = Problem(num_devices=2, num_microbatches=4, weight_times=1)


def test_print_gives_the_clis_table(capsys):
    """What `zbopt simulate` prints, line for line."""
    main(["simulate", "-s", "2", "-b", "4", "-w", "1", "--schedule", "1f1b"])
    printed = capsys.readouterr().out
    assert str(simulate(PROBLEM, generate("1f1b", PROBLEM))) in printed
    assert "makespan        19" in str(simulate(PROBLEM, generate("1f1b", PROBLEM)))  # (m+p-1)(F+B) + mW = 5·3 + 4


def test_jupyter_shows_the_table_and_the_chart():
    simulation = simulate(PROBLEM, generate("1f1b", PROBLEM))
    shown = simulation._repr_html_()
    assert shown.startswith("<pre>schedule        1f1b\n") and shown.count("<svg") == 1
    result = solve(PROBLEM, time_limit=5)
    assert "<pre>status          optimal" in result._repr_html_() and "<svg" in result._repr_html_()
    assert compare(PROBLEM, ["1f1b"])._repr_html_().count("<svg") == 1


def test_dataframes_hold_the_simulators_numbers():
    pytest.importorskip("pandas", reason="pandas is optional")
    simulation = simulate(PROBLEM, generate("1f1b", PROBLEM))
    frame = simulation.to_dataframe()
    assert frame["busy"].tolist() == list(simulation.busy) and frame["peak_memory"].tolist() == [2.0, 1.0]
    comparison = compare(PROBLEM, ["1f1b", "zb-h1"])
    assert comparison.to_dataframe().to_dict("records") == comparison.to_dicts()


def test_without_pandas_to_dataframe_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ZboptError, match=r"to_dataframe\(\) needs pandas: pip install pandas"):
        simulate(PROBLEM, generate("1f1b", PROBLEM)).to_dataframe()
