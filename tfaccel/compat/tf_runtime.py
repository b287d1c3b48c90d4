"""TensorFlow's eager context, which has no public spelling on TF 2.21.0 for two things tfaccel needs:

- whether the runtime is initialised (``context.context()._initialized``): devices can no longer be configured
  once it is, so tfaccel checks before it splits a CPU into virtual devices or hides GPUs;
- the coordination service of MultiWorkerMirroredStrategy, configured before the strategy is built so that
  start-up and lost peers are bounded (``context.configure_coordination_service``; the service leader from
  ``multi_worker_util.coordination_leader``).

tests/strategies/test_compat_tf_runtime.py fails if either moves.
"""

from typing import Any, Sequence

from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context

__all__ = ["runtime_initialised", "coordination_service_configured", "configure_coordination_service"]


def runtime_initialised() -> bool:
    """Whether TensorFlow's runtime has started (its devices are fixed from then on)."""
    return bool(getattr(context.context(), "_initialized", False))


def coordination_service_configured() -> bool:
    """Whether this process's coordination service was configured already (by tfaccel or by the user)."""
    return context.context().coordination_service is not None


def configure_coordination_service(cluster_spec: Any, jobs: Sequence[str], *, register_timeout_s: float,
                                   heartbeat_timeout_s: float) -> None:
    """Configures the standalone coordination service over ``jobs`` of ``cluster_spec``.

    Args:
        cluster_spec: the job's ``tf.train.ClusterSpec``.
        jobs: the job names to coordinate (those absent from the cluster are left out).
        register_timeout_s: every coordinated task must register within this; 0 waits forever. With a limit the
            registration goes through a barrier: without it TF 2.21 does not enforce the limit.
        heartbeat_timeout_s: a task silent for this long is lost.
    """
    coordinated = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
                   for job in jobs if job in cluster_spec.jobs]
    ctx = context.context()
    ctx.configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster_spec),
        cluster_register_timeout_in_ms=int(register_timeout_s * 1000),
        heartbeat_timeout_in_ms=int(heartbeat_timeout_s * 1000), coordinated_jobs=coordinated)
    if register_timeout_s:
        ctx.coordination_service.cluster_register_with_barrier = True
