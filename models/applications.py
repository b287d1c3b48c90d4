"""keras.applications image classifiers from their configs (``weights=None``: nothing downloaded) and images.

``build_resnet50`` is ``keras.applications.ResNet50`` and ``build_mobilenet_v3_small`` is
``keras.applications.MobileNetV3Small``, both with randomly initialised weights, any input size from 32x32 and
a float32 softmax output. :func:`make_data` makes seeded images a classifier can learn: each class is a fixed
smooth colour pattern, and every image is its class's pattern under Gaussian noise. No distribution code.

Example:
    >>> model = build_mobilenet_v3_small(input_shape=(32, 32, 3), num_classes=10)  # doctest: +SKIP
    >>> x, y = make_data(320, input_shape=(32, 32, 3), num_classes=10)  # doctest: +SKIP
"""

from typing import Sequence, Tuple

import keras
import numpy as np


def build_resnet50(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10) -> keras.Model:
    """Builds the uncompiled ``keras.applications.ResNet50`` (23.6M parameters at 10 classes), ``weights=None``.

    Args:
        input_shape: image shape (height, width, 3), at least 32x32. Defaults to (32, 32, 3).
        num_classes: number of classes. Defaults to 10.

    Returns:
        An uncompiled ``keras.Model`` with float32 class probabilities as output.
    """
    return keras.applications.ResNet50(weights=None, input_shape=tuple(input_shape), classes=num_classes,
                                       classifier_activation="softmax")


def build_mobilenet_v3_small(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10, *,
                             dropout: float = 0.2) -> keras.Model:
    """Builds the uncompiled ``keras.applications.MobileNetV3Small``, ``weights=None``, inputs in [0, 1].

    Args:
        input_shape: image shape (height, width, 3), at least 32x32. Defaults to (32, 32, 3).
        num_classes: number of classes. Defaults to 10.
        dropout: dropout before the classifier (the application's own default). Defaults to 0.2.

    Returns:
        An uncompiled ``keras.Model`` with float32 class probabilities as output.
    """
    return keras.applications.MobileNetV3Small(
        weights=None, input_shape=tuple(input_shape), classes=num_classes, dropout_rate=dropout,
        include_preprocessing=False, classifier_activation="softmax")


def make_data(num_examples: int, *, input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10,
              seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Seeded images: each class a fixed smooth colour pattern, each image its class's pattern plus noise.

    Args:
        num_examples: images to make.
        input_shape: (height, width, channels). Defaults to (32, 32, 3).
        num_classes: number of classes. Defaults to 10.
        seed: the data's seed (the class patterns are fixed). Defaults to 0.

    Returns:
        ``(x, y)``: float32 images of shape (num_examples, *input_shape), about in [0, 1]; int32 labels.
    """
    height, width, channels = (int(d) for d in input_shape)
    coarse = np.random.default_rng(4321).uniform(0.0, 1.0, size=(num_classes, 4, 4, channels))
    rows = np.minimum(np.arange(height) * 4 // height, 3)
    cols = np.minimum(np.arange(width) * 4 // width, 3)
    patterns = coarse[:, rows][:, :, cols]
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, size=num_examples).astype("int32")
    x = 0.6 * patterns[y] + 0.4 * rng.uniform(0.0, 1.0, size=(num_examples, height, width, channels))
    return x.astype("float32"), y
