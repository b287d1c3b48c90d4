"""Writes k8s_crd_schemas.json: the parts of JobSet's and Kubeflow Trainer v2's CRD schemas that
`tfaccel k8s manifest` uses, pinned to the commits named in the file (run by hand when a manifest gains a field).

    python tests/cluster/data/prune_crd_schemas.py JOBSET_REPO TRAINER_REPO

JOBSET_REPO / TRAINER_REPO are git checkouts (bare is fine) of kubernetes-sigs/jobset and kubeflow/trainer. A key of
a manifest that the CRD does not have stops the script (so the pruned schema only ever holds real fields).
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from tfaccel.cluster.k8s_manifest import k8s_manifest  # noqa: E402

CRDS = {"JobSet": ("jobset", "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"),
        "TrainJob": ("trainer", "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"),
        "TrainingRuntime": ("trainer", "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml")}
KEEP = ("type", "required", "enum", "format", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")


def prune(schema, value, path):
    out = {k: schema[k] for k in KEEP if k in schema}
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is None:
            if "additionalProperties" in schema:
                out["additionalProperties"] = {k: v for k, v in schema["additionalProperties"].items() if k in KEEP}
            return out
        out["properties"] = {}
        for key, sub in value.items():
            if key not in props:
                sys.exit(f"{path}.{key}: not in the CRD schema")
            out["properties"][key] = merge(out["properties"].get(key), prune(props[key], sub, f"{path}.{key}"))
    elif isinstance(value, list) and "items" in schema:
        items = {}
        for i, item in enumerate(value):
            items = merge(items, prune(schema["items"], item, f"{path}[{i}]"))
        out["items"] = items
    return out


def merge(a, b):
    if not a:
        return b
    out = dict(a)
    for key, value in b.items():
        out[key] = merge(a.get(key), value) if isinstance(value, dict) and key in ("properties", "items") or (
            isinstance(value, dict) and isinstance(a.get(key), dict) and key not in KEEP) else value
    return out


def main(jobset, trainer):
    repos = {"jobset": jobset, "trainer": trainer}
    manifests = []
    for kind, extra in (("jobset", {}), ("jobset", {"ps": 1}), ("trainjob", {})):
        manifests += k8s_manifest(kind, name="x", image="i", command=["python", "t.py"], workers=2,
                                  backup_claim="c", namespace="n", **extra)
    out = {"source": {}, "schemas": {}}
    for kind, (repo, path) in CRDS.items():
        commit = subprocess.run(["git", "-C", repos[repo], "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        text = subprocess.run(["git", "-C", repos[repo], "show", f"HEAD:{path}"], capture_output=True, text=True,
                              check=True).stdout
        crd = yaml.safe_load(text)
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        schema = version["schema"]["openAPIV3Schema"]
        pruned = {}
        for doc in manifests:
            if doc["kind"] == kind:
                pruned = merge(pruned, prune(schema, doc, kind))
        out["source"][kind] = {"repository": {"jobset": "kubernetes-sigs/jobset", "trainer": "kubeflow/trainer"}[repo],
                               "commit": commit, "path": path, "apiVersion": f"{crd['spec']['group']}/{version['name']}"}
        out["schemas"][kind] = pruned
    (HERE / "k8s_crd_schemas.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
