"""Memory levers and a memory report: recomputation of blocks, and what a training step needs per replica.

Example:
    >>> import tfaccel.memory                                                    # doctest: +SKIP
    >>> tfaccel.memory.enable_recompute(model)                                   # doctest: +SKIP
    >>> tfaccel.estimate_memory("resnet50", batch_size=64, precision="mixed_float16").total_bytes  # doctest: +SKIP
"""

from tfaccel._lazy import lazy_exports

__all__ = ["BLOCK_PATTERN", "DEFAULT_SHAPES", "MemoryEstimate", "disable_recompute", "enable_recompute",
           "estimate_memory", "find_blocks", "recompute_blocks"]

# Lazily, so that the light modules here (options, shards) load without TensorFlow.
_LAZY = {**{name: "tfaccel.memory.estimate" for name in ("DEFAULT_SHAPES", "MemoryEstimate", "estimate_memory")},
         **{name: "tfaccel.memory.recompute" for name in ("BLOCK_PATTERN", "disable_recompute", "enable_recompute",
                                                          "find_blocks", "recompute_blocks")}}
__getattr__, __dir__ = lazy_exports("tfaccel.memory", globals(), _LAZY, __all__)
