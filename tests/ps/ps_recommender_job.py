"""Chief command of tests/ps: a recommender trained under parameter_server from TFRecord shards read by the workers.

Run by ``tfaccel.launch.run_local(..., workers=W, ps=2, chief=True)`` (the ps and worker tasks run
``tfaccel.launch.server``). Environment: ``REC_FILES`` (glob of the shards written by the test), ``REC_STEPS``
(steps per epoch), ``REC_EPOCHS``, ``REC_REFERENCE=1`` to also train the same model with plain Keras ``fit`` on the
same data after the parameter-server run (RSS is read before it), ``REC_VERBOSE`` (fit's verbose),
``REC_PARTITIONS`` (``variable_partitioner``, 2 by default), ``REC_OPTIMIZER=sgd`` (SGD instead of Adam).
Prints one JSON line.
"""

import json
import os
import resource
import sys
import time

ROWS, DIM, BATCH = 200_000, 32, 64


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def build():
    import keras

    ids = keras.Input((2,), dtype="int32", name="user_item")  # user id, item id (items offset into the table)
    table = keras.layers.Embedding(ROWS, DIM, name="ids")(ids)  # 200k x 32: split over the ps tasks
    hidden = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(table))
    return keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(hidden), name="recommender")


def compile_(model):
    import keras

    optimizer = keras.optimizers.SGD(0.5) if os.environ.get("REC_OPTIMIZER") == "sgd" else keras.optimizers.Adam(1e-2)
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["binary_accuracy"])


def dataset_fn(input_context):
    """Each worker reads its own shards; (ids, label, sample weight) batches, the partial last one kept."""
    import tensorflow as tf

    from tfaccel.datasets import tfrecord_dataset

    ds = tfrecord_dataset(os.environ["REC_FILES"], feature_shape=(2,), dtype="int32", input_context=input_context)
    ds = ds.map(lambda x, y: (x, tf.cast(y, tf.float32), 1.0 + tf.cast(x[0] % 3 == 0, tf.float32)))
    return ds.batch(BATCH)


def validation():
    import tensorflow as tf

    ds = dataset_fn(tf.distribute.InputContext()).take(8)
    xs, ys, ws = zip(*[tuple(t.numpy() for t in batch) for batch in ds])
    import numpy as np

    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ws)


def placement(model):
    """(variable path, shard index, device, rows) of every shard of the embedding table."""
    try:
        from tfaccel.compat.keras_sharded import sharded_value
    except ImportError:  # the sharding fix has not landed: the embedding cannot have been split
        return []
    out = []
    for variable in model.trainable_variables:
        sharded = sharded_value(variable)
        for index, shard in enumerate(getattr(sharded, "variables", []) if sharded is not None else []):
            out.append([variable.path, index, shard.device, int(shard.shape[0])])
    return out


def main() -> int:

    import tfaccel

    steps, epochs = int(os.environ["REC_STEPS"]), int(os.environ.get("REC_EPOCHS", "1"))
    partitions = int(os.environ.get("REC_PARTITIONS", "2"))
    import keras

    keras.utils.set_random_seed(0)  # the same initial weights as the reference below
    with tfaccel.scope(strategy="parameter_server", strategy_options={"variable_partitioner": partitions}):
        model = build()
        compile_(model)
    val = validation()
    rss_before = rss_mb()
    started = time.perf_counter()
    result = tfaccel.fit(model, dataset_fn, steps_per_epoch=steps, epochs=epochs, validation_data=val,
                         verbose=int(os.environ.get("REC_VERBOSE", "0")))
    seconds = time.perf_counter() - started
    out = {"history": result.history, "accounting": result.details.get("ps_accounting"),
           "optimizer_iterations": result.details.get("optimizer_iterations"),
           "examples_per_sec": result.examples_per_sec, "seconds": round(seconds, 2),
           "rss_before_mb": round(rss_before, 1), "rss_after_mb": round(rss_mb(), 1),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "shards": placement(model), "variables": [[v.path, list(v.shape)] for v in model.trainable_variables]}
    out["evaluated"] = {k: float(v) for k, v in model.evaluate(val[0], val[1], sample_weight=val[2],
                                                               batch_size=32, verbose=0, return_dict=True).items()}
    if os.environ.get("REC_REFERENCE") == "1":  # the same model and data under plain Keras on this process
        import keras
        import tensorflow as tf

        keras.utils.set_random_seed(0)
        reference = build()
        compile_(reference)
        data = dataset_fn(tf.distribute.InputContext()).repeat()
        history = reference.fit(data, steps_per_epoch=steps * epochs, epochs=1, validation_data=val, verbose=0)
        out["reference"] = {k: float(v[-1]) for k, v in history.history.items()}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
