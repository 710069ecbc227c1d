"""Hanayo's wave with a 1F1B discipline: zbopt's reconstruction, not the authors' schedule.

Hanayo (Liu, Cheng, Zhou and You, SC'23, arXiv:2308.15762) cuts the model into S = 2W·p stages
laid out as W waves: each wave runs down the devices and back up, so every device holds 2W
stages and no weights are copied (unlike Chimera). That is zbopt's placement `v` with v = 2W
chunks (tests/test_vshape.py). The paper's own figures and runtime were not available to check
against (only its abstract and a secondary summary, W = S/(2P)), so the order below is zbopt's:
Megatron's interleaved 1F1B (groups of p microbatches, forwards chunk by chunk, backwards in
reverse chunk order, one forward / one backward in the steady state) with its table and its
warm-up counts derived for the wave.

- The table (`wave_table`): in the wave the bottom turnaround is local (device p-1 runs a
  microbatch's chunk 0 and chunk 1 back to back), so Megatron's table, which lets one
  microbatch enter per slot, would stall there. Microbatches of a group enter two slots apart
  instead: with unit costs and forwards only, (microbatch j, chunk c) on device d runs at slot
  stage + 2·(j mod p) + v·p·(j div p), no two on a device share a slot, and each device walks
  its ops in slot order (chunk c and c+1 alternating where they overlap).
- The warm-up (`wave_warmup`): device 0 ends the wave (it holds the last stage): it runs the
  whole first group, v·p forwards, before its first backward; with fewer, its backwards would
  hold back the forwards the others wait for. That backward reaches device d d hops later, in
  which time device d runs d more: v·p - 1 + d warm-up forwards, then one forward / one backward.
"""

from __future__ import annotations

from zbopt.core.problem import Problem
from zbopt.core.schedule import Schedule
from zbopt.schedules.interleaved import table_memory, table_order
from zbopt.schedules.registry import register, require

__all__ = ["NAME", "hanayo", "wave_table", "wave_warmup"]

NAME = "hanayo"


def wave_table(problem: Problem, device: int) -> list[tuple[int, int]]:
    """Device `device`'s (microbatch, device-local chunk) pairs of one iteration in the order of
    their slot in the wave's forward flow: stage + 2·(j mod p) + v·p·(j div p).

    >>> wave_table(Problem(num_devices=2, num_microbatches=2, chunks_per_device=2, placement="v"), 0)
    [(0, 0), (1, 0), (0, 1), (1, 1)]
    """
    p, v, m = problem.num_devices, problem.chunks_per_device, problem.num_microbatches
    stages = problem.stages_of_device[device]

    def slot(pair: tuple[int, int]) -> int:
        j, chunk = pair
        return stages[chunk] + 2 * (j % p) + v * p * (j // p)

    return sorted(((j, chunk) for j in range(m) for chunk in range(v)), key=slot)


def wave_warmup(problem: Problem, device: int) -> int:
    """Warm-up forwards on `device`: v·p - 1 + device (the first group's v·p forwards on device 0,
    one more per hop from it), at most all m·v."""
    p, v = problem.num_devices, problem.chunks_per_device
    return min(v * p - 1 + device, problem.num_microbatches * v)


def _memory(problem: Problem) -> list[float]:
    """Device d: its warm-up + 1 = min(v·p + d, m·v) chunk activations in flight, each at most the
    device's largest."""
    return table_memory(problem, [wave_warmup(problem, d) for d in range(problem.num_devices)])


@register(NAME, "Hanayo's wave (Liu et al., SC'23) with 1F1B: zbopt's reconstruction from the paper's description "
                "(its figures were not available to check against); placement v, v = 2W", _memory,
          after="torch-zb-interleaved")
def hanayo(problem: Problem) -> Schedule:
    """Hanayo's wave-like pipeline (Liu, Cheng, Zhou and You, SC'23), as zbopt reconstructs it
    (see the module: the paper's figures were not available): W = v/2 waves on placement v, each
    device walking its `wave_table` with `wave_warmup` warm-up forwards, then one forward / one
    backward, then the remaining backwards. A fused backward as in the paper; with a split one,
    each W runs right after its B (as 1f1b does). Needs placement v and an even v >= 2; any p, m.

    Notes
    -----
    With costs F, B per chunk, no latency, m a multiple of p and m >= 2p, the makespan is
    m·v(F+B) + 2(p-1)·max(F, B): at F = B interleaved 1F1B's (p-1)(F+B) + m·v(F+B), with
    B > F (p-1)(B-F) more. Device d holds at most min(v·p + d, m·v) chunk activations
    (interleaved 1F1B: v·p + p - 1 - 2r on device r). A microbatch crosses devices 2W·(p-1)
    times per pass, its turnarounds being local (interleaved: v·p - 1).
    """
    v = problem.chunks_per_device
    require(problem.placement == "v" and v % 2 == 0, NAME,
            f"placement v and an even chunks_per_device (2W chunks: W waves down and back up; got "
            f"placement {problem.placement}, v = {v})")
    return Schedule([table_order(problem, d, wave_table(problem, d), wave_warmup(problem, d))
                     for d in range(problem.num_devices)])
