"""``tfaccel.scope()``: the plan of this process, and the strategy scope the user's model is built in.

An existing Keras script changes three lines::

    with tfaccel.scope():                      # was: nothing, or `with strategy.scope():`
        model = make_model(); model.compile(...)
    history = tfaccel.fit(model, x, y, ...)    # was: model.fit(x, y, ...)

``scope`` resolves the plan once per request (the backend is shared with ``get_strategy``/``get_backend``),
sets the precision policy while the model is built, and remembers the plan so that ``fit`` trains the model
with the backend it was built under.
"""

import contextlib
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

import keras
import tensorflow as tf

from tfaccel.compat.keras_compile_args import remember_compile_arguments
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.plan import describe_auto, resolve_plan
from tfaccel.precision import set_precision

__all__ = ["scope", "plan_for_model", "outside_scope_error", "STARTUP_STRATEGIES"]

# Plans entered in this process, by the id of their tf.distribute strategy.
_PLANS: Dict[int, Tuple[Any, Any, Any]] = {}


@contextlib.contextmanager
def scope(strategy: str = "auto", precision: str = "auto", jit_compile: Union[str, bool] = "auto", *,
          strategy_options: Optional[Mapping[str, Any]] = None) -> Iterator[Any]:
    """Builds (or reuses) the backend for this request and enters its strategy scope.

    Build and compile the model inside; train it with ``tfaccel.fit(model, ...)``.

    Args:
        strategy: a registry name (``tfaccel.strategies.STRATEGY_NAMES``) or ``"auto"``. Defaults to "auto".
        precision: ``"auto"``, ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``; the Keras dtype policy
            while the block runs (restored after it). ``"auto"`` keeps a global policy you set before
            (``keras.mixed_precision.set_global_policy``); a different explicit value conflicts with it.
            Defaults to "auto".
        jit_compile: ``"auto"``, True or False: XLA for the train step, applied by ``fit``. Defaults to "auto".
        strategy_options: options of the strategy entry, e.g. ``{"device_names": ["/gpu:0", "/gpu:1"]}``.

    Yields:
        The ``Plan`` (strategy, precision, XLA, each with its reason).

    Raises:
        ConfigError: an unknown strategy, option, precision or jit_compile value.

    Example:
        >>> import keras, tfaccel
        >>> with tfaccel.scope() as plan:  # doctest: +SKIP
        ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ...     model.compile(optimizer="adam", loss="mse")
        >>> result = tfaccel.fit(model, x, y, batch_size=32, epochs=2)  # doctest: +SKIP
    """
    plan, backend = resolve_plan(strategy=strategy, precision=precision, jit_compile=jit_compile,
                                 strategy_options=strategy_options)
    remember_compile_arguments()  # an explicit compile(jit_compile=...) inside stands (tfaccel.fit keeps it)
    previous = keras.config.dtype_policy()
    if plan.precision != previous.name:  # else the policy the user set (or Keras' default) stands as it is
        set_precision(plan.precision)
    _PLANS[id(backend.strategy)] = (plan, backend, jit_compile)
    get_logger().debug("scope: %s", plan.summary())
    try:
        with backend.scope():
            yield plan
    finally:
        keras.config.set_dtype_policy(previous)


def plan_for_model(model: Any) -> Tuple[Any, Any, Union[str, bool]]:
    """The (plan, backend, requested jit_compile) the model was built under.

    A model built outside ``tfaccel.scope()`` lives under the default strategy: it trains with the latest plan
    whose backend uses that strategy (Horovod, default), or with ``strategy="auto"`` when that needs no scope.

    Raises:
        ConfigError: the model's variables belong to a strategy no tfaccel plan made, or it was built outside
            the scope of a plan that needs one.
    """
    strategy = model.distribute_strategy
    found = _PLANS.get(id(strategy))
    if found is not None:
        return found
    if strategy is not tf.distribute.get_strategy() or tf.distribute.has_strategy():
        raise ConfigError(f"fit: the model was built under a {type(strategy).__name__} that tfaccel did not make. "
                          "Build and compile it inside `with tfaccel.scope():` (the same strategy is returned by "
                          "tfaccel.get_strategy()), then call tfaccel.fit outside that block")

    auto = describe_auto()
    if auto["strategy"] in STARTUP_STRATEGIES:  # building the model started TF: too late for this strategy
        raise outside_scope_error(auto)
    plan, backend = resolve_plan(strategy="auto")
    if backend.strategy is not strategy:
        raise ConfigError(f"fit: the model was built outside tfaccel.scope(), so its variables live on one device, but "
                          f"this process's plan is strategy {plan.strategy!r} ({plan.strategy_reason}). Build and "
                          "compile the model inside `with tfaccel.scope():`")
    _PLANS[id(strategy)] = (plan, backend, "auto")
    return plan, backend, "auto"


# Strategies that must exist before TensorFlow's runtime starts ("Collective ops must be configured at program
# startup"); a model built outside tfaccel.scope() has started it, so "auto" picking one of them is the user's
# missing scope, said before TensorFlow's own error.
STARTUP_STRATEGIES = ("multi_worker",)


def outside_scope_error(auto: Mapping[str, Any]) -> ConfigError:
    """The error for a model built outside ``tfaccel.scope()`` where ``"auto"`` (``auto``: ``describe_auto()``)
    picks a strategy that must be set up before TensorFlow runs (MultiWorkerMirroredStrategy under ``tfaccel
    launch``)."""
    return ConfigError(f"fit: the model was built outside tfaccel.scope(), but this process's strategy "
                       f"{auto['strategy']!r} ({auto['strategy_reason']}) must be set up before TensorFlow runs, and "
                       "building the model started it. Build and compile the model inside `with tfaccel.scope():`")
