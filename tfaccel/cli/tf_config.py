"""``tfaccel tf-config``: validate a cluster description and print TF_CONFIGs or a Kubeflow TFJob.

Examples::

    tfaccel tf-config tf_config/two_workers.yaml                       # validate + summary
    tfaccel tf-config tf_config/two_workers.yaml --task worker:1       # that task's TF_CONFIG (JSON)
    eval "$(tfaccel tf-config tf_config/two_workers.yaml --task worker:1 --format env)"
    tfaccel tf-config tf_config/two_workers.yaml --all --format env
    tfaccel tf-config --format env                                     # this SLURM task (inside srun)
    tfaccel tf-config --explain                     # this pod's / task's cluster, and where each fact came from
    tfaccel tf-config tf_config/chief_workers_ps.yaml --tfjob mnist --image IMG -- python train.py

Never imports TensorFlow, so it answers in well under a second.
"""

import argparse
import json
import shlex
import sys
from typing import Any, List, Optional, Sequence, Tuple

FORMATS = ("json", "env")


def register(subparsers: "argparse._SubParsersAction") -> None:
    parser = subparsers.add_parser(
        "tf-config", help="validate a cluster description; print a task's TF_CONFIG or a Kubeflow TFJob",
        description="Validate a cluster description (YAML/JSON: role -> list of host:port) and print the "
        "TF_CONFIG of one task (--task), of every task (--all) or a Kubeflow TFJob manifest (--tfjob). "
        "Without FILE the cluster comes from $TF_CONFIG or SLURM (inside srun). Arguments after -- become "
        "the TFJob container command.")
    parser.add_argument("file", nargs="?", metavar="FILE", help="cluster description (.yaml/.yml/.json); "
                        "defaults to $TF_CONFIG, else SLURM's variables")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--task", metavar="ROLE:INDEX", help="the task, e.g. worker:1 or chief; defaults to "
                       "the task in a TF_CONFIG document / this SLURM task")
    which.add_argument("--all", action="store_true", help="print the TF_CONFIG of every task")
    which.add_argument("--tfjob", metavar="NAME", help="print a Kubeflow TFJob manifest (YAML) with this name "
                       "(legacy: see `tfaccel k8s manifest` for Indexed Job, JobSet and TrainJob)")
    which.add_argument("--explain", action="store_true", help="print this process's task, which source described "
                       "it (TF_CONFIG, JobSet, TrainJob, Indexed Job, Vertex AI, SageMaker, SLURM) and where each "
                       "fact came from (variable, label)")
    parser.add_argument("--format", choices=FORMATS, default="json",
                        help="json: the TF_CONFIG JSON; env: an `export TF_CONFIG='...'` line safe to eval. "
                        "Defaults to json")
    parser.add_argument("--image", metavar="IMG", help="container image for --tfjob")
    parser.add_argument("--namespace", metavar="NS", help="Kubernetes namespace for --tfjob")
    parser.add_argument("--slurm-port", type=int, metavar="PORT", default=None,
                        help="SLURM: first port on each node (task k of a node uses PORT+k); defaults to "
                        "$TFACCEL_SLURM_PORT, else 8888")
    parser.add_argument("--slurm-ps", type=int, metavar="N", default=None,
                        help="SLURM: number of parameter servers (rank 0 becomes the chief); defaults to "
                        "$TFACCEL_SLURM_PS, else 0")
    parser.set_defaults(func=run, command=[])
    _split_command_after_dashes(parser)


def _split_command_after_dashes(parser: argparse.ArgumentParser) -> None:
    """Makes ``-- CMD ...`` land in ``args.command`` whatever comes before it.

    argparse cannot mix an optional positional (FILE), options and a trailing ``--`` command (after FILE
    is matched, later positionals are "unrecognized"), so the arguments are split at the first ``--``
    before argparse sees them.
    """
    original = parser.parse_known_args

    def parse_known_args(args: Optional[Sequence[str]] = None, namespace: Any = None) -> Tuple[Any, List[str]]:
        arg_list = list(sys.argv[1:] if args is None else args)
        command: List[str] = []
        if "--" in arg_list:
            cut = arg_list.index("--")
            arg_list, command = arg_list[:cut], arg_list[cut + 1:]
        ns, extras = original(arg_list, namespace)
        ns.command = command
        return ns, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def _env_line(doc: dict) -> str:
    return "export TF_CONFIG=" + shlex.quote(json.dumps(doc, separators=(",", ":")))


