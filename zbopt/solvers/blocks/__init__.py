"""Building blocks (Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024): a
block, its lifespans and memory, the schedule it builds, the published schedules' blocks. The
schedules they build (block-NAME, `registered`) join the registry when it is first asked, not here."""

from zbopt.solvers.blocks.build import block_schedule, repeat
from zbopt.solvers.blocks.cyclic import tightest_block
from zbopt.solvers.blocks.model import Block, BlockError, Lifespan, block_ops, lifespan_bound, lifespans, steady_peak
from zbopt.solvers.blocks.published import PUBLISHED, published_block

__all__ = ["PUBLISHED", "Block", "BlockError", "Lifespan", "block_ops", "block_schedule", "lifespan_bound",
           "lifespans", "published_block", "repeat", "steady_peak", "tightest_block"]
