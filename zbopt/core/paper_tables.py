"""Published configurations and numbers that zbopt reproduces and compares against, in one place
for the tests, benchmarks and notebooks.

From "Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024):

- Table 9: the profiled F, B, W and communication times (ms) of its four GPT models, run with the
  p devices and m microbatches of its Table 5;
- Table 3: each model's hidden size h and attention heads a (sequence length s = 1024);
- Table 1: one microbatch's activations on one stage take M_B = 34sbh + 5as²b, of which W keeps
  M_W = 32sbh (b, the microbatch size, cancels in M_W / M_B);
- Table 5: the bubble rates of ZB-H1, ZB-H2, ZB-1p and ZB-2p.
"""

from __future__ import annotations

from dataclasses import dataclass

from zbopt.core.problem import Problem

__all__ = ["SEQUENCE_LENGTH", "ZERO_BUBBLE_MODELS", "ZERO_BUBBLE_TABLE_5", "ZeroBubbleModel"]

SEQUENCE_LENGTH = 1024


@dataclass(frozen=True)
class ZeroBubbleModel:
    """One row of the Zero Bubble paper's Tables 9 and 3 (times in ms)."""

    name: str
    num_devices: int
    num_microbatches: int
    forward: float
    backward: float
    weight: float
    comm: float
    hidden: int
    heads: int

    @property
    def weight_memory(self) -> float:
        """M_W / M_B from Table 1: 32sbh / (34sbh + 5as²b)."""
        return 32 * self.hidden / (34 * self.hidden + 5 * self.heads * SEQUENCE_LENGTH)

    def problem(self, memory_limit: float | None = None, **changes) -> Problem:
        """The model as the paper runs it: M_B = 1 per stage and microbatch, M_W from Table 1, the
        communication time as p2p latency; `changes` override any Problem field."""
        values = dict(num_devices=self.num_devices, num_microbatches=self.num_microbatches,
                      forward_times=self.forward, backward_times=self.backward, weight_times=self.weight,
                      p2p_time=self.comm, activation_memory=1.0, weight_memory=self.weight_memory,
                      memory_limit=memory_limit)
        return Problem(**{**values, **changes})


ZERO_BUBBLE_MODELS = {model.name: model for model in (
    ZeroBubbleModel("1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, 2304, 24),
    ZeroBubbleModel("6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, 4096, 32),
    ZeroBubbleModel("14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, 5120, 40),
    ZeroBubbleModel("28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, 6144, 48),
)}

# Table 5: bubble rate (span − m(F+B+W)) / span, span the longest device's, per model and schedule.
ZERO_BUBBLE_TABLE_5 = {
    "1.5B": {"zb-h1": 0.1585, "zb-h2": 0.1083, "zb-1p": 0.1585, "zb-2p": 0.0433},
    "6.2B": {"zb-h1": 0.1323, "zb-h2": 0.0698, "zb-1p": 0.1323, "zb-2p": 0.0029},
    "14.6B": {"zb-h1": 0.1397, "zb-h2": 0.0672, "zb-1p": 0.1397, "zb-2p": 0.0066},
    "28.3B": {"zb-h1": 0.1421, "zb-h2": 0.0641, "zb-1p": 0.1421, "zb-2p": 0.0038},
}
