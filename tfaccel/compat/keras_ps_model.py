"""Keras 3 ``evaluate`` / ``predict`` on a model built under ``ParameterServerStrategy``.

Upstream: keras-team/keras#18624 (Keras 3 has no ParameterServerStrategy support). Seen on Keras 3.15.1 with
TensorFlow 2.21. A Keras 3 model remembers the strategy whose scope it was created in
(``TensorFlowTrainer.__init__`` stores ``tf.distribute.get_strategy()`` in ``_distribute_strategy``) and
``evaluate`` / ``predict`` distribute their data with it, even outside the scope; ParameterServerStrategy
refuses::

    ValueError: To use this dataset, you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset.

After tfaccel's coordinator loop has trained the model, the coordinator process can run the model itself: its
variables live on the ps tasks and are read there, as tfaccel's own validation pass does. So the model forgets the
strategy (Keras then uses the strategy of the current scope: the default one outside any scope) and ``evaluate``,
``predict`` and ``save`` work on the coordinator. Switched off with ``TFACCEL_DISABLE_COMPAT=keras_ps_model``.
"""

from typing import Any, Optional

from tfaccel.compat import VersionWindow, gate

__all__ = ["NAME", "UPSTREAM_ISSUES", "AFFECTED_VERSIONS", "why_not_needed", "release_from_strategy"]

NAME = "keras_ps_model"
UPSTREAM_ISSUES = ("keras-team/keras#18624",)
# [first affected, first version not known to be affected): Keras 3.0 .. 3.15.x.
AFFECTED_VERSIONS: VersionWindow = ((3, 0), (3, 16))


def why_not_needed(model: Any) -> Optional[str]:
    """Why the model is left as it is, or None when it should forget its ParameterServerStrategy."""
    import keras
    import tensorflow as tf

    closed = gate(NAME, "Keras", keras.__version__, AFFECTED_VERSIONS,
                  f"evaluate fails after parameter-server training, see {UPSTREAM_ISSUES[0]}")
    if closed is not None:
        return closed
    strategy = getattr(model, "_distribute_strategy", None)  # Keras 3.15 TensorFlowTrainer; no public setter
    if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return f"the model's strategy is {type(strategy).__name__}, not ParameterServerStrategy"
    return None


def release_from_strategy(model: Any) -> bool:
    """Makes a model trained by the coordinator loop usable by Keras ``evaluate``/``predict`` on the coordinator.

    Args:
        model: a Keras 3 model built in a ParameterServerStrategy scope.

    Returns:
        Whether the model was changed (False: see :func:`why_not_needed`).
    """
    if why_not_needed(model) is not None:
        return False
    model._distribute_strategy = None  # Keras 3.15: distribute_strategy falls back to tf.distribute.get_strategy()
    for name in ("train_function", "test_function", "predict_function"):  # traced under the old strategy
        if hasattr(model, name):
            setattr(model, name, None)
    return True
