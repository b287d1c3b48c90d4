"""JobSet pods simulated as closely as this machine allows (no container engine, no kube-apiserver here): each pod a
network namespace with its own address on a bridge, the JobSet DNS names in its /etc/hosts, the environment and
labels `tfaccel k8s manifest --kind jobset` gives it and no TF_CONFIG (tests/cluster/k8s_netns.py says how). The
user's script (strategy "auto") trains multi_worker to identical weights on 2 and on 4 pods; a pod deleted
mid-training the way the kubelet does it exits 75 after the backup, the Job controller follows the manifest's
podFailurePolicy and re-creates the pods (new addresses), and the job ends with the uninterrupted run's weights.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from k8s_netns import JobController, PodNetwork
from k8s_pods import pods_of
from tfaccel.cluster.k8s_manifest import BACKUP_MOUNT, k8s_manifest
from tfaccel.errors import EXIT_PREEMPTED
from tfaccel.launch import netns

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = HERE / "scripts" / "k8s_train.py"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare") or not netns.isolation_available()[0],
    reason="simulated pods need root, iproute2 and network namespaces")]


@pytest.fixture(scope="module")
def network():
    net = PodNetwork(f"{os.getpid() % 100000}")
    yield net
    net.close()
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(f"tfk8s-{net.tag}-")]


def jobset(workers, name):
    return k8s_manifest("jobset", name=name, image="tensorflow/tensorflow:2.21.0",
                        command=["python", str(SCRIPT), BACKUP_MOUNT, "OUT"], workers=workers, backup_claim="ckpt")


def run_job(network, tmp, workers, name, *, on_line=None, step_sleep="0", timeout=400):
    (tmp / "backup").mkdir(parents=True)
    (tmp / "out").mkdir()
    pods = pods_of(jobset(workers, name))
    controller = JobController(network, pods, volumes={BACKUP_MOUNT: str(tmp / "backup"), "OUT": str(tmp / "out")},
                               extra_env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
                                          "K8S_STEP_SLEEP": step_sleep},
                               log=tmp / "pods.log")
    started = time.monotonic()
    status = controller.run(timeout=timeout, on_line=on_line)
    seconds = time.monotonic() - started
    assert status == "Complete", (controller.exits, (tmp / "pods.log").read_text()[-4000:])
    results = [json.loads(line.split("K8S-RESULT ", 1)[1]) for run in controller.running.values()
               for line in run.lines if "K8S-RESULT " in line]
    weights = {p.name: np.load(tmp / "out" / f"{p.hostname}.npz") for p in pods}
    return controller, results, {k: [w[f] for f in w.files] for k, w in weights.items()}, seconds


def same(a, b, atol):
    return all(np.allclose(x, y, rtol=0, atol=atol) for x, y in zip(a, b)) and len(a) == len(b)


@pytest.fixture(scope="module")
def two_pods(network, tmp_path_factory):
    """The uninterrupted 2-pod JobSet (the reference of the preemption test)."""
    return run_job(network, tmp_path_factory.mktemp("two"), 2, "mnist")


def test_two_pods_train_multi_worker_from_the_jobset_labels_alone(two_pods):
    controller, results, weights, seconds = two_pods
    assert len(results) == 2, controller.exits
    for result in results:
        assert result["strategy"] == "multi_worker" and result["replicas"] == 2
        assert result["reason"] == "JobSet describes 2 tasks (worker x2) without ps tasks"
        note = next(n for n in result["notes"] if n.startswith("cluster from JobSet"))
        assert "jobset mnist from TFACCEL_JOBSET_NAME (label jobset.sigs.k8s.io/jobset-name)" in note
        assert re.search(r"resolved mnist-worker-0-0\.mnist=10\.213\.0\.\d+, mnist-worker-1-0\.mnist=10\.213", note)
    first, second = weights.values()
    assert same(first, second, 0.0)
    addresses = {run.address for run in controller.running.values()}
    assert len(addresses) == 2  # each pod its own address
    print(f"2 pods: {seconds:.1f} s")


def test_explain_inside_a_pod_names_the_jobset_and_its_labels(network):
    pods = pods_of(jobset(2, "explain"))
    namespaces = [network.add(pod)[0] for pod in pods]
    out = subprocess.run(["ip", "netns", "exec", namespaces[1], sys.executable, "-m", "tfaccel", "tf-config",
                          "--explain"], env={"PATH": "/usr/sbin:/usr/bin:/bin", **pods[1].env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [" ".join(line.split()) for line in out.stdout.splitlines()]
    assert lines[0].startswith("source: JobSet (sources, first present wins: TF_CONFIG, JobSet")
    assert lines[1] == "task: worker:1 of worker x2" and lines[2] == "address: explain-worker-1-0.explain:2222"
    assert "job-index 1 <- TFACCEL_JOB_INDEX (label jobset.sigs.k8s.io/job-index)" in lines
    assert any(line.startswith("resolved explain-worker-0-0.explain=10.213.0.") for line in lines), lines
    assert lines[-1].startswith('TF_CONFIG: {"cluster":{"worker":["explain-worker-0-0.explain:2222"')


def test_four_pods_train_to_identical_weights(network, tmp_path):
    controller, results, weights, seconds = run_job(network, tmp_path, 4, "four")
    assert sorted(r["replicas"] for r in results) == [4, 4, 4, 4]
    ref = next(iter(weights.values()))
    assert all(same(ref, w, 0.0) for w in weights.values())
    print(f"4 pods: {seconds:.1f} s")


def test_a_deleted_pod_exits_75_and_the_job_ends_with_the_uninterrupted_weights(network, tmp_path, two_pods):
    deleted = {}

    def delete_once(controller):
        run = controller.running.get("preempt-worker-1-0")
        if not deleted and run is not None and sum("K8S: step" in line for line in run.lines) >= 3:
            deleted["seconds"] = controller.delete_pod("preempt-worker-1-0")

    controller, results, weights, seconds = run_job(network, tmp_path, 2, "preempt", on_line=delete_once,
                                                    step_sleep="0.05")
    # both pods of the first attempt stopped at one agreed step and exited 75; the policy replaced them (Ignore)
    first = sorted((name, code, action) for name, attempt, code, action in controller.exits if attempt == 0)
    assert first == [("preempt-worker-0-0", EXIT_PREEMPTED, "Ignore"), ("preempt-worker-1-0", EXIT_PREEMPTED,
                                                                        "Ignore")], controller.exits
    assert deleted["seconds"] < controller.running["preempt-worker-1-0"].pod.spec["terminationGracePeriodSeconds"]
    assert all(r["resumed_from"] for r in results) and len({json.dumps(r["resumed_from"]) for r in results}) == 1
    assert {run.attempt for run in controller.running.values()} == {1}
    assert len({address for _, _, address in controller.addresses}) == 4  # re-created pods, new addresses, same names
    _, _, reference, _ = two_pods
    for name, got in weights.items():
        assert same(got, reference[name.replace("preempt", "mnist")], 1e-6), name
    print(f"preempted 2 pods: {seconds:.1f} s, pod deleted -> exit in {deleted['seconds']:.2f} s")
