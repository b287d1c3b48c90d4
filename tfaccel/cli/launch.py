"""``tfaccel launch``: start every task of a cluster on this machine, or this host's task of a cluster.

Local mode::

    tfaccel launch --workers 2 -- python train.py            # MultiWorkerMirrored on 127.0.0.1
    tfaccel launch --ps 1 --workers 2 -- python coord.py     # chief runs coord.py; ps/workers run servers
    tfaccel launch --cluster tf_config/local.yaml -- python train.py

Per-host mode::

    tfaccel launch --cluster tf_config/two_hosts.yaml --task worker:1 -- python train.py

Inside a SLURM job step (``srun``), per-host mode with the cluster and this task from SLURM (no file)::

    srun -n 4 tfaccel launch -- python train.py              # 4 workers, MultiWorkerMirrored
    srun -n 4 tfaccel launch --ps 1 -- python coord.py       # rank 0 chief, rank 1 ps, ranks 2-3 workers

Horovod (through ``horovodrun --gloo``, see :mod:`tfaccel.launch.horovod`)::

    tfaccel launch --backend horovod -np 2 -- python train.py
    tfaccel launch --backend horovod -np 2 --max-restarts 1 -- python train.py   # rerun all ranks on failure

Ray Train (see :mod:`tfaccel.launch.ray`; a private local Ray instance on 127.0.0.1 unless --address/RAY_ADDRESS)::

    tfaccel launch --backend ray --workers 2 --max-restarts 1 -- python train.py
    tfaccel launch --backend ray --workers 4 --address 10.0.0.1:6379 -- python train.py
    tfaccel launch --backend ray --workers 2 --env WANDB_API_KEY -- python train.py  # pass one more variable on

Exit status: 0, the failing task's code (128 + N when it was killed by signal N), 124 on --timeout,
128 + N when the launcher got signal N, 1 when peers never came up, 2 for bad options.
"""

import argparse
import json
import os
import shlex
import sys
from typing import List, Optional

from tfaccel.cli.launch_elastic import WORKERS_HELP, add_elastic_options, elastic_dry_run, run_elastic_job
from tfaccel.cli.launch_options import (DEFAULT_BACKEND, DEFAULT_CONNECT_TIMEOUT_HOST_S,
                                        DEFAULT_CONNECT_TIMEOUT_LOCAL_S, DEFAULT_GRACE_S, DEFAULT_RANKS,
                                        DEFAULT_WORKERS, LAUNCH_BACKENDS, launch_options)
from tfaccel.job_id import JOB_ID_ENV
from tfaccel.launch.netns import NETWORK_MODES
from tfaccel.launch.tf_noise import TF_LOGS_ENV

CAPTURE_LINES = 200  # the CLI streams output; it only keeps the tail of each task for its failure report


