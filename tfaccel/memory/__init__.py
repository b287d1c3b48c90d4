"""Memory levers and a memory report: recomputation of blocks, and what a training step needs per replica.

Example:
    >>> import tfaccel.memory                                                    # doctest: +SKIP
    >>> tfaccel.memory.enable_recompute(model)                                   # doctest: +SKIP
    >>> tfaccel.estimate_memory("resnet50", batch_size=64, precision="mixed_float16").total_bytes  # doctest: +SKIP
"""

from tfaccel.memory.estimate import DEFAULT_SHAPES, MemoryEstimate, estimate_memory
from tfaccel.memory.recompute import (BLOCK_PATTERN, disable_recompute, enable_recompute, find_blocks,
                                      recompute_blocks)

__all__ = ["BLOCK_PATTERN", "DEFAULT_SHAPES", "MemoryEstimate", "disable_recompute", "enable_recompute",
           "estimate_memory", "find_blocks", "recompute_blocks"]
