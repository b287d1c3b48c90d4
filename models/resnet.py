"""ResNets from Keras layers only: ResNet-20 (and any 6n+2 depth) for 32x32 inputs, ResNet-50 for larger ones.

ResNet-20 follows He et al. 2015, section 4.2 (CIFAR-10): a 3x3 stem, three stages of basic blocks with
16/32/64 filters, global average pooling. ResNet-50 is the ImageNet bottleneck network (stages of 3/4/6/3
blocks with 64/128/256/512 filters, expansion 4). ``base_filters`` scales the width, which the tests use to
keep the networks tiny. Plain Keras 3, no distribution code; the softmax runs in float32 so the output stays
float32 under mixed policies.

Example:
    >>> model = build_resnet20(input_shape=(32, 32, 3), num_classes=10)  # doctest: +SKIP
    >>> model = build_resnet50(input_shape=(224, 224, 3), num_classes=1000)  # doctest: +SKIP
"""

from typing import Optional, Sequence

import keras
from keras import layers

_CIFAR_DEPTHS = "6n+2 (20, 32, 44, 56, 110, ...)"


def _conv_bn(x: keras.KerasTensor, filters: int, kernel: int, *, strides: int = 1, relu: bool = True,
             name: str) -> keras.KerasTensor:
    x = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                      kernel_initializer="he_normal", name=f"{name}_conv")(x)
    x = layers.BatchNormalization(name=f"{name}_bn")(x)
    return layers.Activation("relu", name=f"{name}_relu")(x) if relu else x


def _basic_block(x: keras.KerasTensor, filters: int, *, strides: int, name: str) -> keras.KerasTensor:
    shortcut = x
    y = _conv_bn(x, filters, 3, strides=strides, name=f"{name}_a")
    y = _conv_bn(y, filters, 3, relu=False, name=f"{name}_b")
    if strides != 1 or shortcut.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, strides=strides, relu=False, name=f"{name}_proj")
    return layers.Activation("relu", name=f"{name}_out")(layers.Add(name=f"{name}_add")([shortcut, y]))


def _bottleneck_block(x: keras.KerasTensor, filters: int, *, strides: int, name: str) -> keras.KerasTensor:
    shortcut = x
    y = _conv_bn(x, filters, 1, name=f"{name}_a")
    y = _conv_bn(y, filters, 3, strides=strides, name=f"{name}_b")
    y = _conv_bn(y, 4 * filters, 1, relu=False, name=f"{name}_c")
    if strides != 1 or shortcut.shape[-1] != 4 * filters:
        shortcut = _conv_bn(x, 4 * filters, 1, strides=strides, relu=False, name=f"{name}_proj")
    return layers.Activation("relu", name=f"{name}_out")(layers.Add(name=f"{name}_add")([shortcut, y]))


def _head(x: keras.KerasTensor, num_classes: int) -> keras.KerasTensor:
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dense(num_classes, name="logits")(x)
    return layers.Activation("softmax", dtype="float32", name="probabilities")(x)


def build_resnet_cifar(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10, *, depth: int = 20,
                       base_filters: int = 16) -> keras.Model:
    """Builds the uncompiled CIFAR-style ResNet of depth 6n+2 (ResNet-20 by default).

    Args:
        input_shape: image shape (height, width, channels). Defaults to (32, 32, 3).
        num_classes: number of classes. Defaults to 10.
        depth: network depth, 6n+2. Defaults to 20.
        base_filters: filters of the first stage (doubled at each of the next two). Defaults to 16.

    Returns:
        An uncompiled ``keras.Model`` with float32 class probabilities as output.

    Raises:
        ValueError: ``depth`` is not 6n+2.
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"resnet depth: must be {_CIFAR_DEPTHS} for the CIFAR ResNet; received depth={depth}")
    blocks = (depth - 2) // 6
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = _conv_bn(inputs, base_filters, 3, name="stem")
    for stage in range(3):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, base_filters * 2 ** stage, strides=strides, name=f"stage{stage + 1}_block{block + 1}")
    return keras.Model(inputs, _head(x, num_classes), name=f"resnet{depth}")


def build_resnet20(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10, *,
                   base_filters: int = 16) -> keras.Model:
    """Builds the uncompiled ResNet-20 for 32x32 images (0.27M parameters at the default width).

    Args:
        input_shape: image shape (height, width, channels). Defaults to (32, 32, 3).
        num_classes: number of classes. Defaults to 10.
        base_filters: filters of the first stage. Defaults to 16.

    Returns:
        An uncompiled ``keras.Model`` with float32 class probabilities as output.
    """
    return build_resnet_cifar(input_shape, num_classes, depth=20, base_filters=base_filters)


def build_resnet50(input_shape: Sequence[int] = (224, 224, 3), num_classes: int = 1000, *,
                   base_filters: int = 64) -> keras.Model:
    """Builds the uncompiled ImageNet ResNet-50 (25.6M parameters at the default width and 1000 classes).

    Args:
        input_shape: image shape (height, width, channels); at least 32x32 (the network downsamples by 32).
            Defaults to (224, 224, 3).
        num_classes: number of classes. Defaults to 1000.
        base_filters: filters of the stem and the first stage's bottleneck. Defaults to 64.

    Returns:
        An uncompiled ``keras.Model`` with float32 class probabilities as output.
    """
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = _conv_bn(inputs, base_filters, 7, strides=2, name="stem")
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    for stage, blocks in enumerate((3, 4, 6, 3)):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _bottleneck_block(x, base_filters * 2 ** stage, strides=strides,
                                  name=f"stage{stage + 1}_block{block + 1}")
    return keras.Model(inputs, _head(x, num_classes), name="resnet50")


def build_model(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10, *, depth: Optional[int] = None,
                base_filters: Optional[int] = None) -> keras.Model:
    """Builds a ResNet suited to the input size: ResNet-20 below 64x64 pixels, ResNet-50 from 64x64 up.

    Args:
        input_shape: image shape (height, width, channels). Defaults to (32, 32, 3).
        num_classes: number of classes. Defaults to 10.
        depth: 50 for the bottleneck ResNet-50, or 6n+2 for the CIFAR ResNet. Defaults to None (by input size).
        base_filters: width of the first stage. Defaults to None (16 for the CIFAR ResNet, 64 for ResNet-50).

    Returns:
        An uncompiled ``keras.Model`` with float32 class probabilities as output.

    Raises:
        ValueError: ``depth`` is neither 50 nor 6n+2.
    """
    if depth is None:
        depth = 20 if min(input_shape[0], input_shape[1]) < 64 else 50
    if depth == 50:
        return build_resnet50(input_shape, num_classes, base_filters=base_filters or 64)
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"resnet depth: must be 50 or {_CIFAR_DEPTHS}; received depth={depth}")
    return build_resnet_cifar(input_shape, num_classes, depth=depth, base_filters=base_filters or 16)
