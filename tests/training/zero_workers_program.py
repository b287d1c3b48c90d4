"""Differential check of shard_optimizer_state=True under multi_worker (one CPU per worker process, started by the
test's harness with TF_CONFIG on loopback): for each optimizer case, tfaccel.fit sharded over the workers against
plain ``model.fit`` on one device (in the chief's process alone), same initial weights. The sharded fit of
"adam_schedule" is also the check of backups of sharded state (and "adamw_accumulate" of backups of sharded
accumulation, every 4 steps, resumed from step 4): a backup every 3 steps, stopped by an exception at epoch 1 step 5 on
every worker (the backup at step 3 left behind, each worker's shard in it; the chief copies it to
``argv[1]/kept``), resumed by a fresh model (whose weights and history are compared), saved with ``model.save`` by
every worker (the chief's file: ``argv[1]/model.keras``) and that file loaded in plain Keras. With ``argv[2] ==
"parity"`` (the 4-worker launch) every case is a plain sharded fit, nothing else. Both launches also train an
Embedding table (left unsharded) beside sharded Dense layers, with clipnorm and with global_clipnorm. Each case also
reports the bytes given to the collectives of one sharded step (``keras_zero_collective.exchange_bytes``). Prints one
JSON line."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from tfaccel.strategies import get_backend

get_backend("multi_worker")  # first: the collective strategy must exist before TensorFlow's runtime starts

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.compat.keras_zero_collective import exchange_bytes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: zero_cases

import zero_cases as zc  # noqa: E402

CASES = zc.OPTIMIZERS


def main() -> None:
    x, y = zc.data()
    out, parity_only = {}, sys.argv[2:] == ["parity"]
    chief = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0
    for name, optimizer in CASES.items():
        plain = zc.model(zc.REFERENCES.get(name, optimizer), scope=tf.distribute.get_strategy().scope())
        initial = plain.get_weights()
        # the reference, plain fit on one device: the same on every worker, so the chief's alone
        reference = _plain_fit(plain, x, y, name) if chief else {}
        if name == "adam_schedule" and not parity_only:  # stopped, backed up, resumed: it must still end as plain fit
            model, result, out["resume"] = _stopped_and_resumed(x, y, optimizer, initial)
        elif name == "adamw_accumulate" and not parity_only:  # the same, backed up at the end of an update
            model, result = _accumulation_resumed(x, y, optimizer, initial, zc.FIT_OPTIONS[name])
        else:
            model = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="multi_worker"))
            result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0, seed=0,
                                 shard_optimizer_state=True, **zc.FIT_OPTIONS.get(name, {}), **zc.extras(name))
        out[name] = {"history": result.history, "weights": [w.tolist() for w in model.get_weights()],
                     "bytes": sum(result.details["optimizer_state_bytes"].values()),
                     "variable_bytes": [int(np.prod(v.shape)) * 4 for v in plain.trainable_variables],
                     "exchange": exchange_bytes(model.distribute_strategy), "resumed_from": result.resumed_from,
                     **reference}
        if chief and name == "adam_schedule" and not parity_only:
            out["resume"]["plain_state"] = [v.numpy().tolist() for v in plain.optimizer.variables]
    for name, optimizer in {**zc.EMBEDDING_OPTIMIZERS, **zc.EMBEDDING_UNCLIPPED}.items():
        out[name] = _embedding_case(optimizer, chief)
    if not parity_only:
        out["checkpoint_dir_refusal"] = _checkpoint_dir_refusal(x, y, initial)
        out["loss_scaled"] = _loss_scaled(x, y)
    print(json.dumps(out))


def _plain_fit(plain, x, y, case):
    return {**zc.plain_fit(plain, x, y, case),
            "full_bytes": sum(int(np.prod(v.shape)) * 4 for v in plain.optimizer.variables)}


def _embedding_case(optimizer, chief):
    """An Embedding table left unsharded (its sparse gradient all-reduced by the strategy, every worker updates it)
    beside Dense layers sharded over the workers, against plain ``model.fit`` on one device (the chief's)."""
    x, y = zc.embedding_data()
    plain = zc.embedding_model(tf.distribute.get_strategy().scope(), optimizer)
    model = zc.embedding_model(tfaccel.scope(strategy="multi_worker"), optimizer)
    model.set_weights(plain.get_weights())
    reference = zc.plain_fit(plain, x, y) if chief else {}
    result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0, seed=0,
                         shard_optimizer_state=True)
    return {"history": result.history, "weights": [w.tolist() for w in model.get_weights()],
            "note": result.details.get("optimizer_state"),
            "slot_shapes": [list(v.shape) for v in model.optimizer.variables],
            "exchange": exchange_bytes(model.distribute_strategy),
            "variable_sizes": {v.path: int(np.prod(v.shape)) for v in model.trainable_variables}, **reference}


def _checkpoint_dir_refusal(x, y, initial):
    """What a sharded multi_worker fit with checkpoint_dir says (refused before training: nothing to run)."""
    model = zc.model(CASES["adamw"], initial, scope=tfaccel.scope(strategy="multi_worker"))
    try:
        tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=1, verbose=0, shard_optimizer_state=True,
                    checkpoint_dir=os.path.join(sys.argv[1], "ckpt"))
    except tfaccel.ConfigError as exc:
        return str(exc)
    return "trained"


