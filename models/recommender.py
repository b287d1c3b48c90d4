"""A DLRM-style click model with a large user embedding table, and clicks it can learn.

Sparse features (user id, item id) go through embedding tables (``num_users`` rows, 100,000 by default: the
workload the parameter-server path exists for), dense features through a bottom MLP; the three vectors
interact by pairwise dot products (DLRM, Naumov et al. 2019), and a top MLP with an L2 kernel regulariser outputs
the click probability. :func:`make_data` draws clicks from hidden item factors, dense features and a small user
effect, so a model learns them from the item table, the dense features and the users it has seen. No
distribution code.

Example:
    >>> model = build_model(num_users=100_000)  # doctest: +SKIP
    >>> x, y = make_data(4096)  # doctest: +SKIP
"""

from typing import Dict, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import layers, ops

DENSE_FEATURES = 8


def build_model(input_shape: Sequence[int] = (DENSE_FEATURES,), num_classes: int = 1, *, num_users: int = 100_000,
                num_items: int = 1000, embedding_dim: int = 16, hidden_units: int = 32,
                l2: float = 1e-4) -> keras.Model:
    """Builds the uncompiled DLRM-style model.

    Args:
        input_shape: ``(dense_features,)``. Defaults to (8,).
        num_classes: 1 (a click probability). Defaults to 1.
        num_users: rows of the user embedding table. Defaults to 100,000.
        num_items: rows of the item embedding table. Defaults to 1000.
        embedding_dim: width of every embedding and of the bottom MLP's output. Defaults to 16.
        hidden_units: hidden units of the bottom and top MLPs. Defaults to 32.
        l2: L2 factor of the top MLP's kernel regulariser (0 drops it). Defaults to 1e-4.

    Returns:
        An uncompiled ``keras.Model`` with inputs ``user``, ``item`` (int32 ids) and ``dense`` (float32), and a
        float32 sigmoid output of shape (batch, 1).

    Raises:
        ValueError: ``num_classes`` is not 1.
    """
    if num_classes != 1:
        raise ValueError(f"recommender num_classes: the model predicts one click probability; received {num_classes}")
    user = keras.Input((), dtype="int32", name="user")
    item = keras.Input((), dtype="int32", name="item")
    dense = keras.Input(tuple(input_shape), name="dense")
    vectors = [layers.Embedding(num_users, embedding_dim, name="user_embedding")(user),
               layers.Embedding(num_items, embedding_dim, name="item_embedding")(item)]
    bottom = layers.Dense(hidden_units, activation="relu", name="bottom_hidden")(dense)
    vectors.append(layers.Dense(embedding_dim, activation="relu", name="bottom_out")(bottom))
    dots = [ops.sum(vectors[i] * vectors[j], axis=-1, keepdims=True)
            for i in range(len(vectors)) for j in range(i + 1, len(vectors))]
    features = layers.Concatenate(name="interaction")([vectors[2], *dots])
    regularizer = keras.regularizers.L2(l2) if l2 else None
    top = layers.Dense(hidden_units, activation="relu", kernel_regularizer=regularizer, name="top_hidden")(features)
    outputs = layers.Dense(1, activation="sigmoid", dtype="float32", kernel_regularizer=regularizer, name="click")(top)
    return keras.Model({"user": user, "item": item, "dense": dense}, outputs, name="dlrm")


def compile_model(model: keras.Model, *, learning_rate: float = 1e-2,
                  optimizer: Optional[keras.optimizers.Optimizer] = None) -> keras.Model:
    """Compiles with Adam, binary cross-entropy and AUC + accuracy.

    Args:
        model: the model from :func:`build_model`.
        learning_rate: Adam's rate. Defaults to 1e-2.
        optimizer: the optimizer to train with instead of Adam (``learning_rate`` is then unused). Defaults
            to None (Adam at ``learning_rate``).

    Returns:
        The model, compiled.
    """
    model.compile(optimizer=optimizer or keras.optimizers.Adam(learning_rate), loss="binary_crossentropy",
                  metrics=[keras.metrics.BinaryAccuracy(name="accuracy"), keras.metrics.AUC(name="auc")])
    return model


def make_data(num_examples: int, *, num_users: int = 100_000, num_items: int = 1000,
              seed: int = 0) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Seeded impressions and clicks: a click is likelier where the item's hidden factors match the dense features.

    Args:
        num_examples: impressions to make.
        num_users: user ids lie in [0, num_users). Defaults to 100,000.
        num_items: item ids lie in [0, num_items). Defaults to 1000.
        seed: the data's seed (the hidden factors are fixed). Defaults to 0.

    Returns:
        ``(x, y)``: ``x`` the dict of int32 ``user`` and ``item`` ids and float32 ``dense`` features, ``y``
        float32 clicks (0 or 1) of shape (num_examples, 1).
    """
    hidden = np.random.default_rng(2468)
    item_factors = hidden.normal(size=(num_items, DENSE_FEATURES))
    user_bias = 0.5 * hidden.normal(size=num_users)
    rng = np.random.default_rng(seed)
    user = rng.integers(0, num_users, size=num_examples).astype("int32")
    item = rng.integers(0, num_items, size=num_examples).astype("int32")
    dense = rng.normal(size=(num_examples, DENSE_FEATURES)).astype("float32")
    logit = np.sum(item_factors[item] * dense, axis=1) + user_bias[user]
    clicks = (rng.uniform(size=num_examples) < 1.0 / (1.0 + np.exp(-logit))).astype("float32")
    return {"user": user, "item": item, "dense": dense}, clicks[:, None]
