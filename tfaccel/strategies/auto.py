"""How ``strategy="auto"`` picks a backend: a fixed order of rules, each with the reason it fired.

Order (first match wins):

1. a TPU is reachable (``COLAB_TPU_ADDR``, ``TPU_NAME``, a TPU VM) -> ``tpu``
2. the cluster (``tfaccel.cluster.sources``: TF_CONFIG, Kubernetes, Vertex AI, SageMaker, SLURM) has more than one
   training task -> ``parameter_server`` if it has ps tasks, else ``multi_worker``
3. Horovod's launch environment (``HOROVOD_RANK``/``HOROVOD_SIZE``, ``OMPI_COMM_WORLD_SIZE``) -> ``horovod``
4. two or more GPUs -> ``mirrored``
5. one GPU -> ``one_device`` on it
6. several (virtual) CPU devices -> ``mirrored`` over them
7. otherwise -> ``default``

The function here only decides; it builds nothing, so the table of rules is tested with injected device
lists and tasks.
"""

import os
from typing import Any, Callable, Mapping, Optional, Tuple

from tfaccel.errors import ConfigError
from tfaccel.strategies._task import training_roles

__all__ = ["HOROVOD_ENV_VARS", "choose_strategy", "horovod_env_var", "horovod_auto_strategy_error"]

HOROVOD_ENV_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE")


def horovod_env_var(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The first Horovod/MPI launch variable set in the environment, or None."""
    env = os.environ if environ is None else environ
    for name in HOROVOD_ENV_VARS:
        if env.get(name):
            return name
    return None


def choose_strategy(*, devices: Any, task: Optional[Any], environ: Optional[Mapping[str, str]] = None,
                    count_cpus: Optional[Callable[[], int]] = None) -> Tuple[str, str]:
    """Picks a registry name for ``strategy="auto"``.

    Args:
        devices: a ``tfaccel.devices.DeviceInfo``.
        task: this process's ``TaskInfo``, or None outside a cluster.
        environ: the environment (for Horovod's variables). Defaults to ``os.environ``.
        count_cpus: called to count logical CPU devices only when the decision gets that far (counting them
            initialises TensorFlow's runtime). Defaults to ``devices.num_cpu_devices``.

    Returns:
        (name, reason).
    """
    if devices.tpu_address:
        return "tpu", f"a TPU is reachable at {devices.tpu_address!r}"
    if task is not None:
        roles = training_roles(task)
        total = sum(len(addrs) for addrs in roles.values())
        shape = ", ".join(f"{role} x{len(addrs)}" for role, addrs in roles.items())
        source = getattr(task, "source", "TF_CONFIG")
        if task.task_type == "evaluator":
            pass  # the side-car evaluator runs alone; fall through to the local rules
        elif total > 1 and roles.get("ps"):
            return "parameter_server", f"{source} describes {total} tasks ({shape}) including ps tasks"
        elif total > 1:
            return "multi_worker", f"{source} describes {total} tasks ({shape}) without ps tasks"
    hvd_var = horovod_env_var(environ)
    if hvd_var:
        return "horovod", f"Horovod's launch environment is present ({hvd_var} is set)"
    if devices.num_gpus >= 2:
        return "mirrored", f"{devices.num_gpus} GPUs are visible"
    if devices.num_gpus == 1:
        return "one_device", f"one GPU is visible ({devices.gpus[0].name})"
    cpus = count_cpus() if count_cpus is not None else devices.num_cpu_devices
    if cpus >= 2:
        return "mirrored", f"no GPU; {cpus} virtual CPU devices are configured"
    reason = "no TPU, no cluster, no Horovod, no GPU and a single CPU device"
    if task is not None and task.task_type == "evaluator":
        reason = "this task is the evaluator, which runs on its own; " + reason
    return "default", reason


def horovod_auto_strategy_error(reason: str, environ: Optional[Mapping[str, str]] = None) -> ConfigError:
    """The error of ``get_strategy("auto")`` in a Horovod rank, saying what to use instead.

    Horovod spreads work without a ``tf.distribute`` strategy: the strategy there is TensorFlow's default one,
    and a plain ``model.fit`` under it trains one independent model per rank without any error.

    Args:
        reason: why ``"auto"`` chose Horovod (names the variable that was seen).
        environ: the environment (for the number of ranks). Defaults to ``os.environ``.

    Returns:
        The ``ConfigError`` to raise.
    """
    env = os.environ if environ is None else environ
    size = env.get("HOROVOD_SIZE") or env.get("OMPI_COMM_WORLD_SIZE")
    ranks = f"{size} independent models (one per rank)" if size and size != "1" else "one independent model per rank"
    return ConfigError(
        f"get_strategy('auto'): this process is a Horovod rank: {reason}. Horovod has no tf.distribute strategy: "
        f"the one returned would be TensorFlow's default strategy, and a plain model.fit under it trains {ranks} "
        "without any error. For a Keras script use `with tfaccel.scope(): <build and compile the model>` then "
        "`tfaccel.fit(model, ...)`: tfaccel wraps the optimizer, broadcasts the initial weights, shards the data and "
        "averages the metrics over the ranks. For a custom training loop use `backend = "
        "tfaccel.get_backend('horovod')` (backend.wrap_optimizer(optimizer), backend.extra_callbacks(), "
        "backend.input_shard). To train one model per process on purpose, ask for get_strategy('default')")
