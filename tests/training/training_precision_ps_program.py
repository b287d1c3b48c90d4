"""Child program: compile_and_fit(precision="mixed_float16") on a real parameter-server cluster.

ps/worker tasks run a server until the file named by $PS_TEST_DONE exists (the chief creates it). The chief
trains a tiny model whose last layer outputs float16 and prints one JSON line: the optimizer the coordinator
loop stepped (Keras' compile wrapped it in a LossScaleOptimizer under the mixed_float16 policy of the scope), its
counters, the loss history and the tfaccel warnings.
"""

import json
import logging
import os
import sys
import time


def serve(task_type: str, index: int, done: str) -> None:
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)  # workers + 1 (see VERIFIED.md)
    tf.distribute.Server(resolver.cluster_spec(), job_name=task_type, task_index=index, protocol="grpc",
                         config=config, start=True)
    deadline = time.monotonic() + 140
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.2)
    os._exit(0)  # a gRPC server has no clean shutdown; the chief is done with us


def main() -> int:
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    done = os.environ["PS_TEST_DONE"]
    if task["type"] in ("ps", "worker"):
        serve(task["type"], task["index"], done)
    try:
        import keras
        import numpy as np

        import tfaccel
        from tfaccel.log import get_logger

        warnings = []

        class Keep(logging.Handler):
            def emit(self, record):
                if record.levelno >= logging.WARNING:
                    warnings.append(record.getMessage())

        get_logger().addHandler(Keep())

        def build():
            return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")],
                                    name="half_out")

        rng = np.random.default_rng(0)
        x = rng.standard_normal((128, 6)).astype("float32")
        y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")
        result = tfaccel.compile_and_fit(build, (x, y), epochs=2, global_batch_size=32, precision="mixed_float16",
                                         loss="sparse_categorical_crossentropy", learning_rate=0.05, seed=1,
                                         shuffle=False, verbose=0)
        opt = result.model.optimizer
        print(json.dumps({"strategy": result.plan.strategy, "precision": result.plan.precision,
                          "optimizers": [type(opt).__name__], "steps": result.steps,
                          "step_counter": int(opt.step_counter.numpy()),
                          "inner_iterations": int(opt.inner_optimizer.iterations.numpy()),
                          "loss": result.history["loss"], "warnings": warnings}))
    finally:
        open(done, "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
