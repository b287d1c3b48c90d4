"""``tfaccel launch``'s options: each checked against the backend and mode it belongs to, defaults filled in and
named (the launch log says which were filled in)."""

import argparse
import math
import os
from typing import List, Optional

from tfaccel.cli.launch_elastic import check_elastic, worker_range
from tfaccel.cluster.slurm import SLURM_PS_ENV, in_job_step
from tfaccel.errors import ConfigError
from tfaccel.job_id import check_job_id
from tfaccel.launch.tf_noise import show_tf_logs

__all__ = ["LAUNCH_BACKENDS", "DEFAULT_BACKEND", "DEFAULT_WORKERS", "DEFAULT_RANKS", "DEFAULT_GRACE_S",
           "DEFAULT_CONNECT_TIMEOUT_LOCAL_S", "DEFAULT_CONNECT_TIMEOUT_HOST_S", "launch_options"]

LAUNCH_BACKENDS = ("tf", "horovod", "ray")  # tf: one process per tf.distribute task; horovod: horovodrun ranks;
# ray: Ray Train workers
DEFAULT_BACKEND = "tf"
DEFAULT_WORKERS = 2
DEFAULT_RANKS = 2
DEFAULT_GRACE_S = 10.0
DEFAULT_CONNECT_TIMEOUT_LOCAL_S = 60.0
DEFAULT_CONNECT_TIMEOUT_HOST_S = 300.0


def _positive(name: str, value: Optional[float]) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise ConfigError(f"{name}: must be a positive number of seconds; received {value:g}")


def launch_options(args: argparse.Namespace) -> dict:
    """Validates the options, fills defaults and lists which defaults were filled in."""
    cmd: List[str] = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("command: none given; put it after `--`, e.g. `tfaccel launch --workers 2 -- python "
                          "train.py`")
    backend = args.backend or DEFAULT_BACKEND
    slurm = backend == "tf" and args.cluster is None and args.task is None and in_job_step()
    if slurm:
        _check_slurm_options(args)
    args, elastic = worker_range(args)
    _check_combinations(args, backend)
    check_elastic(args, elastic, backend)
    env_names = _env_names(args, backend)
    if args.max_restarts is not None and args.max_restarts < 0:
        raise ConfigError(f"--max-restarts: must be >= 0; received {args.max_restarts}")
    if args.job_id is not None:
        check_job_id(args.job_id, source="--job-id")
    for name, value in (("--timeout", args.timeout), ("--grace", args.grace),
                        ("--connect-timeout", args.connect_timeout)):
        _positive(name, value)
    per_host = args.task is not None or slurm
    connect_default = DEFAULT_CONNECT_TIMEOUT_HOST_S if per_host else DEFAULT_CONNECT_TIMEOUT_LOCAL_S
    return {
        "cmd": cmd, "per_host": per_host, "slurm": slurm, "task": args.task,
        "filled": _filled(args, backend, connect_default, slurm=slurm), "backend": backend,
        "env_names": env_names, "job_id": args.job_id, "address": args.address, "storage_path": args.storage_path,
        "np": DEFAULT_RANKS if args.np is None else args.np, "hosts": args.hosts, "gloo_timeout": args.gloo_timeout,
        "workers": DEFAULT_WORKERS if args.workers is None else args.workers, "ps": args.ps or 0,
        "chief": bool(args.chief), "evaluator": bool(args.evaluator),
        "max_restarts": args.max_restarts or 0, "timeout": args.timeout, "network": args.network or "auto",
        "count_preemptions": bool(args.count_preemptions),
        "grace": DEFAULT_GRACE_S if args.grace is None else args.grace,
        "connect_timeout": connect_default if args.connect_timeout is None else args.connect_timeout,
        "elastic": elastic, "capacity_file": args.capacity_file,
    }


def _counts(args: argparse.Namespace) -> dict:
    return {"--workers": args.workers, "--ps": args.ps, "--chief": args.chief, "--evaluator": args.evaluator}


def _check_combinations(args: argparse.Namespace, backend: str) -> None:
    """Each option only with the backend and mode it belongs to."""
    counts = _counts(args)
    horovod_only = {"-np": args.np, "-H": args.hosts, "--gloo-timeout": args.gloo_timeout}
    ray_only = {"--address": args.address, "--storage-path": args.storage_path}
    if backend != "ray":
        given = [name for name, value in ray_only.items() if value is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: only with --backend ray; received --backend {backend}. Example: "
                              "tfaccel launch --backend ray --workers 2 --address HOST:6379 -- python train.py")
    if backend == "ray":
        _check_ray_options(args, counts, horovod_only)
    elif backend == "horovod":
        tf_only = dict(counts, **{"--cluster": args.cluster, "--task": args.task,
                                  "--connect-timeout": args.connect_timeout})
        given = [name for name, value in tf_only.items() if value is not None]
        if given:
            raise ConfigError(f"--backend horovod: {', '.join(given)} are for --backend tf (tf.distribute tasks); "
                              "horovodrun places the ranks: use -np N and -H host:slots,...")
    else:
        given = [name for name, value in horovod_only.items() if value is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: only with --backend horovod; received --backend {backend}. "
                              "For tf.distribute tasks use --workers N")
    _check_cluster_options(args, counts)


