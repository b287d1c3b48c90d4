"""The real-model suite: KerasHub BERT and GPT-2, keras.applications ResNet50 and MobileNetV3Small, a DLRM model.

Each entry names a builder file in the repository's ``models/`` folder (loaded like every reference model, see
:mod:`tfaccel.models`), how the model is compiled, what data it learns (made by the model file itself: nothing is
downloaded at run time) and two job sizes: ``"test"`` (tiny, for the parity tests on a 2-core machine) and
``"bench"`` (the job ``tfaccel bench`` times). The KerasHub models need the ``hub`` extra
(``pip install -e '.[cpu,hub]' && bash scripts/install_hub.sh .venv``).

Example:
    >>> from tfaccel.real_suite import REAL_MODELS, get_real_model
    >>> spec = get_real_model("recommender")
    >>> model = spec.build("test")  # doctest: +SKIP
    >>> x, y = spec.data("test")  # doctest: +SKIP
"""

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

from tfaccel.errors import invalid_choice
from tfaccel.models import get_model_builder

SIZES: Tuple[str, ...] = ("test", "bench")
"""Job sizes every real model has."""


@dataclasses.dataclass(frozen=True)
class RealJob:
    """One size of a real model's job.

    Attributes:
        examples: training examples.
        batch_size: global batch size.
        epochs: epochs.
        model_options: keyword options of the builder (sizes of the network).
        data_options: keyword options of the model file's ``make_data``.
    """

    examples: int
    batch_size: int
    epochs: int
    model_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    data_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RealModel:
    """A model of the suite: where its builder is, how it is compiled and what it learns.

    Attributes:
        name: the suite's name for it.
        description: what it is, in a few words.
        builder: ``"models/<file>.py:<function>"``.
        jobs: ``{size: RealJob}`` for every size in :data:`SIZES`.
        loss: the loss passed to ``compile`` (with SGD, momentum 0.9, and accuracy); None: the model file's
            ``compile_model`` compiles it (Adam).
        learning_rate: the optimizer's rate.
    """

    name: str
    description: str
    builder: str
    jobs: Mapping[str, RealJob]
    loss: Optional[str] = None
    learning_rate: float = 1e-3

    def job(self, size: str) -> RealJob:
        """The job of one size (``"test"`` or ``"bench"``); a ``ConfigError`` for another."""
        if size not in self.jobs:
            raise invalid_choice(f"real model {self.name!r} size", size, SIZES)
        return self.jobs[size]

    def _module_attr(self, attribute: str) -> Any:
        return get_model_builder(f"{self.builder.rpartition(':')[0]}:{attribute}")

    def build(self, size: str, *, learning_rate: Optional[float] = None, optimizer: Any = None,
              **overrides: Any) -> Any:
        """Builds and compiles the model of one size (call it inside a strategy scope, as any model).

        Args:
            size: ``"test"`` or ``"bench"``.
            learning_rate: the optimizer's rate. Defaults to None (the suite's).
            optimizer: a ``keras.optimizers.Optimizer`` to compile with instead of the suite's (``learning_rate`` is
                then unused). Defaults to None.
            **overrides: builder options that replace the size's (e.g. ``l2=0.0``).

        Returns:
            The compiled ``keras.Model``.
        """
        import keras

        model = get_model_builder(self.builder)(**{**self.job(size).model_options, **overrides})
        rate = self.learning_rate if learning_rate is None else learning_rate
        if self.loss is None:
            return self._module_attr("compile_model")(model, learning_rate=rate, optimizer=optimizer)
        # SGD with momentum, as these networks are usually trained: Adam divides by the root of the squared
        # gradients, which turns float-level noise in near-zero gradients into whole-step differences.
        model.compile(optimizer=optimizer or keras.optimizers.SGD(rate, momentum=0.9), loss=self.loss,
                      metrics=["accuracy"])
        return model

    def data(self, size: str, *, num_examples: Optional[int] = None, seed: int = 0) -> Tuple[Any, Any]:
        """The ``(x, y)`` the model learns, made by its file's ``make_data`` (seeded, nothing downloaded).

        Args:
            size: ``"test"`` or ``"bench"``.
            num_examples: how many. Defaults to None (the job's ``examples``).
            seed: the data's seed. Defaults to 0.

        Returns:
            ``(x, y)`` NumPy arrays, or a dict of arrays and an array.
        """
        job = self.job(size)
        count = job.examples if num_examples is None else num_examples
        return self._module_attr("make_data")(count, seed=seed, **job.data_options)