def _loss_scaled(x, y):
    """mixed_float16 with AdamW in a LossScaleOptimizer whose first scale overflows float16 (the first steps skipped,
    the scale halved, then doubled every 2 finite steps), sharded and unsharded over the workers: final weights,
    history, scale and updates of each; then the sharded job stopped at epoch 1 step 5 with a backup every 3 steps
    and resumed by a fresh model, whose ``model.save`` (every worker) the chief loads in plain Keras."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        optimizer = lambda: keras.optimizers.LossScaleOptimizer(  # noqa: E731
            CASES["adamw"](), initial_scale=2.0 ** 16, dynamic_growth_steps=2)
        initial = zc.model(optimizer).get_weights()
        out = {}
        for mode in ("sharded", "unsharded", "resumed"):
            model = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="multi_worker"))
            result = _loss_scaled_fit(model, x, y, mode)
            out[mode] = {"history": result.history, "weights": [w.tolist() for w in model.get_weights()],
                         "note": result.details.get("optimizer_state"), "resumed_from": result.resumed_from,
                         "scale": float(model.optimizer.dynamic_scale.numpy()),
                         "updates": int(model.optimizer.inner_optimizer.iterations.numpy())}
            if mode == "unsharded":
                out[mode]["state"] = [v.numpy().tolist() for v in model.optimizer.variables]
        out["saved_state"] = _saved_and_loaded(model, "loss_scaled")
        return out
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _loss_scaled_fit(model, x, y, mode):
    """``unsharded``, ``sharded``, or ``resumed``: sharded, stopped after a backup, resumed by this model."""
    kw = dict(batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0, seed=0,
              shard_optimizer_state=mode != "unsharded")
    if mode == "resumed":
        backup = os.path.join(sys.argv[1], "loss_scaled_backup")
        stopped = zc.model(lambda: keras.optimizers.LossScaleOptimizer(
            CASES["adamw"](), initial_scale=2.0 ** 16, dynamic_growth_steps=2), model.get_weights(),
            scope=tfaccel.scope(strategy="multi_worker"))
        try:
            tfaccel.fit(stopped, x, y, backup_dir=backup, backup_freq=3, callbacks=[zc.StopAt(1, 5)], **kw)
        except RuntimeError:
            pass
        kw.update(backup_dir=backup, backup_freq=3)
    return tfaccel.fit(model, x, y, **kw)


def _saved_and_loaded(model, name):
    """``model.save`` on every worker; the optimizer variables of the chief's file loaded in plain Keras (None
    elsewhere)."""
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    path = os.path.join(sys.argv[1], f"{name}.keras" if task == 0 else f"{name}-{task}.keras")
    model.save(path)  # every worker: the slots are gathered from their owners
    if task != 0:
        return None
    return [v.numpy().tolist() for v in keras.models.load_model(path).optimizer.variables]


def _stopped_and_resumed(x, y, optimizer, initial):
    """The sharded fit stopped at epoch 1 step 5, the fit of a fresh model that resumes it, its .keras file saved
    by every worker and loaded in plain Keras: ``(model, result, what was seen)``."""
    work = sys.argv[1]
    backup, kw = os.path.join(work, "backup"), dict(batch_size=zc.BATCH, shuffle=False, verbose=0, seed=0, loop="keras")
    stopped = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="multi_worker"))
    try:
        tfaccel.fit(stopped, x, y, epochs=zc.EPOCHS, shard_optimizer_state=True, backup_dir=backup, backup_freq=3,
                    callbacks=[zc.StopAt(1, 5)], **kw)
    except RuntimeError:
        pass
    with open(os.path.join(backup, "tfaccel_backup.json")) as fh:
        pointer = json.load(fh)
    left = sorted(os.listdir(backup))
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if task == 0:  # for the test's resume of this backup on one process (another layout)
        shutil.copytree(backup, os.path.join(work, "kept"))
    model = zc.model(optimizer, scope=tfaccel.scope(strategy="multi_worker"))
    result = tfaccel.fit(model, x, y, epochs=zc.EPOCHS, shard_optimizer_state=True, backup_dir=backup, backup_freq=3, **kw)
    path = os.path.join(work, "model.keras" if task == 0 else f"other-{task}.keras")
    model.save(path)  # every worker: the slots are gathered from their owners
    loaded = keras.models.load_model(os.path.join(work, "model.keras")) if task == 0 else None
    return model, result, {
        "pointer": pointer, "left": left, "resumed_from": result.resumed_from,
        "loaded_class": f"{type(loaded.optimizer).__module__}.{type(loaded.optimizer).__name__}" if loaded else None,
        "loaded_state": [v.numpy().tolist() for v in loaded.optimizer.variables] if loaded else None,
        "loaded_weights": [w.tolist() for w in loaded.get_weights()] if loaded else None}


def _accumulation_resumed(x, y, optimizer, initial, options):
    """The sharded fit with gradient accumulation, a backup every 4 steps (2 updates), stopped at epoch 1 step 5
    (inside an update) and resumed by a fresh model from the backup at step 4: ``(model, result)``."""
    kw = dict(batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0, seed=0, shard_optimizer_state=True,
              backup_dir=os.path.join(sys.argv[1], "accumulate_backup"), backup_freq=4, **options)
    try:
        tfaccel.fit(zc.model(optimizer, initial, scope=tfaccel.scope(strategy="multi_worker")), x, y,
                    callbacks=[zc.StopAt(1, 5)], **kw)
    except RuntimeError:
        pass
    model = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="multi_worker"))
    return model, tfaccel.fit(model, x, y, **kw)


if __name__ == "__main__":
    main()
