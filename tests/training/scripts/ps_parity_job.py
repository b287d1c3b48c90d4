"""Child program of tests/training/test_train_coordinator.py: one task of a chief + 1 worker + 1 ps cluster.

ps/worker tasks run a server (inter_op_parallelism_threads = workers + 1, see VERIFIED.md) until the file named by
$PS_TEST_DONE exists. The chief trains the same small model twice from the same initial weights: with plain Keras
``model.fit`` on this process (the reference), and with ``tfaccel.fit`` (or ``compile_and_fit`` when
$PARITY_API=compile_and_fit, or a dataset_fn of (x, y, sw) batches with $PARITY_API=dataset_fn) under
strategy="parameter_server" on the cluster. One worker runs the closures one after the other, so the coordinator
loop is synchronous-equivalent and must match ``fit``. Prints one JSON line.
"""

import json
import os
import sys
import time


def serve(task_type: str, index: int, done: str) -> None:
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)  # workers + 1
    tf.distribute.Server(resolver.cluster_spec(), job_name=task_type, task_index=index, protocol="grpc",
                         config=config, start=True)
    deadline = time.monotonic() + 170
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.2)
    os._exit(0)  # a gRPC server has no clean shutdown; the chief is done with us


def data():
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.standard_normal((100, 6)).astype("float32")  # 100 = 6 batches of 16 + a partial batch of 4
    labels = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")
    y = np.eye(3, dtype="float32")[labels]
    sw = rng.uniform(0.5, 1.5, 100).astype("float32")
    vx = rng.standard_normal((40, 6)).astype("float32")
    vy = np.eye(3, dtype="float32")[(vx[:, 0] > 0).astype("int64") + (vx[:, 1] > 0.5).astype("int64")]
    vsw = rng.uniform(0.5, 1.5, 40).astype("float32")
    return x, y, sw, (vx, vy, vsw)


def build():
    import keras

    return keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(1e-2),
                           activity_regularizer=keras.regularizers.L1(1e-3)),  # add_loss, through the layer
        keras.layers.Dense(3, activation="softmax")], name="parity")


def compile_(model):
    import keras

    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss="categorical_crossentropy",
                  metrics=["accuracy", "mae"])


def serve_unless_chief() -> str:
    """On a ps or worker task: serves until $PS_TEST_DONE exists, then exits. On the chief: returns that path (the
    chief creates the file when it is done)."""
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    done = os.environ["PS_TEST_DONE"]
    if task["type"] in ("ps", "worker"):
        serve(task["type"], task["index"], done)
    return done


def main() -> int:
    done = serve_unless_chief()
    try:
        import keras
        import numpy as np

        import tfaccel

        x, y, sw, val = data()
        keras.utils.set_random_seed(0)
        initial = build().get_weights()
        fit_args = dict(batch_size=16, epochs=3, shuffle=False, validation_data=val, verbose=0)

        reference = build()
        reference.set_weights(initial)
        compile_(reference)
        expected = reference.fit(x, y, sample_weight=sw, **fit_args).history
        # Read now: joining the cluster below resets TensorFlow's context and this process's own variables with it.
        expected_weights = reference.get_weights()

        if os.environ.get("PARITY_API") == "compile_and_fit":
            def build_compiled():
                model = build()
                model.set_weights(initial)
                compile_(model)
                return model

            result = tfaccel.compile_and_fit(build_compiled, (x, y, sw), strategy="parameter_server",
                                             global_batch_size=16, epochs=3, shuffle=False, validation_data=val,
                                             verbose=0, seed=0)
        elif os.environ.get("PARITY_API") == "dataset_fn":  # the workers build the pipeline: (x, y, sw) batches
            import tensorflow as tf

            def dataset_fn(input_context):
                return tf.data.Dataset.from_tensor_slices((x, y, sw)).batch(16)  # the partial last batch kept

            with tfaccel.scope(strategy="parameter_server"):
                model = build()
                model.set_weights(initial)
                compile_(model)
            result = tfaccel.fit(model, dataset_fn, steps_per_epoch=7, epochs=3, validation_data=val, verbose=0)
        else:
            with tfaccel.scope(strategy="parameter_server"):
                model = build()
                model.set_weights(initial)
                compile_(model)
            result = tfaccel.fit(model, x, y, sample_weight=sw, seed=0, **fit_args)
        model = result.model
        got = result.history
        weights = [np.asarray(w) for w in model.get_weights()]
        # The trained model is usable on the coordinator (tfaccel.compat.keras_ps_model): Keras evaluate on the
        # validation data, predict, and a .keras file that plain Keras loads in another process.
        evaluated = model.evaluate(val[0], val[1], sample_weight=val[2], batch_size=16, verbose=0, return_dict=True)
        predicted = model.predict(val[0], batch_size=16, verbose=0)
        saved = os.path.join(os.path.dirname(done), "trained.keras")
        model.save(saved)
        np.save(saved + ".val_x.npy", val[0])
        print(json.dumps({
            "strategy": result.plan.strategy, "loop": result.details["loop"], "steps": result.steps,
            "optimizer_iterations": result.details.get("optimizer_iterations"),
            "ps_accounting": result.details.get("ps_accounting"),
            "history": got, "expected": expected,
            "max_weight_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(weights, expected_weights)),
            "optimizer": type(model.optimizer).__name__, "compiled": bool(model.compiled),
            "loss": model.loss, "metrics_names": model.metrics_names,
            "evaluated": {k: float(v) for k, v in evaluated.items()},
            "predicted_sum": float(np.sum(predicted)), "saved": saved}),
            flush=True)
    finally:
        open(done, "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