def _text(length: int, **model: Any) -> Dict[str, Any]:
    return {"input_shape": (length,), **model}


REAL_MODELS: Dict[str, RealModel] = {m.name: m for m in [
    RealModel(
        "bert_classifier", "KerasHub BertTextClassifier (BertBackbone, preprocessor=None)",
        "models/bert_classifier.py:build_model",
        {"test": RealJob(64, 16, 2, _text(16, vocab_size=100, hidden_dim=16, intermediate_dim=32),
                         {"sequence_length": 16, "vocab_size": 100}),
         "bench": RealJob(768, 32, 3, _text(24, vocab_size=200, hidden_dim=32, intermediate_dim=64),
                          {"sequence_length": 24, "vocab_size": 200})}),
    RealModel(
        "gpt2_causal_lm", "KerasHub GPT2CausalLM (GPT2Backbone, preprocessor=None)",
        "models/gpt2_lm.py:build_model",
        {"test": RealJob(64, 16, 2, _text(16, num_classes=64, hidden_dim=16, intermediate_dim=32),
                         {"sequence_length": 16, "vocab_size": 64}),
         "bench": RealJob(512, 16, 3, _text(32, num_classes=128, hidden_dim=64, intermediate_dim=128),
                          {"sequence_length": 32, "vocab_size": 128})}),
    RealModel(
        "resnet50", "keras.applications.ResNet50, weights=None", "models/applications.py:build_resnet50",
        {"test": RealJob(32, 16, 3, {"input_shape": (32, 32, 3), "num_classes": 10},
                         {"input_shape": (32, 32, 3), "num_classes": 10}),
         "bench": RealJob(320, 32, 3, {"input_shape": (32, 32, 3), "num_classes": 10},
                          {"input_shape": (32, 32, 3), "num_classes": 10})},
        loss="sparse_categorical_crossentropy", learning_rate=0.01),
    RealModel(
        "mobilenet_v3_small", "keras.applications.MobileNetV3Small, weights=None",
        "models/applications.py:build_mobilenet_v3_small",
        {"test": RealJob(32, 16, 3, {"input_shape": (32, 32, 3), "num_classes": 10},
                         {"input_shape": (32, 32, 3), "num_classes": 10}),
         "bench": RealJob(320, 32, 3, {"input_shape": (64, 64, 3), "num_classes": 10},
                          {"input_shape": (64, 64, 3), "num_classes": 10})},
        loss="sparse_categorical_crossentropy", learning_rate=0.05),
    RealModel(
        "recommender", "DLRM-style click model, 100,000-row user embedding table",
        "models/recommender.py:build_model",
        {"test": RealJob(128, 32, 2, {"num_users": 100_000, "embedding_dim": 8, "hidden_units": 16},
                         {"num_users": 100_000}),
         "bench": RealJob(4096, 64, 3, {"num_users": 100_000}, {"num_users": 100_000})},
        learning_rate=1e-2),
]}
"""Every model of the suite by name (the one source of truth for the names)."""

REAL_MODEL_NAMES: Tuple[str, ...] = tuple(REAL_MODELS)


def get_real_model(name: str) -> RealModel:
    """The suite's entry for ``name``.

    Args:
        name: one of :data:`REAL_MODEL_NAMES`.

    Returns:
        The :class:`RealModel`.

    Raises:
        ConfigError: the name is unknown (the message lists the names).
    """
    if name not in REAL_MODELS:
        raise invalid_choice("real model", name, REAL_MODEL_NAMES)
    return REAL_MODELS[name]


__all__ = ["REAL_MODELS", "REAL_MODEL_NAMES", "RealJob", "RealModel", "SIZES", "get_real_model"]
