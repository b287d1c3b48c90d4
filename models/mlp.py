"""A multi-layer perceptron classifier: Flatten -> Dense relu (xN) -> Dense -> softmax.

A plain Keras 3 builder with no distribution code. The softmax runs in float32 so the output stays float32
under mixed policies.

Example:
    >>> model = build_model(input_shape=(28, 28, 1), num_classes=10, hidden_units=(128,))  # doctest: +SKIP
"""

from typing import Sequence

import keras
from keras import layers


def build_model(input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 10, *,
                hidden_units: Sequence[int] = (128,), dropout: float = 0.0) -> keras.Model:
    """Builds the uncompiled MLP.

    Args:
        input_shape: shape of one example; flattened first. Defaults to (28, 28, 1).
        num_classes: number of classes. Defaults to 10.
        hidden_units: units of each hidden relu layer, in order. Defaults to (128,).
        dropout: dropout rate after each hidden layer (0 disables it). Defaults to 0.0.

    Returns:
        An uncompiled ``keras.Model`` whose output is float32 class probabilities of shape (batch, num_classes).
    """
    if isinstance(hidden_units, int):
        hidden_units = (hidden_units,)
    inputs = keras.Input(shape=tuple(input_shape), name="features")
    x = layers.Flatten(name="flatten")(inputs)
    for i, units in enumerate(hidden_units):
        x = layers.Dense(int(units), activation="relu", name=f"hidden_{i}")(x)
        if dropout:
            x = layers.Dropout(dropout, name=f"dropout_{i}")(x)
    x = layers.Dense(num_classes, name="logits")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="mlp")