def _render(doc: dict, fmt: str) -> str:
    return _env_line(doc) if fmt == "env" else json.dumps(doc, separators=(",", ":"))


def _explain(info: Any) -> str:
    """The ``--explain`` text: the source, the task, each fact with where it came from, the TF_CONFIG it amounts to."""
    from tfaccel.cluster.sources import SOURCES

    order = f"sources, first present wins: {', '.join(SOURCES)}"
    if info is None:
        return f"no cluster: none of the sources is present, so this is a single process ({order})\n"
    roles = ", ".join(f"{role} x{len(addrs)}" for role, addrs in info.spec.roles.items())
    lines = [f"source: {info.source} ({order})", f"task: {info.name} of {roles}{' (chief)' if info.is_chief else ''}",
             f"address: {info.address}"]
    width = max((len(f.what) for f in info.facts), default=0)
    lines += [f"  {f.what:<{width}}  {f.value}  <- {f.origin}" for f in info.facts]
    lines.append("TF_CONFIG: " + json.dumps(info.tf_config(), separators=(",", ":")))
    return "\n".join(lines) + "\n"


def _run_explain(args: argparse.Namespace) -> int:
    from tfaccel.cluster import ClusterConfigError, task_from_env

    if args.file is not None:
        raise ClusterConfigError(f"--explain: reads this process's environment, not FILE {args.file!r}; drop FILE")
    sys.stdout.write(_explain(task_from_env(port=args.slurm_port, ps=args.slurm_ps)))
    return 0


def run(args: argparse.Namespace) -> int:
    from tfaccel.cluster import ClusterConfigError, ClusterSpec, task_from_env, tfjob_yaml

    if args.explain:
        return _run_explain(args)
    if args.file is not None:
        spec = ClusterSpec.from_file(args.file)
        default_task = spec.task
        label = args.file
        environment = None
    else:
        info = task_from_env(port=args.slurm_port, ps=args.slurm_ps)
        if info is None:
            raise ClusterConfigError("FILE: no cluster description given and no source describes one here (TF_CONFIG, "
                                     "a JobSet / TrainJob / Indexed Job pod, Vertex AI, SageMaker, SLURM's srun); "
                                     "give FILE, e.g. tf_config/two_workers.yaml")
        spec = info.spec
        default_task = (info.task_type, info.task_index)
        label = info.source
        environment = info.environment

    if args.command and not args.tfjob:
        raise ClusterConfigError(f"command after -- {' '.join(args.command)!r}: only used with --tfjob NAME "
                                 "--image IMG; drop it or add --tfjob")
    if args.tfjob is not None:
        if not args.image:
            raise ClusterConfigError(f"--tfjob {args.tfjob!r}: needs --image IMG, e.g. "
                                     "--image tensorflow/tensorflow:2.21.0")
        if args.format != "json":
            raise ClusterConfigError(f"--format {args.format!r}: does not apply to --tfjob "
                                     "(the manifest is YAML); drop --format")
        sys.stdout.write(tfjob_yaml(spec, name=args.tfjob, image=args.image, command=args.command or None,
                                    namespace=args.namespace))
        return 0
    if args.image or args.namespace:
        raise ClusterConfigError("--image / --namespace: only used with --tfjob NAME; add --tfjob or drop them")

    if args.all:
        if args.format == "env":
            lines = []
            for role, index in spec.tasks():
                lines.append(f"# {role}:{index}")
                lines.append(_env_line(spec.tf_config((role, index), environment=environment)))
            sys.stdout.write("\n".join(lines) + "\n")
        else:
            docs = {f"{r}:{i}": spec.tf_config((r, i), environment=environment) for r, i in spec.tasks()}
            sys.stdout.write(json.dumps(docs, separators=(",", ":")) + "\n")
        return 0

    task = args.task if args.task is not None else default_task
    if task is None:
        # No task asked for: validate and summarise (stdout), so `tfaccel tf-config FILE` is a checker.
        names = " ".join(f"{r}:{i}" for r, i in spec.tasks())
        sys.stdout.write(f"{label}: valid; {spec.describe()}\n"
                         f"print a task's TF_CONFIG with --task ROLE:INDEX (one of: {names}) or --all\n")
        return 0
    sys.stdout.write(_render(spec.tf_config(task, environment=environment), args.format) + "\n")
    return 0
