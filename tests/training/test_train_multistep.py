"""The multi-step loop (tfaccel.train.loops.multi_step): K steps of the model's train_step per call under
multi_worker (two real worker processes on loopback) and mirrored (2 virtual CPUs in this process), the same
weights as one step per call and as plain Keras fit (with gradient accumulation too, against Keras' own; and
under mixed_float16 a step that overflows on one worker only is skipped, as one device skips it); when "auto" uses
it, and why not when it does not."""

from pathlib import Path

import numpy as np
import pytest

import harness
import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.strategies.base import Backend
from tfaccel.train.data import prepare_data
from tfaccel.train.loops.multi_step import multi_step_blockers, replica_splits

PROGRAM = Path(__file__).with_name("multistep_program.py")


def _max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a["weights"], b["weights"]))


def _assert_same_training(got: dict, ref: dict, *, weights_atol: float = 0.0) -> None:
    assert set(got["history"]) == set(ref["history"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for key, values in ref["history"].items():
        np.testing.assert_allclose(got["history"][key], values, rtol=1e-5, atol=1e-6, err_msg=key)
    assert _max_diff(got, ref) <= weights_atol


def test_two_workers_k_steps_per_call_train_like_one_step_and_plain_fit():
    results = harness.run_tasks(PROGRAM, workers=2, timeout=400, args=["multi_worker"])
    harness.assert_all_ok(results)
    w0, w1 = (harness.last_json_line(r.stdout) for r in results)
    for name in w0:  # both workers identical, bit for bit
        assert w0[name]["weights"] == w1[name]["weights"] and w0[name]["history"] == w1[name]["history"], name
    assert w0["keras1"]["loop"] == "Keras fit (asked for)"
    assert w0["keras1"]["spe"].startswith("1 (multi_worker: Keras 3.15's multi-step loop fails")
    assert w0["auto"]["loop"].startswith("tfaccel's multi-step loop: 5 steps of the model's train_step per call "
                                         "under multi_worker")
    assert w0["auto"]["spe"] == "5 (auto: min(steps/epoch=5, 64))" and w0["k3"]["spe"] == "3 (given)"
    for name in ("auto", "k3"):
        assert w0[name]["steps"] == 3 * 5  # the partial batch is a step of its own
        _assert_same_training(w0[name], w0["keras1"])  # the same weights as one step per call, exactly
    _assert_same_training(w0["auto_shuffled"], w0["keras1_shuffled"])  # the same (seed, epoch) order as Keras fit
    assert _max_diff(w0["auto_shuffled"], w0["auto"]) > 1e-3  # ... and the order was shuffled
    _assert_same_training(w0["auto"], w0["plain"], weights_atol=1e-5)  # plain model.fit on one device
    # tfaccel's accumulation under multi_worker trains what Keras' own accumulation trains on one device
    assert w0["accumulated"]["loop"].startswith("tfaccel's multi-step loop"), w0["accumulated"]["loop"]
    _assert_same_training(w0["accumulated"], w0["plain_accumulated"], weights_atol=1e-5)
    assert _max_diff(w0["accumulated"], w0["plain"]) > 1e-3  # another optimizer: the check is not vacuous
    # mixed_float16, worker 1's half of the first batch overflowing: both workers skip that step, as one device does
    assert (w0["overflow"]["scale"], w0["overflow"]["updates"]) == (w0["plain_overflow"]["scale"],
                                                                   w0["plain_overflow"]["updates"]) == (16384.0, 1)
    assert _max_diff(w0["overflow"], w0["plain_overflow"]) <= 1e-5


def test_replica_splits_as_tf_distribute_splits_a_batch():
    assert replica_splits(16, 2) == [(0, 8), (8, 8)]
    assert replica_splits(7, 2) == [(0, 4), (4, 3)]
    assert replica_splits(5, 4) == [(0, 2), (2, 1), (3, 1), (4, 1)]


class _Model:
    run_eagerly = False


@pytest.mark.parametrize("kwargs,backend,expected", [
    ({}, "parameter_server", "strategy parameter_server (the multi-step loop runs mirrored and multi_worker)"),
    ({"batch_size": 15}, "mirrored", "the global batch 15 does not split evenly over 2 replicas"),
    ({"n": 65}, "mirrored", "the last batch (1 examples) leaves a replica of 2 without examples"),
    ({"steps_per_epoch": 2}, "mirrored", "steps_per_epoch=2 is not one pass over the arrays"),
    ({"validation_steps": 1}, "mirrored", "validation_steps is given"),
    ({"validation_batch_size": 9}, "mirrored", "the global validation batch 9 does not split evenly over 2 replicas"),
    ({"validation_data": 17}, "mirrored", "the last validation batch (1 examples) leaves a replica of 2 without "
                                          "examples"),
    ({"validation_data": "dataset"}, "mirrored", "validation_data is not arrays"),
    ({"x": "dataset"}, "multi_worker", "data is a tf.data.Dataset, not in-memory arrays"),
    ({"run_eagerly": True}, "mirrored", "the model was compiled with run_eagerly=True"),
])
def test_each_reason_the_loop_cannot_run(kwargs, backend, expected):
    import tensorflow as tf

    n = kwargs.pop("n", 64)
    x, y = np.zeros((n, 3), "float32"), np.zeros(n, "int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model = _Model()
    model.run_eagerly = kwargs.pop("run_eagerly", False)
    validation_steps = kwargs.pop("validation_steps", None)
    validation_batch_size = kwargs.pop("validation_batch_size", None)
    if validation_batch_size:
        kwargs["validation_data"] = (x[:18], y[:18])
    if kwargs.get("validation_data") == "dataset":
        kwargs["validation_data"] = ds
    elif isinstance(kwargs.get("validation_data"), int):
        kwargs["validation_data"] = (x[:kwargs["validation_data"]], y[:kwargs["validation_data"]])
    if kwargs.pop("x", None) == "dataset":
        data = prepare_data(ds, **kwargs)
    else:
        data = prepare_data(x, y, **{"batch_size": 16, **kwargs})
    blockers = multi_step_blockers(model, backend=Backend(name=backend, strategy=None, num_replicas_in_sync=2),
                                   data=data, validation_steps=validation_steps,
                                   validation_batch_size=validation_batch_size)
    assert blockers == [expected]


def _build():
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3, activation="softmax")])


