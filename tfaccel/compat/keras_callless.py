"""A ``keras.Model`` subclass with its own ``train_step`` and no ``call()``, trained under a ``tf.distribute`` strategy.

Upstream: ``TensorFlowTrainer._maybe_symbolic_build`` in ``keras/src/backend/tensorflow/trainer.py`` (seen on Keras
3.15.1 with TensorFlow 2.21; no upstream issue names it). A model created under a strategy's scope is built
symbolically before ``fit``'s first step by calling it on a batch. keras-io's GAN (``compile(d_optimizer,
g_optimizer, loss_fn)``, a ``train_step`` that calls its generator and discriminator) and its VAE have no ``call()``,
so ``fit`` under ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy`` stops with::

    RuntimeError: Unable to automatically build the model. Please build it yourself before calling
    fit/evaluate/predict. ... Model GAN does not have a `call()` method implemented.

The same script trains on one device, where Keras defers building to the traced train step (which never calls the
container). The fix does what that message asks of the user: when the container itself is the only layer that is
not built (every layer it holds is built, so every variable already exists in the strategy's scope), it is marked
built. A container that holds an unbuilt layer is refused before training, naming those layers: their variables
would be created inside a replica's step, which a strategy cannot do. ``TFACCEL_DISABLE_COMPAT=keras_callless``
switches the fix off (Keras' own error then shows).
"""

from typing import Any, List, Optional

import keras

from tfaccel.compat import VersionWindow, is_disabled, outside_versions, switched_off
from tfaccel.compat.keras_internals import flatten_layers
from tfaccel.errors import ConfigError

__all__ = ["NAME", "AFFECTED_VERSIONS", "has_no_call", "build_callless_container"]

NAME = "keras_callless"
# [first affected, first version not known to be affected): Keras 3.0 .. 3.15.x; tests/strategies/
# test_compat_keras_callless.py reproduces the failure with the fix switched off.
AFFECTED_VERSIONS: VersionWindow = ((3, 0), (3, 16))


def has_no_call(model: Any) -> bool:
    """True when the model's class does not define ``call()`` (it inherits Keras' unimplemented one)."""
    return type(model).call is keras.Model.call


def _unbuilt_inner_layers(model: Any) -> List[str]:
    return [layer.name for layer in flatten_layers(model) if layer is not model and not layer.built]


def build_callless_container(model: Any) -> Optional[str]:
    """Marks a built-in-all-but-name container without ``call()`` built, so Keras' fit can run it under a strategy.

    Args:
        model: the user's compiled model.

    Returns:
        What was done, for the plan, or None when the model needs nothing (built, or it has a ``call()``), the Keras
        version is outside the affected ones, or the fix is switched off.

    Raises:
        ConfigError: the container holds layers that are not built yet.
    """
    if model.built or not has_no_call(model):
        return None
    if is_disabled(NAME):
        return f"{type(model).__name__} has no call() and is not built: {switched_off(NAME)}"
    if outside_versions("Keras", keras.__version__, AFFECTED_VERSIONS, "fit cannot build a model without call() "
                        "under a strategy") is not None:
        return None
    unbuilt = _unbuilt_inner_layers(model)
    if unbuilt:
        raise ConfigError(
            f"fit: model {model.name!r} ({type(model).__name__}) has no call() and holds layers that are not built "
            f"yet: {', '.join(unbuilt[:8])}. Under a tf.distribute strategy every variable must exist before the "
            "first step; give those models a keras.Input (or call them once on a batch) inside `with "
            "tfaccel.scope():`, or define call() on the model")
    model.built = True  # what Keras' own error asks the user to do; every variable it holds already exists
    return (f"{type(model).__name__} has no call(): marked built (its layers are), as Keras' symbolic build under a "
            "strategy cannot call it")
