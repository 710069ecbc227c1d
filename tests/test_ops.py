import pytest

from zbopt import Op, Problem, ScheduleError, critical_path, device_work, op_graph
from zbopt.core.ops import OpTable


def test_op_text_round_trip():
    assert str(Op("F", 3, 1)) == "3F1"
    assert Op.from_str("12BW7") == Op("BW", 12, 7)
    assert Op.from_str("0W0") == Op("W", 0, 0)
    for bad in ["3X1", "F1", "3F", "-1F0", ""]:
        with pytest.raises(ScheduleError, match="is not an op"):
            Op.from_str(bad)


def test_op_table_numbers_every_op_once():
    problem = Problem(num_devices=3, num_microbatches=4, chunks_per_device=2, weight_times=1, iterations=2)
    table = OpTable(problem)
    ops = table.ops()
    assert len(set(ops)) == table.size == 3 * 6 * 8
    assert all(table.index(op) == i for i, op in enumerate(ops))


@pytest.mark.parametrize("split", [True, False])
def test_dag_edges_per_microbatch(split):
    # per microbatch: S-1 forward edges, F->B at the last stage, S-1 backward edges (+ S B->W edges)
    p, v, m = 3, 2, 5
    problem = Problem(num_devices=p, num_microbatches=m, chunks_per_device=v, weight_times=1.0 if split else None,
                      p2p_time=0.5)
    graph = op_graph(problem)
    stages = p * v
    assert graph.number_of_edges() == m * ((3 * stages - 1) if split else (2 * stages - 1))
    crossing = [e for e in graph.edges(data=True) if e[2]["latency"] > 0]
    # loop placement: every stage-to-stage edge crosses devices, F->B and B->W do not
    assert len(crossing) == m * 2 * (stages - 1)


def test_v_placement_turn_costs_no_latency():
    problem = Problem(num_devices=2, num_microbatches=1, chunks_per_device=2, placement="v", p2p_time=0.5)
    graph = op_graph(problem)
    assert graph.edges[Op("F", 1, 0), Op("F", 2, 0)]["latency"] == 0.0
    assert graph.edges[Op("F", 0, 0), Op("F", 1, 0)]["latency"] == 0.5


def test_iteration_barrier_waits_for_every_gradient_of_the_stage():
    problem = Problem(num_devices=2, num_microbatches=3, iterations=2)
    graph = op_graph(problem)
    # m^2 barrier edges per stage: every BW(s, j<3) -> every F(s, j>=3)
    assert graph.number_of_edges() == 6 * 3 + 2 * 9
    assert graph.has_edge(Op("BW", 1, 2), Op("F", 1, 3)) and not graph.has_edge(Op("BW", 0, 2), Op("F", 1, 3))


def test_critical_path_is_one_microbatch_down_and_back_with_latency():
    p, f, b, w, c = 4, 1.5, 2.0, 0.75, 0.25
    split = Problem(num_devices=p, num_microbatches=8, forward_times=f, backward_times=b, weight_times=w, p2p_time=c)
    assert critical_path(split) == pytest.approx(p * f + p * b + w + 2 * (p - 1) * c)
    fused = Problem(num_devices=p, num_microbatches=8, forward_times=f, backward_times=b, p2p_time=c)
    assert critical_path(fused) == pytest.approx(p * f + p * b + 2 * (p - 1) * c)
    # a slow W on a late stage can end the longest chain instead of W on stage 0
    late = split.replace(weight_times=[0.1, 0.1, 0.1, 9.0])
    assert critical_path(late) == pytest.approx(p * f + b + 9.0 + c * (p - 1))


def test_device_work_sums_its_stages():
    problem = Problem(num_devices=2, num_microbatches=3, chunks_per_device=2, forward_times=[1, 2, 3, 4],
                      backward_times=2, weight_times=1, iterations=2)
    # loop placement: device 0 holds stages 0 and 2, device 1 stages 1 and 3; 6 microbatches in all
    assert device_work(problem) == pytest.approx([6 * (1 + 3 + 2 * 3), 6 * (2 + 4 + 2 * 3)])