def _data(n=70):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")


def _batch_hooks():
    import keras

    class Hooks(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_train_batch_begin(self, batch, logs=None):
            self.calls.append(("begin", batch))

        def on_train_batch_end(self, batch, logs=None):
            self.calls.append(("end", batch, sorted(logs)))

    return Hooks()


def test_mirrored_batch_hooks_once_per_execution_as_keras(clean_tf_config, cpu_replicas):
    """steps_per_execution given with a per-batch callback: Keras calls batch hooks once per execution with the
    (begin, end) step numbers; the partial last batch is part of the last execution."""
    x, y = _data()
    hooks = _batch_hooks()
    result = tfaccel.compile_and_fit(_build, (x, y), epochs=1, global_batch_size=16, strategy="mirrored",
                                     loss="sparse_categorical_crossentropy", metrics=["accuracy"], callbacks=[hooks],
                                     steps_per_execution=3, seed=0, verbose=0)
    assert result.details["loop"].startswith("tfaccel's multi-step loop: 3 steps")
    logs = ["accuracy", "loss"]
    assert hooks.calls == [("begin", 0), ("end", 2, logs), ("begin", 3), ("end", 4, logs)]
    assert result.steps == 5 and result.examples_per_sec > 0


def test_mirrored_auto_keeps_keras_fit_for_per_batch_callbacks(clean_tf_config, cpu_replicas):
    x, y = _data()
    hooks = _batch_hooks()
    result = tfaccel.compile_and_fit(_build, (x, y), epochs=1, global_batch_size=16, strategy="mirrored",
                                     loss="sparse_categorical_crossentropy", callbacks=[hooks], seed=0, verbose=0)
    assert result.details["loop"] == ("Keras fit (steps_per_execution 1: per-batch callbacks must see every batch)")
    assert [c[1] for c in hooks.calls if c[0] == "end"] == [0, 1, 2, 3, 4]


def test_compiled_refused_under_mirrored_with_the_reason(clean_tf_config, cpu_replicas):
    x, y = _data(65)
    with pytest.raises(ConfigError, match=r"loop='compiled' cannot train this job exactly like Keras fit under "
                                          r"mirrored: the last batch \(1 examples\) leaves a replica of 2 without "
                                          r"examples. Use loop='auto' \(Keras fit then trains it\)"):
        tfaccel.compile_and_fit(_build, (x, y), global_batch_size=16, strategy="mirrored", loop="compiled",
                                loss="sparse_categorical_crossentropy", verbose=0)



def test_mirrored_uneven_last_batch_trains_like_keras_fit(clean_tf_config, cpu_replicas):
    """71 examples, batch 16: the last batch of 7 splits 4 + 3 over the replicas, as tf.distribute splits it."""
    x, y = _data(71)
    runs = {}
    for loop in ("keras", "compiled"):
        result = tfaccel.compile_and_fit(_build, (x, y), validation_data=(x[:23], y[:23]), epochs=2,
                                         global_batch_size=16, strategy="mirrored", optimizer="adam",
                                         learning_rate=0.05, loss="sparse_categorical_crossentropy",
                                         metrics=["accuracy"], shuffle=False, loop=loop, steps_per_execution=2,
                                         seed=0, verbose=0)
        runs[loop] = result
    assert runs["compiled"].details["loop"].startswith("tfaccel's multi-step loop: 2 steps")
    for a, b in zip(runs["keras"].model.get_weights(), runs["compiled"].model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for key, values in runs["keras"].history.items():
        np.testing.assert_allclose(runs["compiled"].history[key], values, rtol=1e-5, atol=1e-6, err_msg=key)
