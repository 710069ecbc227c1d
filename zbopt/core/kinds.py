"""The op kinds: the one place that says which kinds exist and what each is called.

A kind is named by its letter ("F", "B", "W", "BW", "R", "O", "L", "G"), as in an op's text form "3F1";
every display derives from the table `KINDS`: the word in traces and the report's hover text, the
chart legend's label, and the full name in messages. An overlapped pair (DualPipe's "F&B") runs a
forward with another microbatch's backward as one op; its kinds ("FB", "FBW") are named here too.

>>> KINDS[BACKWARD].word, KINDS[BACKWARD].legend, KINDS[FUSED_BACKWARD].name
('input gradient', 'B input grad', 'full backward')
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BACKWARD", "COPY_KINDS", "FORWARD", "FUSED_BACKWARD", "FUSED_KINDS", "KINDS", "OFFLOAD", "PAIR_KINDS",
           "PAIR_MEMBERS", "RECOMPUTE", "REGATHER", "RELOAD", "SIDE_KINDS", "SPLIT_KINDS", "WEIGHT", "Kind"]

FORWARD, BACKWARD, WEIGHT, FUSED_BACKWARD, RECOMPUTE, OFFLOAD, RELOAD = "F", "B", "W", "BW", "R", "O", "L"
REGATHER = "G"  # FSDP's unshard again before a stage's backwards, its parameters freed after its last forward


class Kind(NamedTuple):
    """What one op kind is called, from the shortest to the longest form."""

    letter: str  # the op's text form, e.g. "3B1"
    short: str  # beside the letter in a chart's legend
    word: str  # traces' categories and the report's hover text
    name: str  # messages that explain an op, e.g. "misses the input-gradient backward of ..."

    @property
    def legend(self) -> str:
        """The chart legend's label, e.g. "B input grad"."""
        return f"{self.letter} {self.short}"


KINDS = {kind.letter: kind for kind in (
    Kind(FORWARD, "forward", "forward", "forward"),
    Kind(BACKWARD, "input grad", "input gradient", "input-gradient backward"),
    Kind(WEIGHT, "weight grad", "weight gradient", "weight-gradient backward"),
    Kind(FUSED_BACKWARD, "backward", "backward", "full backward"),
    Kind(RECOMPUTE, "recompute", "recompute", "recomputed forward"),
    Kind(OFFLOAD, "offload", "offload", "offload to the host"),
    Kind(RELOAD, "reload", "reload", "reload from the host"),
    Kind(REGATHER, "re-gather", "re-gather", "re-gather of the stage's parameters before its backwards"),
)}
SPLIT_KINDS = (FORWARD, BACKWARD, WEIGHT)  # what every stage and microbatch runs with a split backward
FUSED_KINDS = (FORWARD, FUSED_BACKWARD)  # ... and with a fused one
COPY_KINDS = (OFFLOAD, RELOAD)  # ops on a device's copy lanes (device to host, host to device), beside compute
SIDE_KINDS = (*COPY_KINDS, REGATHER)  # every op beside compute: the copies, and the re-gathers on the all-gather lane

# An overlapped pair (DualPipe's "F&B"): a forward with another microbatch's backward, run as one op
# on one device: F with the input gradient B ("FB", split backward only), or with the full backward
# ("FBW": B and W when split, BW when fused). The members' kinds by pair kind and backward:
PAIR_KINDS = ("FB", "FBW")
PAIR_MEMBERS = {("FB", True): (FORWARD, BACKWARD), ("FBW", True): (FORWARD, BACKWARD, WEIGHT),
                ("FBW", False): (FORWARD, FUSED_BACKWARD)}
