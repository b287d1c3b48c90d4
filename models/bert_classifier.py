"""A small KerasHub ``BertTextClassifier`` (BertBackbone, ``preprocessor=None``) and text it can learn.

Built from a config, nothing downloaded: the backbone's size is given here, and the inputs are the token ids a
BERT preprocessor would produce (``token_ids``, ``segment_ids``, ``padding_mask``). The classifier outputs logits
(KerasHub's default); KerasHub's own ``compile()`` defaults ("auto" loss and metrics) fit it. Needs the ``hub``
extra (``scripts/install_hub.sh``). No distribution code.

Example:
    >>> model = build_model(input_shape=(24,), num_classes=2)  # doctest: +SKIP
    >>> compile_model(model)  # doctest: +SKIP
    >>> model.fit(*make_data(768, sequence_length=24), batch_size=32)  # doctest: +SKIP
"""

from typing import Any, Dict, Optional, Sequence, Tuple

import keras
import numpy as np


def build_model(input_shape: Sequence[int] = (24,), num_classes: int = 2, *, vocab_size: int = 200,
                num_layers: int = 2, num_heads: int = 2, hidden_dim: int = 32, intermediate_dim: int = 64,
                dropout: float = 0.0) -> keras.Model:
    """Builds the uncompiled BertTextClassifier.

    Args:
        input_shape: ``(sequence_length,)`` of the token ids. Defaults to (24,).
        num_classes: number of classes. Defaults to 2.
        vocab_size: token ids lie in [0, vocab_size). Defaults to 200.
        num_layers: transformer layers. Defaults to 2.
        num_heads: attention heads per layer. Defaults to 2.
        hidden_dim: width of the embeddings and layers. Defaults to 32.
        intermediate_dim: hidden units of each feed-forward block. Defaults to 64.
        dropout: dropout of the backbone and the classifier head. Defaults to 0.0.

    Returns:
        An uncompiled ``keras_hub.models.BertTextClassifier`` that outputs logits of shape (batch, num_classes).
    """
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=vocab_size, num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim, max_sequence_length=int(input_shape[0]), dropout=dropout)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=num_classes, preprocessor=None, dropout=dropout)


def compile_model(model: keras.Model, *, learning_rate: float = 1e-3,
                  optimizer: Optional[keras.optimizers.Optimizer] = None) -> keras.Model:
    """Compiles with KerasHub's own "auto" loss and metrics and Adam at ``learning_rate``.

    Args:
        model: the classifier from :func:`build_model`.
        learning_rate: Adam's rate (KerasHub's default of 5e-5 suits fine-tuning, not training from scratch).
            Defaults to 1e-3.
        optimizer: the optimizer to train with instead of Adam (``learning_rate`` is then unused). Defaults
            to None (Adam at ``learning_rate``).

    Returns:
        The model, compiled.
    """
    model.compile(optimizer=optimizer or keras.optimizers.Adam(learning_rate))
    return model


def make_data(num_examples: int, *, sequence_length: int = 24, vocab_size: int = 200, num_classes: int = 2,
              seed: int = 0) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Seeded sentences whose label is the class most of their tokens vote for (a fixed token -> class table).

    Args:
        num_examples: sentences to make.
        sequence_length: tokens per sentence (each padded to it: the padding mask ends with zeros). Defaults to 24.
        vocab_size: token ids lie in [1, vocab_size) (0 is padding). Defaults to 200.
        num_classes: number of classes. Defaults to 2.
        seed: the data's seed. Defaults to 0.

    Returns:
        ``(x, y)``: ``x`` the dict of int32 ``token_ids``, ``segment_ids`` and ``padding_mask``, ``y`` int32 labels.
    """
    rng = np.random.default_rng(seed)
    table = np.random.default_rng(12345).integers(0, num_classes, size=vocab_size)
    tokens = rng.integers(1, vocab_size, size=(num_examples, sequence_length))
    lengths = rng.integers(sequence_length // 2, sequence_length + 1, size=num_examples)
    mask = (np.arange(sequence_length)[None, :] < lengths[:, None]).astype("int32")
    tokens = (tokens * mask).astype("int32")
    votes = np.stack([((table[tokens] == c) & (mask == 1)).sum(axis=1) for c in range(num_classes)], axis=1)
    x: Dict[str, Any] = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens), "padding_mask": mask}
    return x, np.argmax(votes, axis=1).astype("int32")
