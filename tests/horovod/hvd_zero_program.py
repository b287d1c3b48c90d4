"""One Horovod rank of tests/horovod/test_horovod_zero.py (run through horovodrun; not collected by pytest).

For each optimizer case: rank 0 trains the model with plain ``model.fit`` on one process (the reference); then every
rank trains the same model from the same initial weights with ``tfaccel.fit(..., shard_optimizer_state=True)`` under
the ``horovod`` backend. Writes ``rank<R>.json`` into OUT: histories, weights, the bytes of optimizer variables this
rank holds, the plan's note. With 2 ranks, "adam_schedule" also runs stopped and resumed: backed up every 3 steps
(each rank writing its shard), stopped by an exception at epoch 1 step 5 on every rank, resumed by a fresh model;
and mixed_float16 with one rank's gradients overflowing (``_loss_scaled``).
Usage: ``python hvd_zero_program.py OUT``.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np

import tfaccel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: zero_cases

import zero_cases as zc  # noqa: E402


def _held_bytes(optimizer) -> int:
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in optimizer.variables))


def _embedding_case(rank: int, optimizer) -> dict:
    """The Embedding table left unsharded (its slices all-gathered, every rank updates it) beside sharded Dense
    layers, against plain ``model.fit`` in one process (rank 0's)."""
    x, y = zc.embedding_data()
    plain = zc.embedding_model(optimizer=optimizer)
    model = zc.embedding_model(tfaccel.scope(strategy="horovod"), optimizer)
    model.set_weights(plain.get_weights())
    case = zc.plain_fit(plain, x, y) if rank == 0 else {}
    result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0,
                         shard_optimizer_state=True)
    case.update(history=result.history, weights=[w.tolist() for w in model.get_weights()],
                note=result.details.get("optimizer_state"),
                slot_shapes=[list(v.shape) for v in model.optimizer.variables])
    return case


def _stopped_and_resumed(out_dir: str, x, y) -> dict:
    """The sharded Adam-with-schedule fit stopped at epoch 1 step 5 with a backup every 3 steps, then resumed by a
    fresh model: what the backup held, and the resumed run's history and weights."""
    backup = os.path.join(out_dir, "backup")
    kw = dict(batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0, seed=0, shard_optimizer_state=True,
              backup_dir=backup, backup_freq=3)
    stopped = zc.model(zc.OPTIMIZERS["adam_schedule"], scope=tfaccel.scope(strategy="horovod"), metrics=["mae"])
    try:
        tfaccel.fit(stopped, x, y, callbacks=[zc.StopAt(1, 5)], **kw)
    except RuntimeError:
        pass
    with open(os.path.join(backup, "tfaccel_backup.json")) as fh:
        pointer = json.load(fh)
    left = sorted(os.listdir(backup))
    model = zc.model(zc.OPTIMIZERS["adam_schedule"], scope=tfaccel.scope(strategy="horovod"), metrics=["mae"])
    result = tfaccel.fit(model, x, y, **kw)
    return {"pointer": pointer, "left": left, "resumed_from": result.resumed_from, "history": result.history,
            "weights": [w.tolist() for w in model.get_weights()]}


def _accumulation_resumed(out_dir: str, x, y) -> dict:
    """The sharded fit with gradient accumulation (2 micro-batches), a backup every 4 steps, stopped at epoch 1 step 5
    (inside an update), then resumed by a fresh model from the backup at step 4: its position, history and weights."""
    kw = dict(batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0, seed=0, shard_optimizer_state=True,
              backup_dir=os.path.join(out_dir, "accumulate_backup"), backup_freq=4,
              **zc.FIT_OPTIONS["adamw_accumulate"])
    optimizer = zc.OPTIMIZERS["adamw_accumulate"]
    try:
        tfaccel.fit(zc.model(optimizer, scope=tfaccel.scope(strategy="horovod"), metrics=["mae"]), x, y,
                    callbacks=[zc.StopAt(1, 5)], **kw)
    except RuntimeError:
        pass
    model = zc.model(optimizer, scope=tfaccel.scope(strategy="horovod"), metrics=["mae"])
    result = tfaccel.fit(model, x, y, **kw)
    return {"resumed_from": result.resumed_from, "history": result.history,
            "weights": [w.tolist() for w in model.get_weights()]}


def _loss_scaled(rank: int) -> dict:
    """mixed_float16 (AdamW in a LossScaleOptimizer), rows 24-27 of the data 1e5 (inf in float16): the steps whose
    batch holds them overflow on one rank only. Plain ``model.fit`` on one process (rank 0) against tfaccel's
    sharded and unsharded fits: weights, history, loss scale and updates applied."""
    import keras

    x, y = zc.data()
    x[24:28] = 1e5
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        optimizer = lambda: keras.optimizers.LossScaleOptimizer(zc.OPTIMIZERS["adamw"]())  # noqa: E731
        plain = zc.model(optimizer)
        initial = plain.get_weights()
        out = zc.plain_fit(plain, x, y) if rank == 0 else {}
        if rank == 0:
            out["plain_scale"] = float(plain.optimizer.dynamic_scale.numpy())
            out["plain_updates"] = int(plain.optimizer.inner_optimizer.iterations.numpy())
        for mode in ("sharded", "unsharded"):
            model = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="horovod"))
            result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0,
                                 shard_optimizer_state=mode == "sharded")
            out[mode] = {"history": result.history, "weights": [w.tolist() for w in model.get_weights()],
                         "note": result.details.get("optimizer_state"),
                         "scale": float(model.optimizer.dynamic_scale.numpy()),
                         "updates": int(model.optimizer.inner_optimizer.iterations.numpy())}
        return out
    finally:
        keras.mixed_precision.set_global_policy("float32")


def main() -> None:
    out_dir, rank = sys.argv[1], int(os.environ["HOROVOD_RANK"])
    x, y = zc.data()
    out = {"pid": os.getpid()}
    for name, optimizer in zc.OPTIMIZERS.items():
        plain = zc.model(zc.REFERENCES.get(name, optimizer), metrics=["mae"])
        initial = plain.get_weights()
        case = zc.plain_fit(plain, x, y, name) if rank == 0 else {}
        model = zc.model(optimizer, initial, scope=tfaccel.scope(strategy="horovod"), metrics=["mae"])
        result = tfaccel.fit(model, x, y, batch_size=zc.BATCH, epochs=zc.EPOCHS, shuffle=False, verbose=0,
                             shard_optimizer_state=True, **zc.FIT_OPTIONS.get(name, {}), **zc.extras(name))
        case.update(history=result.history, weights=[w.tolist() for w in model.get_weights()],
                    held=_held_bytes(model.optimizer), details_bytes=result.details.get("optimizer_state_bytes"),
                    note=result.details.get("optimizer_state"), plan_notes=list(result.plan.notes),
                    slot_sizes=[int(np.prod(v.shape)) * 4 for v in model.trainable_variables],
                    iterations=int(model.optimizer.iterations.numpy()), strategy=result.plan.strategy)
        out[name] = case
    for name, optimizer in zc.EMBEDDING_OPTIMIZERS.items():
        out[name] = _embedding_case(rank, optimizer)
    if os.environ.get("HOROVOD_SIZE") == "2":
        out["resume"] = _stopped_and_resumed(out_dir, x, y)
        out["accumulate_resume"] = _accumulation_resumed(out_dir, x, y)
        out["loss_scaled"] = _loss_scaled(rank)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
