"""A small KerasHub GPT-2-style causal LM (``GPT2Backbone`` + ``GPT2CausalLM``, ``preprocessor=None``) and text.

Built from a config, nothing downloaded. The inputs are what GPT-2's preprocessor would produce
(``token_ids``, ``padding_mask``); the labels are the next tokens. The text is seeded arithmetic sequences
(``t[i+1] = (t[i] + step) mod vocab``, a step per sequence), which a causal LM learns to continue. Needs the
``hub`` extra (``scripts/install_hub.sh``). No distribution code.

Example:
    >>> model = compile_model(build_model(input_shape=(32,)))  # doctest: +SKIP
    >>> model.fit(*make_data(512, sequence_length=32), batch_size=16)  # doctest: +SKIP
"""

from typing import Dict, Optional, Sequence, Tuple

import keras
import numpy as np


def build_model(input_shape: Sequence[int] = (32,), num_classes: int = 128, *, num_layers: int = 2,
                num_heads: int = 2, hidden_dim: int = 32, intermediate_dim: int = 64,
                dropout: float = 0.0) -> keras.Model:
    """Builds the uncompiled GPT2CausalLM.

    Args:
        input_shape: ``(sequence_length,)`` of the token ids. Defaults to (32,).
        num_classes: the vocabulary size (the LM classifies every position over it). Defaults to 128.
        num_layers: transformer decoder layers. Defaults to 2.
        num_heads: attention heads per layer. Defaults to 2.
        hidden_dim: width of the embeddings and layers. Defaults to 32.
        intermediate_dim: hidden units of each feed-forward block. Defaults to 64.
        dropout: dropout of the backbone. Defaults to 0.0.

    Returns:
        An uncompiled ``keras_hub.models.GPT2CausalLM`` that outputs logits of shape (batch, sequence, vocab).
    """
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=num_classes, num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
        intermediate_dim=intermediate_dim, max_sequence_length=int(input_shape[0]), dropout=dropout)
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def compile_model(model: keras.Model, *, learning_rate: float = 1e-3,
                  optimizer: Optional[keras.optimizers.Optimizer] = None) -> keras.Model:
    """Compiles with KerasHub's own "auto" loss and weighted metrics and Adam at ``learning_rate``.

    Args:
        model: the LM from :func:`build_model`.
        learning_rate: Adam's rate (KerasHub's default of 2e-5 suits fine-tuning, not training from scratch).
            Defaults to 1e-3.
        optimizer: the optimizer to train with instead of Adam (``learning_rate`` is then unused). Defaults
            to None (Adam at ``learning_rate``).

    Returns:
        The model, compiled.
    """
    model.compile(optimizer=optimizer or keras.optimizers.Adam(learning_rate))
    return model


def make_data(num_examples: int, *, sequence_length: int = 32, vocab_size: int = 128,
              seed: int = 0) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Seeded arithmetic token sequences and their next tokens.

    Args:
        num_examples: sequences to make.
        sequence_length: tokens per input sequence. Defaults to 32.
        vocab_size: token ids lie in [0, vocab_size). Defaults to 128.
        seed: the data's seed. Defaults to 0.

    Returns:
        ``(x, y)``: ``x`` the dict of int32 ``token_ids`` and ``padding_mask`` (all ones), ``y`` the int32 next
        tokens, shape (num_examples, sequence_length).
    """
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab_size, size=(num_examples, 1))
    step = rng.integers(1, 4, size=(num_examples, 1))
    sequences = ((start + step * np.arange(sequence_length + 1)[None, :]) % vocab_size).astype("int32")
    x = {"token_ids": sequences[:, :-1], "padding_mask": np.ones((num_examples, sequence_length), "int32")}
    return x, sequences[:, 1:]
