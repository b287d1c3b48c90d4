"""Every reference model trains one epoch under tfaccel.compile_and_fit on CPU (tiny sizes, strategy="default")."""

import functools
import math

import numpy as np
import pytest

import tfaccel
from tfaccel.datasets import load_dataset
from tfaccel.models import MODEL_NAMES

# name -> (model spec, builder options, dataset, dataset options, examples, global batch, extra compile_and_fit args)
CASES = {
    "mnist_cnn": ("mnist_cnn", {"filters": 4, "hidden_units": 8}, "digits", {}, 128, 32, {}),
    # The MLP goes through a file spec, the form `--model path/to/file.py:build_model` takes.
    "mlp": ("models/mlp.py:build_model", {"hidden_units": (16,)}, "digits", {}, 128, 32, {}),
    "resnet20": ("resnet20", {"base_filters": 4}, "synthetic", {"input_shape": (16, 16, 3), "num_classes": 4},
                 32, 16, {}),
    # ResNet-50's ~180-layer step is expensive to trace, not to run: one epoch of 2 steps took 60 s with the default
    # plan (XLA + tfaccel's compiled loop), 49 s with the compiled loop without XLA and 19 s with Keras fit without
    # XLA on this 2-core CPU. It takes the cheapest path; ResNet-20 covers the same blocks on the default path.
    "resnet50": ("resnet50", {"base_filters": 8}, "synthetic", {"input_shape": (32, 32, 3), "num_classes": 4},
                 32, 16, {"jit_compile": False, "loop": "keras"}),
    "transformer": ("transformer", {"vocab_size": 40, "embed_dim": 8, "num_heads": 2, "ff_dim": 8, "num_layers": 1,
                                    "dropout": 0.0},
                    "synthetic_text", {"sequence_length": 12, "vocab_size": 40, "num_classes": 3}, 64, 32, {}),
}


def test_every_reference_model_has_a_case() -> None:
    assert set(CASES) == set(MODEL_NAMES)


@pytest.mark.parametrize("name", list(CASES))
def test_reference_model_trains_one_epoch_under_compile_and_fit(name: str, clean_tf_config: None) -> None:
    spec, options, dataset, data_options, examples, batch, extra = CASES[name]
    x, y = load_dataset(dataset, num_examples=examples, **data_options)
    num_classes = int(data_options.get("num_classes", 10))
    build = functools.partial(tfaccel.get_model_builder(spec), input_shape=x.shape[1:], num_classes=num_classes,
                              **options)

    result = tfaccel.compile_and_fit(build, (x, y), epochs=1, global_batch_size=batch, strategy="default",
                                     loss="sparse_categorical_crossentropy", metrics=["accuracy"], seed=0, verbose=0,
                                     **extra)

    assert set(result.history) == {"loss", "accuracy"}, result.history
    assert all(len(values) == 1 for values in result.history.values()), result.history
    assert np.isfinite(result.history["loss"][0]) and result.history["loss"][0] > 0, result.history
    assert 0.0 <= result.history["accuracy"][0] <= 1.0
    assert result.plan.strategy == "default" and result.plan.num_replicas == 1 and result.plan.is_chief
    assert result.plan.precision == "float32"  # CPU: "auto" keeps float32
    assert result.global_batch_size == batch
    assert result.steps_per_epoch == result.steps == math.ceil(examples / batch)
    if extra.get("loop") == "keras":
        assert result.details["loop"] == "Keras fit (asked for)" and result.plan.jit_compile is False
    probs = np.asarray(result.model(x[:4], training=False))  # eager call: predict() would trace ResNet-50 again
    assert probs.shape == (4, num_classes) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)
