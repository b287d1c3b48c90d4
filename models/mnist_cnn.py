"""The seed's MNIST CNN: Conv2D 32 3x3 relu -> MaxPool -> Flatten -> Dense 64 relu -> Dense 10 -> softmax.

A plain Keras 3 builder with no distribution code. The softmax runs in float32 (a separate
``Activation(dtype="float32")``) so the output stays float32 under ``mixed_float16`` / ``mixed_bfloat16``.

Example:
    >>> model = build_model(input_shape=(28, 28, 1), num_classes=10)  # doctest: +SKIP
"""

from typing import Sequence

import keras
from keras import layers


def build_model(input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 10, *, filters: int = 32,
                hidden_units: int = 64) -> keras.Model:
    """Builds the uncompiled MNIST CNN.

    Args:
        input_shape: image shape (height, width, channels). Defaults to (28, 28, 1).
        num_classes: number of classes. Defaults to 10.
        filters: filters of the 3x3 convolution. Defaults to 32.
        hidden_units: units of the hidden dense layer. Defaults to 64.

    Returns:
        An uncompiled ``keras.Model`` whose output is float32 class probabilities of shape (batch, num_classes).
    """
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = layers.Conv2D(filters, 3, activation="relu", name="conv")(inputs)
    x = layers.MaxPooling2D(2, name="pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(hidden_units, activation="relu", name="hidden")(x)
    x = layers.Dense(num_classes, name="logits")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="mnist_cnn")
