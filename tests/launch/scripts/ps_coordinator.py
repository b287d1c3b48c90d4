"""Coordinator (chief) of a parameter-server cluster started by `tfaccel launch --ps 1 --workers 2`.

Schedules a few steps of a tiny variable update on the real worker servers through a ClusterCoordinator
and prints a JSON summary: the variable's final value (one increment per step) and where it lives.
"""

import json
import sys

import tensorflow as tf

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    counter = tf.Variable(0.0)
    total = tf.Variable(0.0)


@tf.function
def step(x):
    counter.assign_add(1.0)  # raw tf.Variable.assign_add: exact under concurrent workers
    total.assign_add(x)
    return x


remotes = [coordinator.schedule(step, args=(tf.constant(float(i)),)) for i in range(steps)]
coordinator.join()
print(json.dumps({"counter": float(counter.numpy()), "total": float(total.numpy()), "steps": steps,
                  "returned": sorted(float(r.fetch()) for r in remotes), "device": counter.device,
                  "workers": len(resolver.cluster_spec().as_dict().get("worker", []))}), flush=True)
