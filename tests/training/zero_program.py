"""Differential check of tfaccel.fit(shard_optimizer_state=True) against plain model.fit, in a process of its own
(it needs N virtual CPUs): ``python zero_program.py N OUT.json``. For each optimizer case, the same compiled model
and initial weights train with tfaccel on N mirrored replicas and (in the N=2 process alone: the reference is the
same for every N) with plain ``model.fit`` on one device; the histories, the weights, every replica's copy and the
bytes of optimizer state per device go to OUT.json."""

import json
import sys

import numpy as np

import tfaccel

N = int(sys.argv[1])
tfaccel.configure_devices(virtual_cpus=N)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfaccel.memory import estimate_memory  # noqa: E402


def _cases():
    def schedule():
        return keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.9)

    return {
        "adam_schedule": lambda: keras.optimizers.Adam(schedule()),
        "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
        "sgd_nesterov_clipnorm": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, clipnorm=0.5),
        "rmsprop_global_clipnorm": lambda: keras.optimizers.RMSprop(0.01, global_clipnorm=0.3),
        "adam_keras_loop": lambda: keras.optimizers.Adam(0.01),
        "adam_unsharded": lambda: keras.optimizers.Adam(0.01),
    }


def _layers(input_shape=(8,), num_classes=3):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(16, activation="relu"), keras.layers.Dense(num_classes)])


def _model(scope, optimizer, weights=None):
    keras.utils.set_random_seed(1)
    with scope:
        model = _layers()
        model.compile(optimizer(), "mse", metrics=["mae"])
    if weights is not None:
        model.set_weights(weights)
    return model


def _embedding_layers():
    return keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8),
                             keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


def _embedding_case(mirrored) -> dict:
    """An Embedding table (IndexedSlices gradients) left unsharded beside sharded Dense layers: Adam with clipnorm."""
    rng = np.random.RandomState(1)
    x, y = rng.randint(0, 50, (256, 6)).astype("int32"), rng.randn(256, 1).astype("float32")

    def build(scope):
        keras.utils.set_random_seed(2)
        with scope:
            model = _embedding_layers()
            model.compile(keras.optimizers.Adam(0.01, clipnorm=1.0), "mse", metrics=["mae"])
        return model

    plain = build(tf.distribute.get_strategy().scope())
    model = build(tfaccel.scope(strategy="mirrored"))
    model.set_weights(plain.get_weights())
    ref = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    result = tfaccel.fit(model, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, shard_optimizer_state=True)
    held = {}
    for v in model.optimizer.variables:
        for c in mirrored.experimental_local_results(v.value):
            device = tf.DeviceSpec.from_string(c.device).to_string()
            held[device] = held.get(device, 0) + int(np.prod(c.shape)) * c.dtype.size
    estimate = estimate_memory(_embedding_layers(), batch_size=32, strategy="mirrored", replicas=N,
                               optimizer=keras.optimizers.Adam(0.01), recompute=False, shard_optimizer_state=True)
    return {"plain_history": ref, "history": result.history, "note": result.details.get("optimizer_state"),
            "plain_weights": [w.tolist() for w in plain.get_weights()],
            "weights": [w.tolist() for w in model.get_weights()], "held": held,
            "estimate": list(estimate.optimizer_shard_bytes),
            "copies": [[c.numpy().tolist() for c in mirrored.experimental_local_results(v.value)]
                       for v in model.trainable_variables]}


def main() -> None:
    rng = np.random.RandomState(0)
    x = rng.randn(256, 8).astype("float32")
    y = (x @ rng.randn(8, 3)).astype("float32")
    mirrored = tfaccel.get_strategy("mirrored")
    out = {"replicas": mirrored.num_replicas_in_sync}
    for name, optimizer in _cases().items():
        if name == "adam_unsharded" and N != 2:  # the control: one replica count is enough
            continue
        plain = _model(tf.distribute.get_strategy().scope(), optimizer)
        initial = plain.get_weights()
        # the reference, plain fit on one device: the same for every N, so the N=2 process's alone
        reference = _plain_fit(plain, x, y) if N == 2 else {}
        model = _model(tfaccel.scope(strategy="mirrored"), optimizer, initial)
        shard = name != "adam_unsharded"
        result = tfaccel.fit(model, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                             shard_optimizer_state=shard, loop="keras" if name == "adam_keras_loop" else "auto")
        copies = [[c.numpy().tolist() for c in mirrored.experimental_local_results(v.value)]
                  for v in model.trainable_variables]
        held = {}
        for v in model.optimizer.variables:
            for c in mirrored.experimental_local_results(v.value):
                device = tf.DeviceSpec.from_string(c.device).to_string()
                held[device] = held.get(device, 0) + int(np.prod(c.shape)) * c.dtype.size
        out[name] = {"history": result.history, "initial": [w.tolist() for w in initial],
                     "weights": [w.tolist() for w in model.get_weights()], "copies": copies,
                     "slot_sizes": [int(np.prod(v.shape)) * 4 for v in model.trainable_variables],
                     "held": held, "details_bytes": result.details.get("optimizer_state_bytes"),
                     "note": result.details.get("optimizer_state"), "plan_notes": list(result.plan.notes),
                     "loop": result.details["loop_name"],
                     "iterations": int(model.optimizer.iterations.numpy()), **reference}
        if name == "adamw":  # what `tfaccel memory --shard-optimizer-state` predicts for each device
            out[name]["estimate"] = list(estimate_memory(
                _layers, input_shape=(8,), num_classes=3, batch_size=32, strategy="mirrored", replicas=N, optimizer=optimizer(), recompute=False,
                shard_optimizer_state=True).optimizer_shard_bytes)
    out["embedding"] = _embedding_case(mirrored)
    if N == 2:  # the CLI's flag, end to end, on this process's mirrored strategy
        from tfaccel.cli.main import main as cli

        summary_path = sys.argv[2] + ".cli.json"
        out["cli_rc"] = cli(["fit", "--model", "mnist_cnn", "--dataset", "digits", "--epochs", "1", "--num-examples",
                             "128", "--strategy", "mirrored", "--shard-optimizer-state", "--json-out", summary_path])
        with open(summary_path) as f:
            out["cli"] = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


def _plain_fit(plain, x, y):
    history = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    return {"plain_history": history, "plain_weights": [w.tolist() for w in plain.get_weights()],
            "plain_iterations": int(plain.optimizer.iterations.numpy())}


if __name__ == "__main__":
    main()
