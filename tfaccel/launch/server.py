"""A ``tf.distribute.Server`` for one task of a cluster, configured from TF_CONFIG.

``python -m tfaccel.launch.server`` is what ``tfaccel launch`` runs in the ps tasks and the worker tasks of a
parameter-server cluster: those tasks only serve; the chief (coordinator) runs the user's command and
schedules work on them. The server uses gRPC and ``inter_op_parallelism_threads = workers + 1`` (an
in-process cluster on 2 CPU cores deadlocked with fewer, measured on TF 2.21), and runs until it
is ended (SIGTERM from the launcher) -- or, when :data:`ENDS_WITH_ENV` names the chief's address (``tfaccel launch``
inside ``srun``, where no launcher sees the chief end), until the chief, once reachable, has stopped accepting
connections for :data:`CHIEF_GONE_S` seconds: then it exits 0, and the job step can end.

Example:
    $ TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python -m tfaccel.launch.server
"""

import argparse
import os
import sys
import time
from typing import List, Optional

from tfaccel.cluster.address import socket_address
from tfaccel.launch.procs import port_open
from tfaccel.log import get_logger

__all__ = ["server_threads", "main", "ENDS_WITH_ENV", "CHIEF_GONE_S", "wait_for_chief_end"]

ENDS_WITH_ENV = "TFACCEL_SERVER_ENDS_WITH"
CHIEF_GONE_S = 5.0


def server_threads(num_workers: int) -> int:
    """``inter_op_parallelism_threads`` for a server of a cluster with ``num_workers`` worker tasks."""
    return num_workers + 1


def main(argv: Optional[List[str]] = None) -> int:
    """Starts the server of the task named by TF_CONFIG and blocks until the process is ended.

    Args:
        argv: command-line arguments (``--inter-op-threads N``, ``--protocol grpc``). Defaults to sys.argv.

    Returns:
        Never returns normally (``join`` blocks); 2 when TF_CONFIG does not name a server task.
    """
    parser = argparse.ArgumentParser(prog="python -m tfaccel.launch.server",
                                     description="Run the tf.distribute.Server of this task (from TF_CONFIG).")
    parser.add_argument("--inter-op-threads", type=int, default=None,
                        help="inter_op_parallelism_threads (default: number of workers + 1)")
    parser.add_argument("--protocol", default="grpc", help="server protocol (default: grpc)")
    args = parser.parse_args(argv)

    from tfaccel.cluster import task_from_env
    from tfaccel.errors import ConfigError

    log = get_logger()
    try:
        task = task_from_env()
    except ConfigError as exc:
        sys.stderr.write(f"tfaccel server: error: {exc}\n")
        return 2
    if task is None or task.task_type not in ("ps", "worker"):
        received = "no TF_CONFIG" if task is None else f"task {task.name}"
        sys.stderr.write(f"tfaccel server: error: TF_CONFIG must name a ps or worker task; received {received}. "
                         "The launcher sets it: run this through `tfaccel launch`.\n")
        return 2

    import tensorflow as tf

    num_workers = len(task.spec.roles.get("worker", ()))
    threads = args.inter_op_threads or server_threads(num_workers)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task.task_type, task_index=task.task_index,
                                  protocol=args.protocol, config=config, start=True)
    log.info("server %s listening at %s (protocol %s, inter_op_parallelism_threads %d)", task.name,
             task.spec.address((task.task_type, task.task_index)), args.protocol, threads)
    chief = os.environ.get(ENDS_WITH_ENV)
    if not chief:
        server.join()
        return 0
    wait_for_chief_end(chief)
    log.info("server %s: the chief at %s stopped accepting connections %g s ago: its job is over, ending this server",
             task.name, chief, CHIEF_GONE_S)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)  # TensorFlow's server cannot be stopped; its threads would keep an orderly exit waiting


def wait_for_chief_end(chief: str, *, gone_s: float = CHIEF_GONE_S, poll_s: float = 0.5) -> None:
    """Returns once the chief at ``"host:port"``, after accepting connections at least once, has refused them for
    ``gone_s`` seconds in a row (a chief that never came up is waited for: the launcher's connect timeout says so)."""
    address = socket_address(chief)
    seen, gone_since = False, None
    while True:
        if port_open(*address, timeout=poll_s):
            seen, gone_since = True, None
        elif seen:
            gone_since = gone_since if gone_since is not None else time.monotonic()
            if time.monotonic() - gone_since >= gone_s:
                return
        time.sleep(poll_s)


if __name__ == "__main__":
    sys.exit(main())
