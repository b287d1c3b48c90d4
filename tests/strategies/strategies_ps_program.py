"""Child program for the ParameterServer test: ps/worker tasks run a server, the chief coordinates.

Servers exit once the file named by $PS_TEST_DONE exists (the chief creates it), so the test ends promptly.
"""

import json
import os
import sys
import time


def main() -> int:
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    done = os.environ["PS_TEST_DONE"]
    if resolver.task_type in ("ps", "worker"):
        tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                             protocol="grpc", start=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.2)
        os._exit(0)  # a gRPC server has no clean shutdown; the chief is done with us

    from tfaccel.strategies import get_backend

    try:
        backend = get_backend("auto", variable_partitioner=2)
        strategy = backend.strategy
        with strategy.scope():
            counter = tf.Variable(0.0)
            table = tf.Variable(tf.ones((4, 2)))

        @tf.function
        def step():
            counter.assign_add(1.0)
            return tf.reduce_sum(tf.convert_to_tensor(table))

        results = [backend.coordinator.schedule(step) for _ in range(4)]
        backend.coordinator.join()
        print(json.dumps({"ok": True, "strategy": backend.name, "reason": backend.reason,
                          "uses_keras_fit": backend.uses_keras_fit, "num_workers": backend.num_workers,
                          "counter": float(counter.numpy()), "sums": [float(r.fetch()) for r in results],
                          "shards": len(getattr(table, "variables", [table])), "supports_jit": backend.supports_jit}))
    finally:
        open(done, "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
