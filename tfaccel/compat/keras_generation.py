"""Which Keras a model comes from: tfaccel trains Keras 3 models; a Keras 2 (tf_keras) one gets a clear refusal.

tf_keras (Keras 2, what ``tf.keras`` is under ``TF_USE_LEGACY_KERAS=1``) models are not ``keras.Model`` (Keras 3)
instances; without this check ``tfaccel.fit`` would say "the model is not compiled" about a compiled one. Their
classes live in ``tf_keras.src.engine...`` (or ``keras.src.engine`` / ``keras.engine`` for Keras 2.13-2.15,
``tensorflow.python.keras`` for TF's own old copy); Keras 3 has no ``engine`` package.
"""

from typing import Any, Optional

from tfaccel.errors import ConfigError

__all__ = ["keras2_flavour", "check_keras3_model"]

_KERAS2_MODULES = (("tf_keras", "tf_keras (Keras 2)"), ("keras.src.engine", "Keras 2"), ("keras.engine", "Keras 2"),
                   ("tensorflow.python.keras", "TensorFlow's legacy tf.keras (Keras 2)"))


def keras2_flavour(obj: Any) -> Optional[str]:
    """``"tf_keras (Keras 2)"`` (or another Keras 2 flavour) when ``obj`` is a Keras 2 object, else None."""
    for cls in type(obj).__mro__:
        module = getattr(cls, "__module__", None) or ""
        for prefix, flavour in _KERAS2_MODULES:
            if module == prefix or module.startswith(prefix + "."):
                return flavour
    return None


def check_keras3_model(model: Any, *, where: str = "fit") -> None:
    """Refuses a Keras 2 model with what it is and what to do instead.

    Args:
        model: what the user passed as the model. where: the call, for the message.

    Raises:
        ConfigError: ``model`` is a tf_keras / Keras 2 model.
    """
    flavour = keras2_flavour(model)
    if flavour is None:
        return
    cls = type(model)
    raise ConfigError(
        f"{where}: the model is a {flavour} model ({cls.__module__}.{cls.__qualname__}); tfaccel.fit and "
        "compile_and_fit train Keras 3 models (import keras, keras>=3). Either keep Keras 2 and train with your own "
        "model.fit inside `with tfaccel.get_strategy().scope():` (build and compile the model there too), or move to "
        "Keras 3: unset TF_USE_LEGACY_KERAS and build the model with `import keras`")
