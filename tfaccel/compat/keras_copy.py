"""``copy_model``: a new model of the same class, config and structure, where ``keras.models.clone_model`` makes
another (seen on Keras 3.15.1; tests/strategies/test_compat_keras_copy.py fails when that changes).

``clone_model`` rebuilds every Functional model layer by layer as a plain ``Functional``: a Functional *subclass*
loses its class (keras-team/keras#21099 describes it), and a layer called both inside a nested model and outside it
is made twice, its weights untied. KerasHub's ``GPT2CausalLM`` calls its backbone's token embedding again as its
output layer: the clone has 37 trainable variables, the model 36, and ``tfaccel memory`` counted 8,192 bytes of Adam
slots too many on the test-size GPT-2.
"""

from typing import Any

import keras
from keras.src.models.functional import Functional

__all__ = ["copy_model"]


def copy_model(model: Any) -> Any:
    """A new model of the same class, config and structure (fresh weights, not compiled by the copy).

    Plain ``Functional`` and ``Sequential`` models are cloned by ``keras.models.clone_model``; every other class is
    rebuilt from its own ``get_config`` (what ``clone_model`` does for a subclassed model), without its compile
    config.

    Args:
        model: a built ``keras.Model``.

    Returns:
        The copy.
    """
    if type(model) is Functional or isinstance(model, keras.Sequential):
        return keras.models.clone_model(model)
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)
    return keras.saving.deserialize_keras_object(config, custom_objects={type(model).__name__: type(model)})
