"""How a job is spread: a registry of strategies, ``get_strategy`` / ``get_backend`` and ``"auto"``.

Example:
    >>> import tfaccel
    >>> strategy = tfaccel.get_strategy("auto")  # doctest: +SKIP
"""

from tfaccel._lazy import lazy_exports
from tfaccel.strategies.names import STRATEGY_NAMES, StrategyName

__all__ = ["Backend", "STRATEGY_NAMES", "StrategyName", "StrategyEntry", "get_backend", "get_strategy",
           "register_strategy", "strategy_entries"]

# Lazily, so that ``tfaccel.strategies.names`` loads without TensorFlow (the CLI's light verbs).
_LAZY = {"Backend": "tfaccel.strategies.base", **{name: "tfaccel.strategies.registry" for name in
         ("StrategyEntry", "get_backend", "get_strategy", "register_strategy", "strategy_entries")}}
__getattr__, __dir__ = lazy_exports("tfaccel.strategies", globals(), _LAZY, __all__)
