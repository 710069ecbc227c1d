"""torch 2.13's interleaved schedules as zbopt generators of their own: `torch-zb-interleaved`
(ScheduleInterleavedZeroBubble), `torch-zbv` (ScheduleZBVZeroBubble) and `interleaved-1f1b` with
torch's flexible group (ScheduleInterleaved1F1B), op for op against torch's `pipeline_order` on a
grid of p, m, v where torch is installed; their own rules, memory and refusals without it."""

import pytest

from tests.conftest import require_extra
from zbopt import NotApplicableError, Problem, UnknownScheduleError, ZboptError, generate, simulate
from zbopt.schedules import get, registered
from zbopt.schedules.interleaved import flexible_group

SPLIT = dict(forward_times=1, backward_times=1, weight_times=1)
# zbopt's name -> torch's, and the layouts torch's class builds orders for
TORCH_NAMES = {"interleaved-1f1b": "Interleaved1F1B", "torch-zb-interleaved": "InterleavedZeroBubble",
               "torch-zbv": "ZBVZeroBubble"}
# every p to 5 and m to 10, and m = 13 (not a multiple of 2..5: torch's flexible groups and refusals)
GRID = [(name, p, v, m) for name in TORCH_NAMES for p in range(1, 6) for m in (*range(1, 11), 13)
        for v in ((2,) if name == "torch-zbv" else (2, 3))]


def grid_problem(name: str, p: int, v: int, m: int) -> Problem:
    placement = "v" if name == "torch-zbv" else "loop"
    return Problem(num_devices=p, num_microbatches=m, chunks_per_device=v, placement=placement, **SPLIT)


@pytest.fixture(scope="module")
def torch_schedule():
    require_extra("torch", "comparing with torch.distributed.pipelining needs torch")
    from zbopt.schedules.torch_builtin import torch_schedule

    return torch_schedule


@pytest.mark.parametrize(("name", "p", "v", "m"), GRID)
def test_equal_to_torch_op_for_op_and_refused_where_torch_refuses(torch_schedule, name, p, v, m):
    """Where torch's class builds an order, zbopt's generator builds the same orders; where torch
    refuses the shape (m not a multiple of its rounds), zbopt refuses it too."""
    problem = grid_problem(name, p, v, m)
    try:
        theirs = torch_schedule(TORCH_NAMES[name], problem)
    except NotApplicableError:
        with pytest.raises(NotApplicableError, match=rf"{name} needs m a multiple of"):
            generate(name, problem)
        return
    ours = generate(name, problem)
    assert ours.orders == theirs.orders
    assert simulate(problem, ours).valid


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_valid_within_the_promised_memory_on_the_grid(name):
    """Without torch: on every grid shape served, with unequal costs and memory per stage, the
    order is valid and each device stays within the generator's promised peak."""
    served = 0
    for _, p, v, m in (case for case in GRID if case[0] == name):
        stages = p * v
        problem = grid_problem(name, p, v, m).replace(
            forward_times=[1 + (s % 3) / 2 for s in range(stages)], backward_times=1.5, p2p_time=0.1,
            activation_memory=[1 + (s % 2) for s in range(stages)], weight_memory=[0.5] * stages)
        try:
            result = simulate(problem, generate(name, problem))
        except NotApplicableError:
            continue
        served += 1
        promised = get(name).peak_memory_bound(problem)
        assert result.valid and all(peak <= bound + 1e-9 for peak, bound in zip(result.peak_memory, promised,
                                                                                strict=True)), (p, v, m)
    assert served >= 50  # of 55 (torch-zbv) or 110 shapes


def test_torch_refuses_exactly_m_not_a_multiple_of_its_rounds(torch_schedule):
    """torch 2.13 (both interleaved classes): rounds = max(1, m // p), refused unless rounds divide m;
    so m = 10 on p = 4 runs (groups of 5) and m = 9 does not."""
    for m in (3, 10, 12):
        problem = grid_problem("torch-zb-interleaved", 4, 2, m)
        theirs = torch_schedule("InterleavedZeroBubble", problem)
        assert generate("torch-zb-interleaved", problem).orders == theirs.orders
    assert [flexible_group(grid_problem("interleaved-1f1b", 4, 2, m)) for m in (3, 4, 8, 10, 12)] == [3, 4, 4, 5, 4]
    for name in ("interleaved-1f1b", "torch-zb-interleaved"):
        with pytest.raises(NotApplicableError, match=r"\(got m = 9, group = 4, p = 4"):
            generate(name, grid_problem(name, 4, 2, 9))


