"""A small Transformer text classifier: token + position embeddings, N encoder blocks, mean pooling, softmax.

Input: integer token ids of shape (batch, sequence_length). Keras layers and ops only (no custom layer, so
the model saves and loads without registering anything); no distribution code. The softmax runs in float32
so the output stays float32 under mixed policies.

Example:
    >>> model = build_model(input_shape=(64,), num_classes=2, vocab_size=1000)  # doctest: +SKIP
"""

from typing import Sequence

import keras
from keras import layers, ops


def _encoder_block(x: keras.KerasTensor, *, embed_dim: int, num_heads: int, ff_dim: int, dropout: float,
                   name: str) -> keras.KerasTensor:
    attention = layers.MultiHeadAttention(num_heads=num_heads, key_dim=max(1, embed_dim // num_heads),
                                          dropout=dropout, name=f"{name}_attention")(x, x)
    if dropout:
        attention = layers.Dropout(dropout, name=f"{name}_attention_dropout")(attention)
    x = layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm1")(layers.Add(name=f"{name}_add1")([x, attention]))
    ff = layers.Dense(ff_dim, activation="relu", name=f"{name}_ff1")(x)
    ff = layers.Dense(embed_dim, name=f"{name}_ff2")(ff)
    if dropout:
        ff = layers.Dropout(dropout, name=f"{name}_ff_dropout")(ff)
    return layers.LayerNormalization(epsilon=1e-6, name=f"{name}_norm2")(layers.Add(name=f"{name}_add2")([x, ff]))


def build_model(input_shape: Sequence[int] = (64,), num_classes: int = 2, *, vocab_size: int = 1000,
                embed_dim: int = 64, num_heads: int = 4, ff_dim: int = 128, num_layers: int = 2,
                dropout: float = 0.1) -> keras.Model:
    """Builds the uncompiled Transformer encoder classifier.

    Args:
        input_shape: ``(sequence_length,)`` of the integer token ids. Defaults to (64,).
        num_classes: number of classes. Defaults to 2.
        vocab_size: number of distinct token ids (ids must be in [0, vocab_size)). Defaults to 1000.
        embed_dim: width of the embeddings and of each block. Defaults to 64.
        num_heads: attention heads per block. Defaults to 4.
        ff_dim: hidden units of each block's feed-forward network. Defaults to 128.
        num_layers: number of encoder blocks. Defaults to 2.
        dropout: dropout rate in the blocks. Defaults to 0.1.

    Returns:
        An uncompiled ``keras.Model`` with float32 class probabilities as output.

    Raises:
        ValueError: ``input_shape`` is not one-dimensional.
    """
    input_shape = tuple(input_shape)
    if len(input_shape) != 1:
        raise ValueError(f"transformer input_shape: must be (sequence_length,); received input_shape={input_shape}")
    sequence_length = int(input_shape[0])
    tokens = keras.Input(shape=input_shape, dtype="int32", name="tokens")
    # Position ids 0..L-1 computed from the input symbolically, so they stay part of the functional graph.
    positions = ops.cumsum(ops.ones_like(tokens), axis=1) - 1
    x = layers.Embedding(vocab_size, embed_dim, name="token_embedding")(tokens)
    x = x + layers.Embedding(sequence_length, embed_dim, name="position_embedding")(positions)
    for i in range(num_layers):
        x = _encoder_block(x, embed_dim=embed_dim, num_heads=num_heads, ff_dim=ff_dim, dropout=dropout,
                           name=f"encoder{i + 1}")
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    x = layers.Dense(num_classes, name="logits")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(tokens, outputs, name="transformer")
