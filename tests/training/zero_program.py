"""Differential check of tfaccel.fit(shard_optimizer_state=True) against plain model.fit, in a process of its own
(it needs N virtual CPUs): ``python zero_program.py N OUT.json``. For each optimizer case, the same compiled model
and initial weights train with tfaccel on N mirrored replicas and (in the N=2 process alone: the reference is the
same for every N) with plain ``model.fit`` on one device; the histories, the weights, every replica's copy and the
bytes of optimizer state per device go to OUT.json."""

import json
import sys
from pathlib import Path

import numpy as np

import tfaccel

N = int(sys.argv[1])
tfaccel.configure_devices(virtual_cpus=N)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfaccel.compat.keras_zero import slot_bytes_per_device  # noqa: E402
from tfaccel.memory import estimate_memory  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: zero_cases

import zero_cases as zc  # noqa: E402

# zero_cases' optimizers, and two controls: Keras' own loop, and the same Adam unsharded
CASES = {**zc.OPTIMIZERS, "adam_keras_loop": lambda: keras.optimizers.Adam(0.01),
         "adam_unsharded": lambda: keras.optimizers.Adam(0.01)}
MIXED = ("adamw", "sgd_nesterov_clipnorm")  # also trained under mixed_bfloat16 and mixed_float16


def _embedding_case(mirrored, optimizer) -> dict:
    """An Embedding table (IndexedSlices gradients) left unsharded beside sharded Dense layers: Adam with clipnorm,
    or with global_clipnorm (the global norm over the sharded and unsharded gradients)."""
    x, y = zc.embedding_data()
    plain = zc.embedding_model(optimizer=optimizer)
    norms = zc.global_norms(plain, x, y)
    model = zc.embedding_model(tfaccel.scope(strategy="mirrored"), optimizer)
    model.set_weights(plain.get_weights())
    ref = plain.fit(x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0).history
    result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0, shard_optimizer_state=True)
    held = slot_bytes_per_device(model.optimizer, mirrored)
    estimate = estimate_memory(zc.embedding_layers(), batch_size=zc.BATCH, strategy="mirrored", replicas=N,
                               optimizer=keras.optimizers.Adam(0.01), recompute=False, shard_optimizer_state=True)
    return {"plain_history": ref, "history": result.history, "note": result.details.get("optimizer_state"),
            "norms": norms,
            "plain_weights": [w.tolist() for w in plain.get_weights()],
            "weights": [w.tolist() for w in model.get_weights()], "held": held,
            "estimate": list(estimate.optimizer_shard_bytes),
            "copies": [[c.numpy().tolist() for c in mirrored.experimental_local_results(v.value)]
                       for v in model.trainable_variables]}


def _accumulated_averages_beside_a_table() -> dict:
    """Accumulation, ``use_ema`` (written every 3 updates) and an Embedding table left unsharded, all at once:
    tfaccel.fit(gradient_accumulation_steps=2, shard_optimizer_state=True) against Keras' own accumulation on one
    device."""
    def optimizer(keras_steps):
        return lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, use_ema=True, ema_momentum=0.8,
                                              ema_overwrite_frequency=3, gradient_accumulation_steps=keras_steps)

    x, y = zc.embedding_data()
    plain = zc.embedding_model(optimizer=optimizer(2))
    model = zc.embedding_model(tfaccel.scope(strategy="mirrored"), optimizer(None))
    model.set_weights(plain.get_weights())
    ref = plain.fit(x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0).history
    result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0,
                         shard_optimizer_state=True, gradient_accumulation_steps=2)
    return {"plain_history": ref, "history": result.history, "note": result.details.get("optimizer_state"),
            "plain_weights": [w.tolist() for w in plain.get_weights()],
            "weights": [w.tolist() for w in model.get_weights()],
            "updates": [int(m.optimizer.iterations.numpy()) for m in (plain, model)]}


def _loss_scaled(name: str):
    """The case's optimizer in a LossScaleOptimizer whose first scale overflows float16 (the first steps are skipped
    and the scale halved) and which doubles its scale every 2 finite steps: both of its branches run."""
    return lambda: keras.optimizers.LossScaleOptimizer(zc.OPTIMIZERS[name](), initial_scale=2.0 ** 16,
                                                       dynamic_growth_steps=2)