def _check_cluster_options(args: argparse.Namespace, counts: dict) -> None:
    """--task needs --cluster; --cluster excludes the counts; --network is for local clusters."""
    if args.task is not None and args.cluster is None:
        raise ConfigError(f"--task: needs --cluster FILE (per-host mode reads the whole cluster from it); received "
                          f"--task {args.task} without --cluster")
    if args.cluster is not None:
        given = [name for name, value in counts.items() if value is not None]
        if given:
            raise ConfigError(f"--cluster: given together with {', '.join(given)}; the cluster file already says "
                              "how many tasks of each role there are: pass either --cluster or the counts")
    if args.network is not None and args.task is not None:
        raise ConfigError(f"--network: only for local clusters; received --network {args.network} with --task "
                          f"{args.task} (per-host mode: the task must reach the other hosts); leave --network out")


def _check_slurm_options(args: argparse.Namespace) -> None:
    """Inside ``srun`` the tasks are SLURM's: the local-cluster options would start a private cluster per task."""
    given = [name for name, value in (("--workers", args.workers), ("--chief", args.chief),
                                      ("--evaluator", args.evaluator), ("--network", args.network)) if value is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: this launcher runs inside a SLURM job step (srun task "
                          f"SLURM_PROCID={os.environ.get('SLURM_PROCID')}), whose tasks srun started: tfaccel launch "
                          "runs this task's part of the cluster SLURM describes, and local-cluster options would "
                          "start a separate cluster in every srun task. Drop them (--ps N or $TFACCEL_SLURM_PS makes "
                          "rank 0 the chief and ranks 1..N parameter servers; srun -n sets the number of tasks), or "
                          "run `tfaccel launch --workers N` outside srun, e.g. in the batch script itself")


def _env_names(args: argparse.Namespace, backend: str) -> List[str]:
    """The checked ``--env NAME`` names (Ray and Horovod only)."""
    env_names: List[str] = list(args.env_names or [])
    if not env_names:
        return env_names
    if backend == "tf":
        raise ConfigError(f"--env {env_names[0]}: only with --backend ray or horovod; tf.distribute tasks run on "
                          "this machine with the launcher's whole environment (per-host mode: this host's)")
    from tfaccel.launch.envpolicy import check_env_names

    return list(check_env_names(env_names))


def _filled(args: argparse.Namespace, backend: str, connect_default: float, *, slurm: bool = False) -> List[str]:
    """The defaults filled in, as the options that would set them."""
    filled: List[str] = []
    if args.backend is None:
        filled.append(f"--backend {DEFAULT_BACKEND}")
    if slurm:
        filled.append("the cluster and this task from SLURM (srun's tasks; ports $TFACCEL_SLURM_PORT, else 8888)")
        if args.ps is None:
            filled.append(f"--ps ${SLURM_PS_ENV}, else 0")
    elif backend == "ray":
        if args.workers is None:
            filled.append(f"--workers {DEFAULT_WORKERS}")
        if args.address is None:
            filled.append("--address $RAY_ADDRESS or a private local Ray instance on 127.0.0.1")
    elif backend == "horovod":
        if args.np is None:
            filled.append(f"-np {DEFAULT_RANKS}")
        if args.hosts is None:
            filled.append("-H localhost:N")
    elif args.cluster is None:
        if args.workers is None:
            filled.append(f"--workers {DEFAULT_WORKERS}")
        filled.append("ports chosen by the OS on 127.0.0.1")
    if args.network is None and args.task is None and not slurm:
        filled.append("--network auto")
    for value, option in ((args.max_restarts, "--max-restarts 0"), (args.timeout, "--timeout none"),
                          (args.grace, f"--grace {DEFAULT_GRACE_S:g}")):
        if value is None:
            filled.append(option)
    if args.connect_timeout is None and backend == "tf":
        filled.append(f"--connect-timeout {connect_default:g}")
    if not getattr(args, "tf_logs", False) and not show_tf_logs():
        filled.append("TensorFlow's start-up banners left out (--tf-logs shows them)")
    return filled


def _check_ray_options(args: argparse.Namespace, counts: dict, horovod_only: dict) -> None:
    """--backend ray takes --workers (Ray Train workers), not the tf.distribute layout or Horovod's options."""
    other = dict(counts, **horovod_only, **{"--cluster": args.cluster, "--task": args.task,
                                            "--connect-timeout": args.connect_timeout})
    other.pop("--workers")
    given = [name for name, value in other.items() if value is not None]
    if given:
        raise ConfigError(f"--backend ray: {', '.join(given)} are not Ray options; Ray Train places the workers "
                          "(worker 0 is the chief): use --workers N, and --address HOST:PORT to join a cluster")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers: must be >= 1; received {args.workers}")
    if args.address is not None and not args.address.strip():
        raise ConfigError("--address: received an empty address; give the head's host:port (e.g. 10.0.0.1:6379), "
                          "`auto`, or leave it out for a private local Ray instance")
