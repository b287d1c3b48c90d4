"""The built-in strategy names: the one list that validation, the CLI's choices and the docs use.

The CLI's light verbs import it to build their parsers, so it must not import TensorFlow (nor may
``tfaccel/strategies/__init__.py``, which exports the rest of the package lazily).
"""

from typing import Literal, Tuple, get_args

__all__ = ["StrategyName", "STRATEGY_NAMES"]

StrategyName = Literal["auto", "default", "one_device", "mirrored", "multi_worker", "parameter_server", "tpu",
                       "horovod"]
# "auto" picks one of the others.
STRATEGY_NAMES: Tuple[str, ...] = get_args(StrategyName)