def test_one_chunk_torch_zero_bubble_is_zb_h1_so_it_is_refused(torch_schedule):
    """With one chunk torch's ScheduleInterleavedZeroBubble is ZB-H1 (warm-up p-r-1, W's r late):
    zbopt's torch-zb-interleaved refuses v = 1 rather than repeat zb-h1."""
    for p, m in [(2, 4), (4, 8), (4, 3), (5, 12)]:
        problem = Problem(num_devices=p, num_microbatches=m, **SPLIT)
        assert torch_schedule("InterleavedZeroBubble", problem).orders == generate("zb-h1", problem).orders
        with pytest.raises(NotApplicableError, match="torch-zb-interleaved needs chunks_per_device >= 2"):
            generate("torch-zb-interleaved", problem)


def test_zb_interleaved_follows_its_rule():
    """p = 2, v = 2, m = 4 (group 2): device 0 runs (v-1)·2 + 1 = 3 warm-up forwards, W's at once;
    device 1 runs 2, its W's one backward late, the last one at the end."""
    orders = [[str(op) for op in order] for order in generate("torch-zb-interleaved", grid_problem("", 2, 2, 4)).orders]
    assert orders[0] == ["0F0", "0F1", "2F0", "2F1", "2B0", "2W0", "0F2", "2B1", "2W1", "0F3", "0B0", "0W0",
                         "2F2", "0B1", "0W1", "2F3", "2B2", "2W2", "2B3", "2W3", "0B2", "0W2", "0B3", "0W3"]
    assert orders[1] == ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "3W0", "1F2", "1B0", "3W1", "1F3", "1B1",
                         "1W0", "3F2", "3B2", "1W1", "3F3", "3B3", "3W2", "1B2", "3W3", "1B3", "1W2", "1W3"]


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 12), (3, 2, 2), (4, 4, 10)])
def test_zb_interleaved_holds_its_warm_up_plus_one_and_r_pending_ws(p, v, m):
    """With W releasing the whole activation (M_W = M_B = 1), device r peaks at its warm-up + 1
    activations plus r pending W's: min((v-1)g + p - r + r, m·v) = min((v-1)g + p, m·v), every
    device alike; its bubble is smaller than interleaved 1F1B's on the same split problem."""
    problem = grid_problem("", p, v, m).replace(weight_memory=1)
    result = simulate(problem, generate("torch-zb-interleaved", problem))
    group = flexible_group(problem)
    assert list(result.peak_memory) == [min((v - 1) * group + p, m * v)] * p
    interleaved = simulate(problem, generate("interleaved-1f1b", problem))
    assert result.makespan < interleaved.makespan


def test_the_new_generators_are_no_aliases():
    """torch-zb-interleaved differs from every other registered schedule on p = 4, v = 2, m = 8."""
    problem = grid_problem("", 4, 2, 8)
    ours = generate("torch-zb-interleaved", problem).orders
    for entry in registered():
        if entry.name == "torch-zb-interleaved":
            continue
        try:
            other = generate(entry.name, problem).orders
        except (NotApplicableError, ZboptError):
            continue
        assert other != ours, entry.name


def test_zb_v_rule_is_now_torch_zbv():
    with pytest.raises(UnknownScheduleError, match="schedule 'zb-v-rule' is now 'torch-zbv' \\(the same order\\)"):
        generate("zb-v-rule", grid_problem("torch-zbv", 4, 2, 8))


@pytest.mark.parametrize("problem", [grid_problem("torch-zbv", 4, 2, 8),
                                     Problem(num_devices=4, num_microbatches=8, chunks_per_device=2)])
def test_zb_interleaved_refusals(problem):
    with pytest.raises(NotApplicableError, match="torch-zb-interleaved needs"):
        generate("torch-zb-interleaved", problem)
