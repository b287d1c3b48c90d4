"""enable_recompute: same training as without it, less traced activation memory, and clear errors."""

import numpy as np
import pytest

import keras
from keras import layers

from tfaccel.errors import ConfigError
from tfaccel.memory import disable_recompute, enable_recompute, find_blocks, recompute_blocks
from tfaccel.memory.estimate import estimate_memory


def _residual_net(input_shape=(8,), num_classes: int = 3, *, blocks: int = 2, width: int = 16) -> keras.Model:
    """Dense residual blocks with BatchNormalization and Dropout: the state a naive replay gets wrong."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input(tuple(input_shape))
    x = layers.Dense(width, name="stem")(inputs)
    for b in range(1, blocks + 1):
        y = layers.Dense(width, activation="relu", name=f"block{b}_d1")(x)
        y = layers.BatchNormalization(name=f"block{b}_bn")(y)
        y = layers.Dropout(0.3, name=f"block{b}_drop")(y)
        y = layers.Dense(width, name=f"block{b}_d2")(y)
        x = layers.Add(name=f"block{b}_add")([x, y])
    outputs = layers.Dense(num_classes, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs, name="resnet_mlp")


def _train(model: keras.Model, **compile_options) -> list:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.integers(0, 3, 64)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy", **compile_options)
    keras.utils.set_random_seed(2)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    return [v.numpy() for v in model.variables]


@pytest.mark.parametrize("compile_options", [{}, {"jit_compile": True}, {"run_eagerly": True}],
                         ids=["graph", "xla", "eager"])
def test_recompute_trains_to_the_same_weights(compile_options):
    plain = _train(_residual_net(), **compile_options)
    model = _residual_net()
    assert enable_recompute(model) == ["block1", "block2"]
    recomputed = _train(model, **compile_options)
    assert len(plain) == len(recomputed)
    for a, b in zip(plain, recomputed):  # kernels, BN moving statistics, dropout seed states, optimizer-free
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_recompute_parity_under_mixed_float16():
    previous = keras.config.dtype_policy().name
    keras.config.set_dtype_policy("mixed_float16")
    try:
        plain = _train(_residual_net())
        model = _residual_net()
        enable_recompute(model, blocks="all")
        recomputed = _train(model)
    finally:
        keras.config.set_dtype_policy(previous)
    for a, b in zip(plain, recomputed):
        np.testing.assert_allclose(a.astype("float32"), b.astype("float32"), rtol=1e-3, atol=1e-3)


def test_model_object_layers_and_variables_stay_the_users():
    model = _residual_net()
    before = [id(v) for v in model.variables]
    layer_names = [layer.name for layer in model.layers]
    enable_recompute(model, blocks=[["block1_d1", "block1_bn", "block1_drop", "block1_d2", "block1_add"]])
    assert [id(v) for v in model.variables] == before and [layer.name for layer in model.layers] == layer_names
    assert recompute_blocks(model) == ("block1",)
    disable_recompute(model)
    assert recompute_blocks(model) == () and "call" not in model.__dict__


def test_recompute_lowers_the_traced_activation_peak():
    est = estimate_memory(lambda input_shape, num_classes: _residual_net(input_shape, num_classes, blocks=4,
                                                                         width=256),
                          batch_size=512, input_shape=(8,), num_classes=3, recompute="auto")
    assert est.recompute_blocks == ("block1", "block2", "block3")  # "auto": 3 equal blocks hold >= 2/3
    assert est.activation_bytes_recompute < 0.8 * est.activation_bytes


def test_auto_on_a_model_without_blocks_says_what_to_do():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, layers.Dense(2, name="hidden_0")(layers.Dense(3, name="dense")(inputs)))
    with pytest.raises(ConfigError, match=r"recompute blocks='auto': model .* cannot split it\. Pass blocks="):
        enable_recompute(model)


def test_subclassed_model_is_refused():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(ConfigError, match=r"not a functional keras.Model\(inputs, outputs\)"):
        enable_recompute(Net())


def test_unknown_layer_and_bad_blocks_value():
    model = _residual_net()
    with pytest.raises(ConfigError, match=r"'nope' is not a layer of model 'resnet_mlp'; layers: .*block1_d1"):
        enable_recompute(model, blocks=["nope"])
    with pytest.raises(ConfigError, match=r"unknown value 'every'; valid values are: 'auto', 'all'"):
        enable_recompute(model, blocks="every")
    with pytest.raises(ConfigError, match="received an empty list"):
        enable_recompute(model, blocks=[])
    assert recompute_blocks(model) == ()


def test_block_with_two_inputs_and_outputs_is_refused():
    model = _residual_net()
    with pytest.raises(ConfigError, match=r"block 'block1_d' .* 2 input tensor\(s\) and 2 output tensor\(s\)"):
        enable_recompute(model, blocks=[["block1_d1", "block1_d2"]])


def test_skip_connection_across_blocks_is_refused():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    stem = layers.Dense(4, name="stem")(inputs)
    a = layers.Dense(4, name="a1_dense")(stem)
    b = layers.Dense(4, name="b1_dense")(a)
    out = layers.Add(name="join")([stem, b])  # stem skips over both blocks
    model = keras.Model(inputs, out)
    with pytest.raises(ConfigError, match=r"cannot be cut into a chain at .*no skip connection"):
        enable_recompute(model)


def test_find_blocks_of_the_reference_models():
    from tfaccel.models import build_model

    resnet = build_model("resnet20", input_shape=(32, 32, 3), num_classes=10, base_filters=4)
    every = [f"stage{s}_block{b}" for s in (1, 2, 3) for b in (1, 2, 3)]
    assert find_blocks(resnet, "all") == every
    # "auto": the largest first until 2/3 of the block activations (stage 1 at 32x32 holds 4/7 of them)
    assert find_blocks(resnet) == every[:4]
    transformer = build_model("transformer", input_shape=(16,), num_classes=2, embed_dim=8, num_layers=3)
    assert find_blocks(transformer, "all") == ["encoder1", "encoder2", "encoder3"]
    assert find_blocks(transformer) == ["encoder1", "encoder2"]  # equal blocks: the first two hold 2/3
    assert recompute_blocks(resnet) == ()  # find_blocks changes nothing


def test_recompute_parity_under_mirrored_strategy_in_its_own_process():
    import subprocess
    import sys
    from pathlib import Path

    import harness

    program = Path(__file__).with_name("recompute_mirrored_program.py")
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = harness.last_json_line(proc.stdout)
    assert out["replicas"] == 2 and out["blocks"] == ["block1", "block2"] and out["max_diff"] < 1e-5
