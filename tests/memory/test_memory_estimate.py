"""estimate_memory's arithmetic on a model whose sizes are known exactly, and its option errors."""

import pytest

import keras

from tfaccel.errors import ConfigError
from tfaccel.memory import estimate_memory
from tfaccel.memory.graph import graph_activation_peak

B, D, H, C = 256, 64, 2048, 10
PARAM_BYTES = 4 * (D * H + H + H * C + C)


def _dense(input_shape, num_classes):
    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.Dense(H, activation="relu", name="wide")(inputs)
    x = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32", name="probs")(x), name="dense")


def _estimate(**options):
    return estimate_memory(_dense, input_shape=(D,), num_classes=C, **options)


def test_parameters_gradients_and_adam_slots_are_exact():
    est = _estimate(batch_size=B, recompute=False)
    assert est.parameters == D * H + H + H * C + C
    assert est.parameter_bytes == PARAM_BYTES and est.gradient_bytes == PARAM_BYTES
    assert est.optimizer_bytes == 2 * PARAM_BYTES + 8 + 4  # m and v per weight + iteration (int64) + learning rate
    assert est.total_bytes == PARAM_BYTES * 4 + 12 + est.activation_bytes
    assert est.recompute_blocks == () and est.activation_bytes_recompute is None


def test_sgd_has_no_slots_and_the_activations_follow_the_batch():
    sgd = _estimate(batch_size=B, optimizer="sgd", recompute=False)
    assert sgd.optimizer_bytes == 8 + 4
    half = _estimate(batch_size=B // 2, recompute=False)
    assert half.activation_bytes == pytest.approx(sgd.activation_bytes / 2, rel=0.01)


def test_saved_activations_are_the_tensors_the_backward_pass_reads():
    est = _estimate(batch_size=B, recompute=False)
    # input (matmul grad), relu output (relu grad + matmul grad), softmax output (its grad); plus scalars.
    expected = 4 * (B * D + B * H + B * C)
    assert expected <= est.saved_activation_bytes <= expected + 64
    assert est.activation_bytes >= est.saved_activation_bytes


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_16_bit_policies_halve_the_activations_not_the_variables(precision):
    full = _estimate(batch_size=B, recompute=False)
    half = _estimate(batch_size=B, precision=precision, recompute=False)
    assert half.parameter_bytes == full.parameter_bytes and half.precision == precision
    assert 0.45 <= half.activation_bytes / full.activation_bytes <= 0.55
    assert 0.45 <= half.saved_activation_bytes / full.saved_activation_bytes <= 0.55


def test_replicas_split_the_global_batch():
    one = _estimate(batch_size=B, recompute=False)
    four = _estimate(batch_size=4 * B, strategy="mirrored", replicas=4, recompute=False)
    assert four.per_replica_batch == B and four.activation_bytes == one.activation_bytes
    assert four.total_bytes == one.total_bytes  # every replica holds all variables and slots


def test_sharded_optimizer_state_gives_each_replica_its_variables_slots():
    full = _estimate(batch_size=B, strategy="mirrored", replicas=2, recompute=False)
    est = _estimate(batch_size=B, strategy="mirrored", replicas=2, recompute=False, shard_optimizer_state=True)
    # greedy by bytes: wide/kernel alone on replica 0, the rest on replica 1; Adam = 2 slots each; the iteration
    # counter and the rate (12 bytes) on both
    assert est.optimizer_shard_bytes == (2 * 4 * D * H + 12, 2 * 4 * (H + H * C + C) + 12)
    assert est.optimizer_bytes == full.optimizer_bytes  # the unsharded total, for comparison
    assert est.total_bytes == full.total_bytes - (full.optimizer_bytes - max(est.optimizer_shard_bytes))
    assert est.to_dict()["optimizer_shard_bytes"] == list(est.optimizer_shard_bytes)
    with pytest.raises(ConfigError, match=r"shard_optimizer_state: sharding needs strategy 'mirrored' or "
                                          r"'multi_worker' over 2 replicas or more; received strategy='default', "
                                          r"replicas=1"):
        _estimate(batch_size=B, recompute=False, shard_optimizer_state=True)


def test_parameter_server_shards_hold_variables_and_slots():
    est = _estimate(batch_size=B, strategy="parameter_server", num_ps=2, recompute=False)
    # round-robin: wide/kernel, logits/kernel -> ps:0 ; wide/bias, logits/bias -> ps:1; Adam = 2 slots each.
    assert est.ps_shard_bytes == (3 * 4 * (D * H + H * C) + 12, 3 * 4 * (H + C))
    assert est.state_bytes == 2 * PARAM_BYTES  # a worker reads the variables and makes gradients, holds no slots
    assert sum(est.ps_shard_bytes) == PARAM_BYTES + est.optimizer_bytes


def test_a_built_model_is_copied_not_changed():
    model = _dense((D,), C)
    est = estimate_memory(model, batch_size=8, recompute=False)
    assert est.model == "dense" and est.parameter_bytes == PARAM_BYTES
    assert getattr(model, "optimizer", None) is None and not model.compiled and "call" not in model.__dict__
    with pytest.raises(ConfigError, match=r"precision: the model was built with the 'float32' policy; received "
                                          r"precision='mixed_float16'.*pass the model's name or builder"):
        estimate_memory(model, batch_size=8, precision="mixed_float16")


def test_to_dict_is_json_ready():
    import json

    est = _estimate(batch_size=8, strategy="parameter_server", recompute=False)
    out = json.loads(json.dumps(est.to_dict()))
    assert out["total_bytes"] == est.total_bytes and out["ps_shard_bytes"] == list(est.ps_shard_bytes)


def test_gradient_accumulation_adds_one_sum_per_trainable_variable_as_tfaccel_fit_holds_it():
    """tfaccel.fit(gradient_accumulation_steps=2) on 2 mirrored replicas: each replica's optimizer variables after the
    job are Adam's (the estimate's optimizer_bytes) plus the sums and the micro-batch counter (its
    accumulator_bytes), to the byte."""
    import numpy as np

    import tfaccel

    plain = _estimate(batch_size=8, recompute=False)
    est = _estimate(batch_size=8, recompute=False, gradient_accumulation_steps=2)
    assert est.accumulator_bytes == PARAM_BYTES + 8 and plain.accumulator_bytes == 0
    assert est.total_bytes == plain.total_bytes + PARAM_BYTES + 8
    assert est.to_dict()["accumulator_bytes"] == PARAM_BYTES + 8
    with tfaccel.scope(strategy="mirrored"):
        model = _dense((D,), C)
        model.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.RandomState(0)
    tfaccel.fit(model, rng.randn(32, D).astype("float32"), rng.randint(0, C, 32), batch_size=8, epochs=1, verbose=0,
                gradient_accumulation_steps=2)
    held = sum(int(np.prod(v.shape)) * v.numpy().dtype.itemsize for v in model.optimizer.variables)
    assert held == est.optimizer_bytes + est.accumulator_bytes


@pytest.mark.parametrize("options, message", [
    ({"gradient_accumulation_steps": 0}, r"gradient_accumulation_steps: must be a positive integer; received 0"),
    ({"strategy": "nccl"}, r"strategy: unknown value 'nccl'; valid values are: 'auto', 'default'"),
    ({"precision": "auto"}, r"precision: unknown value 'auto'; valid values are: 'float32', 'mixed_float16', "
                            r"'mixed_bfloat16'\. estimate_memory needs the policy itself"),
    ({"optimizer": "adamm"}, r"optimizer: unknown value 'adamm'; valid values are: 'adam'"),
    ({"batch_size": 0}, r"batch_size: must be a positive integer; received 0"),
    ({"replicas": 3}, r"batch_size: the global batch 8 does not split evenly over 3 replicas; give a multiple of 3"),
    ({"num_ps": True}, r"num_ps: must be a positive integer; received True"),
])
def test_option_errors_name_the_option_and_the_valid_values(options, message):
    kwargs = {"batch_size": 8, **options}
    with pytest.raises(ConfigError, match=message):
        _estimate(**kwargs)


def test_a_name_without_a_default_shape_needs_input_shape(tmp_path):
    path = tmp_path / "net.py"
    path.write_text("import keras\ndef build_model(input_shape, num_classes):\n"
                    "    i = keras.Input(input_shape)\n    return keras.Model(i, keras.layers.Dense(num_classes)(i))\n")
    with pytest.raises(ConfigError, match=r"input_shape: model '.*net.py' has no default input shape; pass "
                                          r"input_shape=\(\.\.\.\)"):
        estimate_memory(str(path), batch_size=4)
    assert estimate_memory(f"{path}:build_model", batch_size=4, input_shape=(3,)).parameters == 3 * 10 + 10


def _two_inputs(nested: bool):
    """The _dense net on the sum of two named inputs, given as a dict (or a dict inside a list)."""
    a, b = keras.Input((D,), name="a"), keras.Input((D,), name="b")
    x = keras.layers.Add()([a, b])
    x = keras.layers.Dense(H, activation="relu")(x)
    outputs = keras.layers.Dense(C, activation="softmax")(x)
    return keras.Model([{"a": a, "b": b}] if nested else {"a": a, "b": b}, outputs, name="two")


def test_dict_and_nested_inputs_are_traced_in_the_models_structure():
    model = _two_inputs(nested=False)
    est = estimate_memory(model, batch_size=B, recompute=False, strategy="mirrored", replicas=2,
                          shard_optimizer_state=True)
    assert est.parameter_bytes == PARAM_BYTES and est.optimizer_bytes == 2 * PARAM_BYTES + 12
    assert sorted(est.optimizer_shard_bytes) == [2 * 4 * (H * C + C + H) + 12, 2 * 4 * D * H + 12]
    half = estimate_memory(model, batch_size=B // 4, recompute=False)  # half the per-replica batch
    assert half.activation_bytes == pytest.approx(est.activation_bytes / 2, rel=0.01)
    assert est.activation_bytes > 2 * (B // 2) * D * 4  # both inputs' batches are in the traced step
    nested = estimate_memory(_two_inputs(nested=True), batch_size=B // 2, recompute=False)
    assert (nested.parameter_bytes, nested.activation_bytes) == (est.parameter_bytes, est.activation_bytes)


def test_a_sequential_model_is_traced_at_its_one_input():
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(H, activation="relu"), keras.layers.Dense(C)])
    est = estimate_memory(model, batch_size=8, recompute=False)
    assert est.parameter_bytes == PARAM_BYTES and est.activation_bytes >= 8 * (D + H + C) * 4


def _tagger():
    """A per-token classifier over sequences of any length (as KerasHub's backbones take them): a dict of token ids
    and a float mask, logits of shape (batch, length, C)."""
    tokens, mask = keras.Input((None,), dtype="int32", name="tokens"), keras.Input((None,), name="mask")
    x = keras.layers.Embedding(50, 8)(tokens) * keras.ops.expand_dims(mask, -1)
    return keras.Model({"tokens": tokens, "mask": mask}, keras.layers.Dense(C)(x), name="tagger")


def test_an_open_sequence_axis_takes_input_shape_and_the_labels_follow_the_output():
    model = _tagger()
    short, long = (estimate_memory(model, batch_size=8, recompute=False, input_shape=(n,)) for n in (16, 64))
    assert short.parameter_bytes == long.parameter_bytes == 4 * (50 * 8 + 8 * C + C)
    assert long.activation_bytes == pytest.approx(4 * short.activation_bytes, rel=0.05)
    with pytest.raises(ConfigError, match=r"input_shape: input '(mask|tokens)' of model 'tagger' has shape "
                                          r"\(None, None\), open along an axis besides the batch.*pass one example's "
                                          r"shape, e\.g\. input_shape=\(128,\)"):
        estimate_memory(model, batch_size=8, recompute=False)
    with pytest.raises(ConfigError, match=r"input_shape: \(16, 2\) fits none of the inputs of model 'tagger' "
                                          r"\('mask' \(None, None\), 'tokens' \(None, None\); the first axis is "
                                          r"the batch\)"):
        estimate_memory(model, batch_size=8, recompute=False, input_shape=(16, 2))


def test_graph_peak_counts_a_reshape_as_the_same_buffer():
    import tensorflow as tf

    w = tf.Variable(tf.ones((100, 100)))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.reshape(tf.nn.relu(tf.matmul(x, w)), (-1,))  # the reshape shares relu's buffer
            loss = tf.reduce_sum(y)
        return tape.gradient(loss, w)

    graph = step.get_concrete_function(tf.TensorSpec((50, 100))).graph
    peaks = graph_activation_peak(graph)
    # x and relu's output (50x100 float32 each) are read by the backward pass; the reshape adds nothing.
    assert 2 * 50 * 100 * 4 <= peaks["saved_bytes"] <= 2 * 50 * 100 * 4 + 64


def test_process_peak_arithmetic_and_both_peaks_in_the_dict():
    from tfaccel.memory import MemoryEstimate

    mib = 2 ** 20
    est = MemoryEstimate(model="m", batch_size=8, per_replica_batch=8, replicas=1, precision="float32",
                         strategy="default", optimizer="adam", parameters=1, parameter_bytes=10 * mib,
                         gradient_bytes=10 * mib, optimizer_bytes=20 * mib, activation_bytes=80 * mib,
                         saved_activation_bytes=40 * mib, process_base_bytes=700 * mib,
                         activation_bytes_base=10 * mib)
    assert est.total_bytes == 120 * mib and est.process_peak_bytes == 770 * mib  # 700 + 80 - 10
    out = est.to_dict()
    assert out["device_peak_bytes"] == 120 * mib and out["process_peak_bytes"] == 770 * mib
    unasked = MemoryEstimate(**{**dataclasses_fields(est), "process_base_bytes": None})
    assert unasked.process_peak_bytes is None and unasked.to_dict()["process_peak_bytes"] is None


def dataclasses_fields(est):
    import dataclasses

    return {f.name: getattr(est, f.name) for f in dataclasses.fields(est)}


DENSE_FILE = """import keras
def build(input_shape, num_classes):
    inputs = keras.Input(tuple(input_shape))
    x = keras.layers.Dense(%d, activation="relu", name="wide")(inputs)
    x = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32", name="probs")(x), name="dense")
""" % H


def test_process_peak_adds_the_traced_batch_part_to_the_measured_batch_1_peak(tmp_path):
    path = tmp_path / "dense_net.py"
    path.write_text(DENSE_FILE)
    est = estimate_memory(f"{path}:build", batch_size=B, input_shape=(D,), num_classes=C, recompute=False,
                          process_peak=True)
    assert est.parameter_bytes == PARAM_BYTES
    # at batch 1 the traced peak is not an activation but the optimizer's update of the wide kernel: two
    # temporaries of its D x H float32 size live at once (they are in the measured batch-1 peak too, so they cancel)
    assert est.activation_bytes_base == 2 * 4 * D * H
    assert est.activation_bytes - est.activation_bytes_base >= 4 * (B - 1) * (D + H + C)
    assert est.process_peak_bytes == est.process_base_bytes + est.activation_bytes - est.activation_bytes_base
    # the measured batch-1 process holds the interpreter and the TF runtime besides the model's 4 x 0.6 MiB
    assert est.process_base_bytes > 200 * 2 ** 20 + 4 * PARAM_BYTES


@pytest.mark.parametrize("options, message", [
    ({"model_or_name": _dense}, r"process_peak: the process peak is measured in a fresh process, which must build "
                                r"the model itself; received a function\. Pass a built-in name or "
                                r"'path/to/file\.py:build_model' \(or process_peak=False\)"),
    ({"strategy": "mirrored", "replicas": 2}, r"process_peak: estimated for one replica per process \(auto, "
                                              r"default, one_device, multi_worker, horovod; replicas > 1 only under "
                                              r"multi_worker or horovod\); received strategy='mirrored', "
                                              r"replicas=2\. Pass process_peak=False"),
])
def test_process_peak_errors_name_the_option(options, message):
    kwargs = {"model_or_name": "mlp", "batch_size": 8, "recompute": False, "process_peak": True,
              "input_shape": (D,), "num_classes": C, **options}
    with pytest.raises(ConfigError, match=message):
        estimate_memory(kwargs.pop("model_or_name"), **kwargs)
