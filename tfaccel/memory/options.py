"""``estimate_memory``'s options checked before anything is built or TensorFlow loads (``tfaccel memory`` checks
its flags with it first, so that a bad one is one line)."""

from typing import Any, Optional, Union

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.precision import POLICY_NAMES
from tfaccel.strategies.names import STRATEGY_NAMES
from tfaccel.train.request import OPTIMIZER_NAMES

__all__ = ["check_options"]


def check_options(strategy: str, batch_size: Any, replicas: int, num_ps: int, precision: Optional[str],
                   optimizer: Union[str, Any], shard_optimizer_state: bool = False,
                   gradient_accumulation_steps: Any = 1) -> None:
    """Checks estimate_memory's options before anything is built; the error names the option and what is valid."""
    if shard_optimizer_state and (strategy not in ("mirrored", "multi_worker") or replicas < 2):
        raise ConfigError(f"shard_optimizer_state: sharding needs strategy 'mirrored' or 'multi_worker' over 2 "
                          f"replicas or more; received strategy={strategy!r}, replicas={replicas}. Pass one of "
                          "those with replicas=N, or leave sharding off")
    if strategy not in STRATEGY_NAMES:
        raise invalid_choice("strategy", strategy, STRATEGY_NAMES)
    if precision is not None and precision not in POLICY_NAMES:
        raise invalid_choice("precision", precision, POLICY_NAMES,
                             hint="estimate_memory needs the policy itself, not 'auto'")
    for name, value in (("batch_size", batch_size), ("replicas", replicas), ("num_ps", num_ps),
                        ("gradient_accumulation_steps", gradient_accumulation_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}: must be a positive integer; received {value!r}")
    if batch_size % replicas:
        raise ConfigError(f"batch_size: the global batch {batch_size} does not split evenly over {replicas} "
                          f"replicas; give a multiple of {replicas} (e.g. {replicas * max(1, batch_size // replicas)})")
    if isinstance(optimizer, str) and optimizer.lower() not in OPTIMIZER_NAMES:
        raise invalid_choice("optimizer", optimizer, OPTIMIZER_NAMES, hint="Or pass a keras.optimizers.Optimizer")
