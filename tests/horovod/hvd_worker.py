"""One Horovod rank for tests/horovod (run through horovodrun; not collected by pytest).

Trains a tiny regression MLP with plain Keras 3 ``model.fit`` on this rank's shard, from an initial state
that deliberately differs per rank (seed 100 + rank), and writes ``rank<R>.npz`` into ``--out``: initial and
final weights, the loss history, the optimizer step count.

Modes:
  tfaccel   tfaccel's backend: make_backend(), backend.wrap_optimizer(Adam), backend.extra_callbacks().
  upstream  horovod.tensorflow.keras.DistributedOptimizer(Adam) (Horovod's Keras 2 wrapper), after broadcasting
            the model variables so that both ranks start equal; also records the error of Horovod's own
            BroadcastGlobalVariablesCallback under Keras 3.
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("tfaccel", "upstream"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--compression", default="none")
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    from tfaccel.strategies import horovod as tfhvd

    info = {}
    if args.mode == "tfaccel":
        backend = tfhvd.make_backend(devices=None, task=None, compression=args.compression)
        rank, size = backend.worker_index, backend.num_workers
        info.update(name=backend.name, is_chief=backend.is_chief, replicas=backend.num_replicas_in_sync,
                    supports_jit=backend.supports_jit)
    else:
        import horovod.tensorflow.keras as hvd_keras

        hvd_keras.init()
        rank, size = hvd_keras.rank(), hvd_keras.size()

    keras.utils.set_random_seed(100 + rank)  # different initial weights on every rank, on purpose
    data = np.random.RandomState(0)
    x = data.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32") + 0.1).astype("float32")
    x_shard, y_shard = x[rank::size], y[rank::size]  # different data on every rank

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    initial = [w.copy() for w in model.get_weights()]
    optimizer = keras.optimizers.Adam(0.01)
    if args.mode == "tfaccel":
        optimizer = backend.wrap_optimizer(optimizer)
        callbacks = backend.extra_callbacks()
    else:
        optimizer = hvd_keras.DistributedOptimizer(optimizer)
        # Equal start on both ranks (fresh optimizer slots are zeros everywhere). The wrapper's own
        # `variables` is broken under Keras 3 too ('list' object is not callable), so only model variables.
        import horovod.tensorflow as hvd_tf

        hvd_tf.broadcast_variables([v.value for v in model.variables], root_rank=0)
        callbacks = []
        probe = keras.models.clone_model(model)
        probe.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
        try:
            probe.fit(x_shard[:8], y_shard[:8], batch_size=8, epochs=1, verbose=0,
                      callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
            info["upstream_broadcast_error"] = None
        except Exception as exc:  # the point of the probe: record how it fails
            info["upstream_broadcast_error"] = f"{type(exc).__name__}: {exc}"
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    start = [w.copy() for w in model.get_weights()]  # what fit starts from (upstream: after the broadcast)
    history = model.fit(x_shard, y_shard, batch_size=16, epochs=args.epochs, shuffle=False,
                        callbacks=callbacks, verbose=2 if rank == 0 else 0)
    out = Path(args.out)
    np.savez(out / f"rank{rank}.npz", *[w for w in model.get_weights()],
             **{f"initial_{i}": w for i, w in enumerate(initial)}, **{f"start_{i}": w for i, w in enumerate(start)})
    info.update(rank=rank, size=size, loss=[float(v) for v in history.history["loss"]],
                iterations=int(model.optimizer.iterations.numpy()), num_weights=len(initial),
                horovod_rank_env=os.environ.get("HOROVOD_RANK"), pid=os.getpid())
    (out / f"rank{rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()