def register(subparsers: "argparse._SubParsersAction") -> None:
    """Adds the ``launch`` verb."""
    parser = subparsers.add_parser(
        "launch", help="run every task of a cluster locally on 127.0.0.1, or this host's task of a cluster",
        description="Start one process per task with its own TF_CONFIG, prefix their output with the task,\n"
                    "stop them all when one fails. Put the command after `--`.",
        epilog="examples:\n  tfaccel launch --workers 2 -- python train.py\n"
               "  tfaccel launch --ps 1 --workers 2 -- python coordinator.py\n"
               "  tfaccel launch --cluster cluster.yaml --task worker:1 -- python train.py\n"
               "  tfaccel launch --backend horovod -np 2 --max-restarts 1 -- python train.py\n"
               "  tfaccel launch --backend ray --workers 2 --max-restarts 1 -- python train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_cluster_options(parser)
    _add_supervision_options(parser)
    _add_backend_options(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the tasks, their TF_CONFIG and commands; start nothing")
    parser.add_argument("--tf-logs", action="store_true",
                        help="echo TensorFlow's start-up banners and its 'CollectiveAllReduceStrategy eagerly' "
                             f"warning too (default: left out of the tasks' echoed output; same as {TF_LOGS_ENV}=1)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command every task runs")
    parser.set_defaults(func=run_cli)


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    layout = parser.add_argument_group("cluster (local mode unless --task is given)")
    layout.add_argument("--workers", default=None, metavar="N|MIN:MAX",
                        help=f"number of worker tasks on 127.0.0.1, or of Ray Train workers with --backend ray "
                             f"(default: {DEFAULT_WORKERS}){WORKERS_HELP}")
    layout.add_argument("--ps", type=int, default=None, metavar="M",
                        help="number of parameter-server tasks; the command then runs on the chief only (a chief "
                             "is added), ps and worker tasks run tf.distribute servers (default: 0)")
    layout.add_argument("--chief", action="store_true", default=None, help="add a chief task")
    layout.add_argument("--evaluator", action="store_true", default=None,
                        help="add an evaluator task (it runs the command too)")
    layout.add_argument("--cluster", metavar="FILE", default=None,
                        help="cluster file (YAML/JSON); without --task every address must be on this machine")
    layout.add_argument("--task", metavar="NAME", default=None,
                        help="per-host mode: run only this task of --cluster, e.g. worker:1")


def _add_supervision_options(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("supervision")
    run.add_argument("--max-restarts", type=int, default=None, metavar="K",
                     help="restart the whole job (fresh ports) up to K times after a failure; with --backend "
                          "horovod horovodrun is run again with every rank (default: 0)")
    run.add_argument("--count-preemptions", action="store_true",
                     help="count a restart after a preemption (a task exited 75: it stopped at an agreed step, "
                          "backup written) against --max-restarts; by default it is not counted (with --backend ray "
                          "a preemption then ends the launch with exit 75; with --workers MIN:MAX it spends the "
                          "preempted worker's own restarts)")
    run.add_argument("--timeout", type=float, default=None, metavar="S",
                     help="stop everything after S seconds, restarts included; exit 124 (default: none)")
    add_elastic_options(run)
    run.add_argument("--grace", type=float, default=None, metavar="S",
                     help=f"seconds between SIGTERM and SIGKILL when tasks are stopped (default: {DEFAULT_GRACE_S:g})")
    run.add_argument("--connect-timeout", type=float, default=None, metavar="S",
                     help="seconds the other tasks (per-host mode) or the server tasks (local mode) get to accept "
                          f"connections (default: {DEFAULT_CONNECT_TIMEOUT_HOST_S:g} per host, "
                          f"{DEFAULT_CONNECT_TIMEOUT_LOCAL_S:g} local)")
    run.add_argument("--network", choices=NETWORK_MODES, default=None,
                     help="local clusters and Horovod ranks on localhost only. private: run the tasks in a "
                          "network namespace whose only interface is loopback (TensorFlow's servers bind 0.0.0.0, "
                          "so otherwise their ports can be reached from other machines; the tasks then cannot "
                          "reach other machines either); host: this machine's network; auto: private where the "
                          "system allows it (default: auto)")
    run.add_argument("--job-id", default=None, metavar="ID",
                     help="the job's id, TFACCEL_JOB_ID of every task and kept across restarts: backups and the "
                          "evaluator tell jobs apart by it (default: $TFACCEL_JOB_ID, else slurm-$SLURM_JOB_ID, else a "
                          "new one per launch; per-host mode: one derived from the cluster file, the same on every "
                          "host and for every run of the file)")
    run.add_argument("--env", action="append", default=None, metavar="NAME", dest="env_names",
                     help="--backend ray / horovod: also pass this variable of the launcher's environment to every "
                          "worker / rank (repeatable). They get TFACCEL_*, TF_* and the launch's own variables; "
                          "nothing else of this environment (secrets stay home) unless named here")


def _add_backend_options(parser: argparse.ArgumentParser) -> None:
    hvd = parser.add_argument_group("horovod (--backend horovod)")
    hvd.add_argument("--backend", choices=LAUNCH_BACKENDS, default=None,
                     help=f"tf: one process per tf.distribute task (TF_CONFIG); horovod: ranks through horovodrun; "
                          f"ray: Ray Train workers (default: {DEFAULT_BACKEND})")
    hvd.add_argument("-np", dest="np", type=int, default=None, metavar="N",
                     help=f"number of Horovod ranks (default: {DEFAULT_RANKS})")
    hvd.add_argument("-H", dest="hosts", default=None, metavar="HOSTS",
                     help="Horovod hosts, host:slots,... (default: localhost:N)")
    hvd.add_argument("--gloo-timeout", type=int, default=None, metavar="S",
                     help="seconds a Gloo operation may wait for the other ranks (default: horovodrun's)")
    ray_group = parser.add_argument_group("ray (--backend ray; --workers N Ray Train workers)")
    ray_group.add_argument("--address", default=None, metavar="ADDR",
                           help="the Ray cluster to join (head host:port, auto, ray://...); default: $RAY_ADDRESS, "
                                "else a private local Ray instance on 127.0.0.1, stopped afterwards")
    ray_group.add_argument("--storage-path", default=None, metavar="DIR",
                           help="Ray Train's run storage (shared by every node of a cluster); default: Ray's "
                                "(~/ray_results)")


def run_cli(args: argparse.Namespace) -> int:
    """Runs ``tfaccel launch``; returns the exit status."""
    from tfaccel.log import get_logger

    opts = launch_options(args)
    if args.tf_logs:
        os.environ[TF_LOGS_ENV] = "1"  # the launcher's own switch (tfaccel.launch.tf_noise); tasks inherit it
    if args.cluster is not None:
        from tfaccel.cluster import ClusterSpec

        # Read once, here: a bad cluster file is the one line said, before anything else.
        opts["cluster"] = ClusterSpec.from_file(args.cluster)
    log = get_logger()
    if opts["filled"]:
        log.info("launch: defaults filled in (pass the options to set them): %s", ", ".join(opts["filled"]))
    if opts["slurm"]:
        _slurm_task(opts, args.ps)
    if opts["elastic"] and not args.dry_run:
        return run_elastic_job(opts, capture_lines=CAPTURE_LINES)
    if opts["elastic"]:
        said, opts = elastic_dry_run(opts)
        sys.stdout.write(said)
    if opts["backend"] == "horovod":
        return _horovod(opts, dry_run=args.dry_run)
    if opts["backend"] == "ray":
        return _ray(opts, dry_run=args.dry_run)
    if args.dry_run:
        return _dry_run(args, opts)
    if opts["per_host"]:
        from tfaccel.launch.host import run_host

        result = run_host(opts["cmd"], cluster=opts["cluster"], task=opts["task"], timeout=opts["timeout"],
                          max_restarts=opts["max_restarts"], grace=opts["grace"],
                          connect_timeout=opts["connect_timeout"], capture_lines=CAPTURE_LINES, job_id=opts["job_id"],
                          count_preemptions=opts["count_preemptions"], servers_end_with_chief=opts["slurm"])
    else:
        from tfaccel.launch.local import run_local

        local = {"cluster": opts["cluster"]} if args.cluster is not None else {
            "workers": opts["workers"], "ps": opts["ps"], "chief": opts["chief"], "evaluator": opts["evaluator"]}
        result = run_local(opts["cmd"], timeout=opts["timeout"], max_restarts=opts["max_restarts"],
                           grace=opts["grace"], connect_timeout=opts["connect_timeout"], capture_lines=CAPTURE_LINES,
                           network=opts["network"], job_id=opts["job_id"], count_preemptions=opts["count_preemptions"],
                           **local)
    return result.returncode


def _slurm_task(opts: dict, ps: Optional[int]) -> None:
    """Inside ``srun``: this task's part of the cluster SLURM describes, run in per-host mode (fills ``opts``)."""
    from tfaccel.cluster import slurm_task
    from tfaccel.log import get_logger

    info = slurm_task(ps=ps)
    assert info is not None  # launch_options saw a job step
    opts["cluster"], opts["task"] = info.spec, info.name
    shape = ", ".join(f"{role} x{len(addrs)}" for role, addrs in info.spec.roles.items())
    get_logger().info("launch: inside SLURM job step %s: this srun task is %s (%s) of the %d-task cluster SLURM "
                      "describes (%s); running it in per-host mode", os.environ.get("SLURM_STEP_ID", "?"), info.name,
                      info.address, info.num_tasks, shape, extra={"all_tasks": True})  # every task says its role


def _dry_run(args: argparse.Namespace, opts: dict) -> int:
    from tfaccel.launch.command import child_base_env, normalize_command
    from tfaccel.launch.tasks import build_tasks, local_specs
    from tfaccel.log import get_logger

    peers: List = []
    if opts["per_host"]:
        from tfaccel.launch.host import host_plan

        spec, task, peers, notes = host_plan(opts["cmd"], cluster=opts["cluster"], task=opts["task"],
                                             job_id=opts["job_id"], servers_end_with_chief=opts["slurm"])
        tasks = [task]
    else:
        if args.cluster is not None:
            make_spec, notes = local_specs(cluster=opts["cluster"])
        else:
            make_spec, notes = local_specs(workers=opts["workers"], ps=opts["ps"], chief=opts["chief"],
                                           evaluator=opts["evaluator"])
        argv, cmd_notes = normalize_command(opts["cmd"], check_exists=True)
        notes = notes + cmd_notes
        spec = make_spec(0)
        tasks = build_tasks(spec, lambda _name: argv, env=child_base_env())
    for note in notes:
        get_logger().info("launch: %s", note)
    mode = f"per-host mode, task {tasks[0].name}" if opts["per_host"] else "local mode"
    out = [f"tfaccel launch --dry-run ({mode}): would start {len(tasks)} task(s) of a {spec.num_tasks}-task cluster, "
           f"strategy hint {spec.strategy_hint}; nothing was started"]
    for task in tasks:
        role = "server" if task.server else "command"
        out.append(f"{task.name}  {task.address or '-'}  {role}: {shlex.join(task.cmd)}")
        out.append(f"    TF_CONFIG={task.tf_config}")
        if JOB_ID_ENV in task.env:
            out.append(f"    {JOB_ID_ENV}={task.env[JOB_ID_ENV]}")
    if peers:
        out.append(f"would wait up to {opts['connect_timeout']:g} s for: "
                   + ", ".join(f"{name} ({address})" for name, address in peers))
    if not opts["per_host"] and args.cluster is None:
        out.append("ports are chosen again by the OS when the job starts (and on every restart)")
    keys = ("max_restarts", "timeout", "grace", "connect_timeout") + (() if opts["per_host"] else ("network",))
    out.append("options: " + json.dumps({k: opts[k] for k in keys}))
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _horovod(opts: dict, *, dry_run: bool) -> int:
    from tfaccel.launch.horovod import build_horovodrun_command, run_horovod

    if dry_run:
        argv = build_horovodrun_command(opts["np"], opts["hosts"], opts["cmd"], gloo_timeout=opts["gloo_timeout"])
        restarts = (f"; on a failure all ranks are started again, up to {opts['max_restarts']} time(s)"
                    if opts["max_restarts"] else "")
        sys.stdout.write(f"tfaccel launch --dry-run (horovod): would start {opts['np']} rank(s) through "
                         f"horovodrun{restarts}; nothing was started\n"
                         "options: " + json.dumps({k: opts[k] for k in ("max_restarts", "timeout", "grace",
                                                                         "network")}) + "\n"
                         f"{shlex.join(argv)}\n")
        return 0
    result = run_horovod(opts["np"], opts["cmd"], hosts=opts["hosts"], timeout=opts["timeout"], grace=opts["grace"],
                         gloo_timeout=opts["gloo_timeout"], max_restarts=opts["max_restarts"],
                         capture_lines=CAPTURE_LINES, network=opts["network"], forward=opts["env_names"],
                         job_id=opts["job_id"], count_preemptions=opts["count_preemptions"])
    return result.returncode


def _ray(opts: dict, *, dry_run: bool) -> int:
    from tfaccel.launch.command import normalize_command
    from tfaccel.launch.ray import run_ray

    if dry_run:
        argv, _notes = normalize_command(opts["cmd"], check_exists=opts["address"] is None)
        where = f"the Ray cluster at {opts['address']}" if opts["address"] else \
            "a private local Ray instance on 127.0.0.1 (or $RAY_ADDRESS)"
        restarts = (f"; on a failure Ray restarts the worker group, up to {opts['max_restarts']} time(s)"
                    if opts["max_restarts"] else "")
        sys.stdout.write(f"tfaccel launch --dry-run (ray): would run {opts['workers']} Ray Train worker(s) on "
                         f"{where}{restarts}; nothing was started\n"
                         "options: " + json.dumps({k: opts[k] for k in ("workers", "address", "storage_path",
                                                                         "max_restarts", "timeout", "grace",
                                                                         "network")}) + "\n"
                         f"{shlex.join(argv)}\n")
        return 0
    result = run_ray(opts["cmd"], workers=opts["workers"], address=opts["address"],
                     max_restarts=opts["max_restarts"], timeout=opts["timeout"], grace=opts["grace"],
                     storage_path=opts["storage_path"], capture_lines=CAPTURE_LINES, network=opts["network"],
                     forward=opts["env_names"], job_id=opts["job_id"], count_preemptions=opts["count_preemptions"])
    return result.returncode
