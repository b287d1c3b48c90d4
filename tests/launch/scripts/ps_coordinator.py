"""Coordinator (chief) of a parameter-server cluster started by `tfaccel launch --ps 1 --workers 2`.

Schedules a few steps of a tiny variable update on the real worker servers through a ClusterCoordinator
and prints a JSON summary: the variable's final value (one increment per step) and where it lives.
"""

import json
import os
import socket
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


# Per-host mode makes every task wait for the others' ports: the coordinator must listen on its own address.
tf_config = json.loads(os.environ["TF_CONFIG"])
host, _, port = tf_config["cluster"]["chief"][0].rpartition(":")
try:
    socket.create_connection((host, int(port)), timeout=2).close()
    chief_listening = True
except OSError:
    chief_listening = False

remotes = [coordinator.schedule(step, args=(tf.constant(float(i)),)) for i in range(steps)]
coordinator.join()
print(json.dumps({"counter": float(counter.numpy()), "total": float(total.numpy()), "steps": steps,
                  "returned": sorted(float(r.fetch()) for r in remotes), "device": counter.device,
                  "workers": len(resolver.cluster_spec().as_dict().get("worker", [])),
                  "chief_listening": chief_listening}), flush=True)
