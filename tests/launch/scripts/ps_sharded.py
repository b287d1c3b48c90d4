"""Chief of a `tfaccel launch --ps 2 --workers 1` job: a sharded Embedding trained by tfaccel.fit (issue 15).

The chief trains the same model three ways from the same initial weights and prints one JSON line:
1. with ``TFACCEL_DISABLE_COMPAT=keras_sharded`` (the upstream failure must come back),
2. under parameter_server with ``variable_partitioner=$SHARDS`` (tfaccel.compat.keras_sharded on),
3. with plain Keras ``model.fit`` on this process (the reference; one worker and shuffle=False make the
   coordinator loop synchronous and in fit's order, so the weights must agree).
The sharded run writes checkpoints (checkpoint_dir); the last one is restored into an unsharded model.
"""

import json
import os
import shutil
import sys
import tempfile


def build(rows: int, dim: int):
    import keras

    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(rows, dim),
                              keras.layers.Flatten(), keras.layers.Dense(1, activation="sigmoid")], name="rec")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=["accuracy"])
    return model


def main() -> int:
    import keras
    import numpy as np
    import tensorflow as tf

    import tfaccel
    from tfaccel.compat import keras_sharded

    rows, dim = int(os.environ.get("ROWS", "200000")), int(os.environ.get("DIM", "32"))
    rng = np.random.default_rng(0)
    x = rng.integers(0, rows, size=(256, 4)).astype("int32")
    y = (x[:, 0] % 2).astype("float32")
    out = {}
    options = {"variable_partitioner": int(os.environ.get("SHARDS", "2"))}
    with tfaccel.scope(strategy="parameter_server", strategy_options=options) as plan:
        keras.utils.set_random_seed(1)
        broken = build(rows, dim)
    os.environ["TFACCEL_DISABLE_COMPAT"] = keras_sharded.NAME  # upstream behaviour: the fix is off
    keras_sharded.remove()
    try:
        tfaccel.fit(broken, x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
        out["without_fix"] = "trained"
    except AttributeError as exc:
        out["without_fix"] = str(exc).strip().splitlines()[-1]
    del os.environ["TFACCEL_DISABLE_COMPAT"]
    keras_sharded.apply()

    with tfaccel.scope(strategy="parameter_server", strategy_options=options):
        keras.utils.set_random_seed(1)
        model = build(rows, dim)
    initial = model.get_weights()
    ckpt_dir = tempfile.mkdtemp(prefix="tfaccel-sharded-")
    try:
        result = tfaccel.fit(model, x, y, batch_size=64, epochs=2, shuffle=False, verbose=0, checkpoint_dir=ckpt_dir)
        restored = build(rows, dim)  # unsharded, outside any strategy: the checkpoint holds whole tables
        tf.train.Checkpoint(model=restored).read(result.details["checkpoints"][-1]).expect_partial()
        out["restored_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(),
                                                                                restored.get_weights()))
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    reference = build(rows, dim)
    reference.set_weights(initial)
    expected = reference.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0).history
    slots = [{"name": v.path, "shape": list(v.shape), "device": v.value.device}
             for v in model.optimizer.variables if "embeddings" in v.path]
    out.update(plan_notes=list(plan.notes), placement=result.details["variable_placement"], slots=slots,
               history=result.history, expected=expected, steps=result.steps,
               max_weight_diff=max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(),
                                                                               reference.get_weights())))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
