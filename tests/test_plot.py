from matplotlib.collections import PolyCollection

from zbopt import Problem, generate, simulate
from zbopt.plot import plot_gantt


def test_gantt_draws_one_box_per_op_and_one_lane_per_device():
    problem = Problem(num_devices=3, num_microbatches=5, chunks_per_device=2, weight_times=1, placement="v")
    figure = plot_gantt(simulate(problem, generate("looped-bfs", problem)))
    boxes = sum(len(c.get_paths()) for c in figure.axes[0].collections if isinstance(c, PolyCollection))
    assert boxes == problem.num_ops + problem.num_devices
    labels = [t.get_text() for t in figure.axes[0].texts]
    assert set(labels) <= {str(j) for j in range(5)} and labels
    assert "looped-bfs: p=3, m=5, v=2" in figure.axes[0].get_title()
