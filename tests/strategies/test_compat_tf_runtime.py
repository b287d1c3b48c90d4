"""compat.tf_runtime: TensorFlow's eager context read and configured through its private spelling (TF 2.21.0)."""

import subprocess
import sys
import textwrap

import harness

PROGRAM = textwrap.dedent("""
    import tensorflow as tf
    from tfaccel.compat import tf_runtime as rt

    print("before", rt.runtime_initialised(), rt.coordination_service_configured())
    spec = tf.train.ClusterSpec({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"], "evaluator": ["127.0.0.1:4"]})
    rt.configure_coordination_service(spec, ("chief", "worker"), register_timeout_s=7, heartbeat_timeout_s=3)
    from tensorflow.python.eager import context
    config = context.context().coordination_service
    print("configured", rt.coordination_service_configured(), config.service_leader,
          config.cluster_register_timeout_in_ms, config.heartbeat_timeout_in_ms, config.cluster_register_with_barrier,
          [(job.name, job.num_tasks) for job in config.coordinated_job_list])
    tf.constant(1.0)
    print("after", rt.runtime_initialised())
""")


def test_runtime_state_and_the_coordination_service_through_tensorflows_context() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120,
                         env=harness.CHILD_ENV).stdout.splitlines()
    assert out[0] == "before False False"
    assert out[1] == "configured True /job:chief/replica:0/task:0 7000 3000 True [('chief', 1), ('worker', 2)]"
    assert out[2] == "after True"
