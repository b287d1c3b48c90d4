"""Every reference model builds, trains one epoch under plain Keras fit on CPU, and outputs float32 under mixed
policies. compile_and_fit integration lives with the lead's tests."""

from typing import Any, Dict, Tuple

import keras
import numpy as np
import pytest

from tfaccel.datasets import load_dataset
from tfaccel.models import MODEL_NAMES, build_model

# name -> (input_shape, num_classes, tiny size options, dataset name, dataset options)
TINY: Dict[str, Tuple[Tuple[int, ...], int, Dict[str, Any], str, Dict[str, Any]]] = {
    "mnist_cnn": ((8, 8, 1), 10, {"filters": 4, "hidden_units": 8}, "digits", {}),
    "mlp": ((8, 8, 1), 10, {"hidden_units": (16, 8), "dropout": 0.1}, "digits", {}),
    "resnet20": ((16, 16, 3), 4, {"base_filters": 4}, "synthetic", {"input_shape": (16, 16, 3), "num_classes": 4}),
    "resnet50": ((32, 32, 3), 4, {"base_filters": 2}, "synthetic", {"input_shape": (32, 32, 3), "num_classes": 4}),
    "transformer": ((12,), 3, {"vocab_size": 40, "embed_dim": 8, "num_heads": 2, "ff_dim": 8, "num_layers": 1},
                    "synthetic_text", {"sequence_length": 12, "vocab_size": 40, "num_classes": 3}),
}


def test_every_builtin_model_has_a_tiny_config() -> None:
    assert set(TINY) == set(MODEL_NAMES)


@pytest.fixture
def restore_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_trains_one_epoch_with_plain_keras_fit(name: str) -> None:
    input_shape, num_classes, options, dataset, data_options = TINY[name]
    x, y = load_dataset(dataset, num_examples=32, **data_options)
    model = build_model(name, input_shape=input_shape, num_classes=num_classes, **options)
    assert isinstance(model, keras.Model)
    assert model.input_shape[1:] == input_shape
    assert model.output_shape == (None, num_classes)
    # ResNet-50 runs eagerly: tracing its ~180-layer train step costs ~16 s on this CPU against ~3 s eager, and
    # ResNet-20 already covers the same blocks in graph mode.
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False, run_eagerly=name == "resnet50")
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    probs = model.predict(x[:4], verbose=0)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)  # softmax probabilities


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_output_is_float32_under_mixed_policy(name: str, policy: str, restore_policy: None) -> None:
    input_shape, num_classes, options, dataset, data_options = TINY[name]
    keras.mixed_precision.set_global_policy(policy)
    model = build_model(name, input_shape=input_shape, num_classes=num_classes, **options)
    compute = policy.split("_")[1]
    assert any(layer.compute_dtype == compute for layer in model.layers)  # the body really runs mixed
    assert model.output.dtype == "float32"
    x, _ = load_dataset(dataset, num_examples=2, **data_options)
    out = model(x, training=False)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


def test_mlp_learns_digits() -> None:
    x, y = load_dataset("digits")
    x_test, y_test = load_dataset("digits", split="test")
    model = build_model("mlp", input_shape=(8, 8, 1), num_classes=10, hidden_units=(32,))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=64, epochs=5, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    assert accuracy > 0.85


def test_resnet_depths_and_parameter_counts() -> None:
    import importlib.util

    from tfaccel.models import models_dir

    spec = importlib.util.spec_from_file_location("_resnet_under_test", models_dir() / "resnet.py")
    resnet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(resnet)
    assert resnet.build_resnet20().count_params() == 274_042  # ResNet-20, CIFAR-10 (He et al.: 0.27M)
    assert resnet.build_model((32, 32, 3), 10).name == "resnet20"
    assert resnet.build_model((64, 64, 3), 10, base_filters=2).name == "resnet50"
    assert resnet.build_model((32, 32, 3), 10, depth=32, base_filters=2).name == "resnet32"
    with pytest.raises(ValueError, match=r"resnet depth: must be 50 or 6n\+2 .*received depth=21"):
        resnet.build_model((32, 32, 3), 10, depth=21)
    with pytest.raises(ValueError, match=r"must be 6n\+2 .*received depth=4"):
        resnet.build_resnet_cifar(depth=4)


def test_transformer_rejects_non_sequence_input_shape() -> None:
    with pytest.raises(ValueError, match=r"transformer input_shape: must be \(sequence_length,\); "
                                         r"received input_shape=\(8, 8\)"):
        build_model("transformer", input_shape=(8, 8), num_classes=2)