def _mixed_precision_case(policy: str, name: str) -> dict:
    """mixed_bfloat16 or mixed_float16 (float32 variables, gradients and slots; 16-bit compute; mixed_float16 with
    loss scaling): sharded against the same job unsharded on the same N replicas (each replica's 16-bit arithmetic
    differs from one device's over the whole batch, so one device is no reference here) and, for AdamW, against
    plain ``model.fit`` under TF's own MirroredStrategy over the same devices (Keras clips each replica's gradient
    before the all-reduce, tfaccel after it, so the clipping case has tfaccel's unsharded path as its reference)."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        x, y = zc.data()
        optimizer = _loss_scaled(name) if policy == "mixed_float16" else zc.OPTIMIZERS[name]
        initial = zc.model(optimizer).get_weights()
        out = {"policy": keras.mixed_precision.global_policy().name}
        for mode in ("sharded", "unsharded"):
            model = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="mirrored"), metrics=["mae"])
            result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0,
                                 shard_optimizer_state=mode == "sharded")
            out[mode] = {"history": result.history, "weights": [w.tolist() for w in model.get_weights()],
                         "note": result.details.get("optimizer_state"), "compute": model.layers[0].compute_dtype,
                         "held": result.details.get("optimizer_state_bytes"), **_scaling(model.optimizer)}
        if name == "adamw":
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            plain = zc.model(optimizer, initial, scope=tf.distribute.MirroredStrategy(devices).scope(), metrics=["mae"])
            history = plain.fit(x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0).history
            out["keras_mirrored"] = {"history": history, "weights": [w.tolist() for w in plain.get_weights()],
                                     **_scaling(plain.optimizer)}
        return out
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _scaling(optimizer) -> dict:
    """A LossScaleOptimizer's scale and its inner optimizer's updates after the job (nothing for another one)."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return {}
    return {"scale": float(optimizer.dynamic_scale.numpy()),
            "updates": int(optimizer.inner_optimizer.iterations.numpy())}


def main() -> None:
    x, y = zc.data()
    mirrored = tfaccel.get_strategy("mirrored")
    out = {"replicas": mirrored.num_replicas_in_sync}
    for name, optimizer in CASES.items():
        if name == "adam_unsharded" and N != 2:  # the control: one replica count is enough
            continue
        plain = zc.model(zc.REFERENCES.get(name, optimizer), metrics=["mae"])
        initial = plain.get_weights()
        # the reference, plain fit on one device: the same for every N, so the N=2 process's alone
        reference = _plain_fit(plain, x, y, name) if N == 2 else {}
        model = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="mirrored"), metrics=["mae"])
        shard = name != "adam_unsharded"
        result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0,
                             shard_optimizer_state=shard, loop="keras" if name == "adam_keras_loop" else "auto",
                             **zc.FIT_OPTIONS.get(name, {}), **zc.extras(name))
        copies = [[c.numpy().tolist() for c in mirrored.experimental_local_results(v.value)]
                  for v in model.trainable_variables]
        held = slot_bytes_per_device(model.optimizer, mirrored)
        out[name] = {"history": result.history, "initial": [w.tolist() for w in initial],
                     "weights": [w.tolist() for w in model.get_weights()], "copies": copies,
                     "slot_sizes": [int(np.prod(v.shape)) * 4 for v in model.trainable_variables],
                     "held": held, "details_bytes": result.details.get("optimizer_state_bytes"),
                     "note": result.details.get("optimizer_state"), "plan_notes": list(result.plan.notes),
                     "loop": result.details["loop_name"],
                     "iterations": int(model.optimizer.iterations.numpy()), **reference}
        if name in zc.FIT_OPTIONS:  # a .keras file holds what plain Keras' optimizer holds, not the accumulators
            out[name]["keras_file"] = _saved_and_loaded(model, sys.argv[2] + f".{name}.keras")
        if name in ("adamw", "adamw_accumulate"):  # what `tfaccel memory --shard-optimizer-state` predicts per device
            estimate = estimate_memory(zc.layers, input_shape=(8,), num_classes=3, batch_size=zc.BATCH,
                                       strategy="mirrored", replicas=N, optimizer=optimizer(), recompute=False,
                                       shard_optimizer_state=True, **zc.FIT_OPTIONS.get(name, {}))
            out[name]["estimate"] = [share + estimate.accumulator_bytes for share in estimate.optimizer_shard_bytes]
    for name, optimizer in zc.EMBEDDING_OPTIMIZERS.items():
        out[name] = _embedding_case(mirrored, optimizer)
    out["embedding_ema_accumulate"] = _accumulated_averages_beside_a_table()
    for policy in ("mixed_bfloat16", "mixed_float16"):
        for name in MIXED:
            out[f"{name}_{policy}"] = _mixed_precision_case(policy, name)
    if N == 2:  # the CLI's flag, end to end, on this process's mirrored strategy
        from tfaccel.cli.main import main as cli

        summary_path = sys.argv[2] + ".cli.json"
        out["cli_rc"] = cli(["fit", "--model", "mnist_cnn", "--dataset", "digits", "--epochs", "1", "--num-examples",
                             "128", "--strategy", "mirrored", "--shard-optimizer-state", "--json-out", summary_path])
        with open(summary_path) as f:
            out["cli"] = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


def _saved_and_loaded(model, path: str) -> dict:
    """``model.save`` and ``keras.models.load_model`` (in plain Keras): the loaded optimizer's class and variable
    count, the trained one's, and whether the loaded variables equal the trained optimizer's first ones (Keras' own,
    in their order: tfaccel's accumulators come last)."""
    model.save(path)
    loaded = keras.models.load_model(path).optimizer
    values = [v.numpy() for v in model.optimizer.variables]
    return {"class": type(loaded).__name__, "count": len(loaded.variables), "trained_count": len(values),
            "equal": all(np.array_equal(a.numpy(), b) for a, b in zip(loaded.variables, values))}


def _plain_fit(plain, x, y, case):
    return {**zc.plain_fit(plain, x, y, case), "plain_iterations": int(plain.optimizer.iterations.numpy())}


if __name__ == "__main__":
    main()
