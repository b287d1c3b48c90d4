"""How a job is spread: a registry of strategies, ``get_strategy`` / ``get_backend`` and ``"auto"``.

Example:
    >>> import tfaccel
    >>> strategy = tfaccel.get_strategy("auto")  # doctest: +SKIP
"""

from tfaccel.strategies.base import Backend
from tfaccel.strategies.registry import (STRATEGY_NAMES, StrategyEntry, StrategyName, get_backend, get_strategy,
                                         register_strategy, strategy_entries)

__all__ = ["Backend", "STRATEGY_NAMES", "StrategyName", "StrategyEntry", "get_backend", "get_strategy",
           "register_strategy", "strategy_entries"]
