"""Kubeflow TFJob manifests for a cluster description.

The operator creates one pod per replica and sets each pod's TF_CONFIG itself (with
``"environment": "cloud"``), which :func:`tfaccel.cluster.task_from_env` reads. The host names of the
description do not matter on Kubernetes; the role sizes and each role's port do.
"""

import re
from typing import Any, Dict, List, Optional, Sequence

from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.limits import shorten
from tfaccel.cluster.address import split_address
from tfaccel.cluster.spec import ClusterSpec
from tfaccel.job_id import JOB_ID_ENV

__all__ = ["tfjob_manifest", "tfjob_yaml", "REPLICA_TYPES"]

# tfaccel role -> Kubeflow replica type (one source of truth for the mapping).
REPLICA_TYPES: Dict[str, str] = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def tfjob_manifest(spec: ClusterSpec, *, name: str, image: str, command: Optional[Sequence[str]] = None,
                   namespace: Optional[str] = None, restart_policy: str = "OnFailure") -> Dict[str, Any]:
    """Builds a ``kubeflow.org/v1`` TFJob for ``spec``: one replica spec per role, ``TFACCEL_JOB_ID`` the TFJob's name.

    Args:
        name: the TFJob name (a DNS-1123 label: lowercase letters, digits, '-', at most 63 characters).
        image: the container image every replica runs.
        command: the container command, e.g. ``["python", "train.py"]``. Defaults to the image's entrypoint.
        namespace: Kubernetes namespace. Defaults to none (the current namespace).
        restart_policy: ``OnFailure``, ``Never``, ``Always`` or ``ExitCode``. Defaults to ``OnFailure``.

    Returns:
        The manifest as a dict (see :func:`tfjob_yaml` for text).

    Raises:
        ClusterConfigError: the name, image or restart policy is invalid.

    Example:
        >>> spec = ClusterSpec.from_hosts(workers=["a:2222", "b:2222"])
        >>> tfjob_manifest(spec, name="mnist", image="tf:2.21")["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
        2
    """
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL_RE.match(name):
        raise ClusterConfigError(f"tfjob name {shorten(repr(name))}: must be a DNS-1123 label (lowercase letters, "
                                 "digits and '-', starting and ending with a letter or digit, at most 63 "
                                 "characters), e.g. 'mnist-train'")
    if not isinstance(image, str) or not image.strip() or any(ch.isspace() for ch in image):
        raise ClusterConfigError(f"tfjob image {shorten(repr(image))}: must be a container image reference without "
                                 "spaces, e.g. 'tensorflow/tensorflow:2.21.0'")
    policies = ("OnFailure", "Never", "Always", "ExitCode")
    if restart_policy not in policies:
        raise ClusterConfigError(f"tfjob restart_policy {shorten(repr(restart_policy))}: valid values are "
                                 f"{', '.join(policies)}")
    replicas: Dict[str, Any] = {}
    for role, addresses in spec.roles.items():
        _, port = split_address(addresses[0])
        container: Dict[str, Any] = {"name": "tensorflow", "image": image}
        if command:
            container["command"] = [str(part) for part in command]
        container["ports"] = [{"containerPort": port, "name": "tfjob-port"}]
        # One job id for every replica and every pod restart: backups and the evaluator tell jobs apart by it.
        container["env"] = [{"name": JOB_ID_ENV, "value": name}]
        replicas[REPLICA_TYPES[role]] = {
            "replicas": len(addresses),
            "restartPolicy": restart_policy,
            "template": {"spec": {"containers": [container]}},
        }
    metadata: Dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": metadata,
            "spec": {"tfReplicaSpecs": replicas}}


def tfjob_yaml(spec: ClusterSpec, *, name: str, image: str, command: Optional[List[str]] = None,
               namespace: Optional[str] = None) -> str:
    """The manifest of :func:`tfjob_manifest` as YAML text (``kubectl apply -f -`` reads it)."""
    import yaml

    manifest = tfjob_manifest(spec, name=name, image=image, command=command, namespace=namespace)
    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
