"""``tfaccel k8s manifest``: the Kubernetes objects that run a tfaccel script without a TF_CONFIG.

Examples::

    tfaccel k8s manifest --kind jobset --workers 2 --image IMG -- python train.py | kubectl apply -f -
    tfaccel k8s manifest --kind indexed-job --workers 4 --image IMG --backup-volume ckpt -- python train.py
    tfaccel k8s manifest --kind trainjob --workers 2 --image IMG -- python train.py
    tfaccel k8s manifest --kind jobset --workers 2 --ps 1 --image IMG -- python train.py

Never imports TensorFlow.
"""

import argparse
import sys

from tfaccel.cluster.kubernetes import DEFAULT_PORT, KINDS


def register(subparsers: "argparse._SubParsersAction") -> None:
    parser = subparsers.add_parser(
        "k8s", help="Kubernetes: print an Indexed Job, JobSet or Trainer v2 TrainJob manifest for a tfaccel script",
        description="Kubernetes helpers. `manifest` prints the objects (YAML) that run a command on N pods as one "
        "tfaccel cluster: the pods read their place from the Job/JobSet labels (downward API), no TF_CONFIG.")
    verbs = parser.add_subparsers(dest="k8s_verb", metavar="ACTION", help="what to do (manifest)")
    manifest = verbs.add_parser(
        "manifest", help="print the manifest (YAML) for kubectl apply -f -",
        description="Print a complete manifest: the Job/JobSet/TrainJob (and for an Indexed Job its headless "
        "Service), the downward-API variables tfaccel reads, a podFailurePolicy that replaces a pod preempted after "
        "its backup (exit 75) and fails the job at once on a configuration error (exit 2), a "
        "terminationGracePeriodSeconds above the preemption timeout, and the backup volume (mounted at /backup) on "
        "every pod. Arguments after -- are the pods' command.")
    manifest.add_argument("--kind", choices=KINDS, required=True, help="indexed-job: a batch/v1 Indexed Job + "
                          "headless Service; jobset: a JobSet (jobset.x-k8s.io/v1alpha2); trainjob: a Kubeflow "
                          "Trainer v2 TrainJob and its plainML TrainingRuntime")
    manifest.add_argument("--name", default="tfaccel-train", help="the job's name (DNS label); defaults to "
                          "tfaccel-train")
    manifest.add_argument("--workers", type=int, required=True, metavar="N", help="training pods; with --ps, the "
                          "workers that serve beside the chief")
    manifest.add_argument("--ps", type=int, default=0, metavar="N", help="parameter servers (jobset only); "
                          "defaults to 0")
    manifest.add_argument("--image", required=True, metavar="IMG", help="the container image")
    manifest.add_argument("--backup-volume", metavar="CLAIM", help="a PersistentVolumeClaim mounted at /backup in "
                          "every pod (give fit backup_dir='/backup')")
    manifest.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"every task's port; defaults to "
                          f"{DEFAULT_PORT}")
    manifest.add_argument("--namespace", metavar="NS", help="the namespace; defaults to kubectl's current one")
    manifest.add_argument("command", nargs="*", metavar="-- COMMAND", help="the pods' command, e.g. -- python "
                          "train.py")
    manifest.set_defaults(func=run_manifest)
    parser.set_defaults(func=lambda args: (parser.print_help(sys.stderr), 2)[1])


def run_manifest(args: argparse.Namespace) -> int:
    from tfaccel.cluster.k8s_manifest import k8s_manifest_yaml  # PyYAML and the manifest builders, only here

    sys.stdout.write(k8s_manifest_yaml(args.kind, name=args.name, image=args.image, command=args.command,
                                       workers=args.workers, ps=args.ps, backup_claim=args.backup_volume,
                                       port=args.port, namespace=args.namespace))
    return 0
