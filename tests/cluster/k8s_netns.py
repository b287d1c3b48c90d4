"""Kubernetes pods simulated with network namespaces (root and iproute2 needed): a pod network, a kubelet, a Job
controller that follows the manifest's podFailurePolicy.

* The pod network: a bridge inside a private namespace (tfaccel's own ``PrivateNetwork``: its holder process keeps
  the namespace, and it dies with this process); each pod a named namespace (``ip netns add``) with ``eth0``, a veth
  whose peer is on the bridge, and an address of its own.
* Cluster DNS: ``/etc/netns/<namespace>/hosts`` (``ip netns exec`` binds it over ``/etc/hosts``) maps every pod's
  ``<hostname>.<subdomain>`` and ``<hostname>`` to its current address, rewritten in place when a pod is
  re-created with a new address (as the headless Service's records change).
* The kubelet: the container's command in that namespace, in a UTS namespace with the pod's hostname, with the
  environment the manifest gives (the downward API's labels included, tests/cluster/k8s_pods.py) and no TF_CONFIG;
  a volume mount is simulated by rewriting the mount path in the command to the directory standing for the claim.
  Deleting a pod: SIGTERM, ``terminationGracePeriodSeconds``, then SIGKILL.
* The Job controller: a pod that ends with 0 is done; otherwise the manifest's ``podFailurePolicy`` decides
  (``Ignore``: a new pod with the same index, no failure counted; ``FailJob``: every pod is deleted and the job
  fails); another failure counts against ``backoffLimit``.
"""

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from k8s_pods import Pod, failure_action
from tfaccel.launch.netns import PrivateNetwork
from tfaccel.launch.procs import pid_alive, start_process


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclasses.dataclass
class Running:
    pod: Pod
    namespace: str
    address: str
    proc: subprocess.Popen
    lines: List[str]
    attempt: int


class PodNetwork:
    """The bridge and the pods' namespaces; ``close`` removes every namespace and hosts file it made."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.bridge = PrivateNetwork.create()
        self._in_bridge("ip", "link", "add", "br0", "type", "bridge")
        self._in_bridge("ip", "link", "set", "br0", "up")
        self.hosts: Dict[str, str] = {}  # fqdn -> address
        self.short: Dict[str, str] = {}
        self.namespaces: List[str] = []
        self._next = 2
        self._made = 0

    def _in_bridge(self, *cmd: str) -> None:
        subprocess.run(["nsenter", f"--net=/proc/{self.bridge.holder.pid}/ns/net", *cmd], check=True,
                       capture_output=True, timeout=30)

    def add(self, pod: Pod) -> Tuple[str, str]:
        """A new namespace and address for ``pod`` (a re-created pod gets a new one, as on Kubernetes)."""
        self._made += 1
        namespace, peer = f"tfk8s-{self.tag}-{self._made}", f"v{self._made}"
        address = f"10.213.0.{self._next}"
        self._next += 1
        _ip("netns", "add", namespace)
        self.namespaces.append(namespace)
        _ip("link", "add", "eth0", "netns", namespace, "type", "veth", "peer", "name", peer, "netns",
            str(self.bridge.holder.pid))
        self._in_bridge("ip", "link", "set", peer, "master", "br0")
        self._in_bridge("ip", "link", "set", peer, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        self.hosts[pod.fqdn], self.short[pod.fqdn] = address, pod.hostname
        self.write_hosts()
        return namespace, address

    def remove(self, namespace: str) -> None:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        Path(f"/etc/netns/{namespace}/hosts").unlink(missing_ok=True)
        for path in (Path(f"/etc/netns/{namespace}"),):
            if path.exists():
                path.rmdir()

    def write_hosts(self) -> None:
        text = "127.0.0.1 localhost\n" + "".join(f"{a} {fqdn} {self.short[fqdn]}\n" for fqdn, a in self.hosts.items())
        for namespace in self.namespaces:
            path = Path(f"/etc/netns/{namespace}/hosts")
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as fh:  # in place: a running pod's bind mount keeps seeing the file
                fh.write(text)

    def close(self) -> None:
        for namespace in self.namespaces:
            self.remove(namespace)
        self.bridge.close()


class JobController:
    """Runs the pods of one job to the end, as the Job controller and the kubelet would."""

    def __init__(self, network: PodNetwork, pods: List[Pod], *, volumes: Dict[str, str], extra_env: Dict[str, str],
                 log: Path) -> None:
        self.network, self.pods, self.volumes, self.extra_env, self.log = network, pods, volumes, extra_env, log
        self.running: Dict[str, Running] = {}
        self.exits: List[Tuple[str, int, int, Optional[str]]] = []  # (pod name, attempt, exit code, action)
        self.failures = 0
        self.addresses: List[Tuple[str, int, str]] = []  # (pod name, attempt, address), every pod ever started

    def command(self, pod: Pod, namespace: str) -> List[str]:
        cmd = [sys.executable if part == "python" else self.volumes.get(part, part) for part in pod.command]
        return ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', pod.hostname, *cmd]

    def start(self, pod: Pod, attempt: int) -> None:
        old = self.running.get(pod.name)
        if old is not None:
            self.network.namespaces.remove(old.namespace)
            self.network.remove(old.namespace)
        namespace, address = self.network.add(pod)
        env = {"PATH": "/usr/sbin:/usr/bin:/bin", **pod.env, **self.extra_env}
        proc = start_process(self.command(pod, namespace), env=env, die_with_parent=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        self.addresses.append((pod.name, attempt, address))
        run = Running(pod, namespace, address, proc, [], attempt)
        threading.Thread(target=self._read, args=(run,), daemon=True).start()
        self.running[pod.name] = run

    def _read(self, run: Running) -> None:
        with open(self.log, "a") as fh:
            for raw in run.proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                run.lines.append(line)
                fh.write(f"[{run.pod.name}#{run.attempt}] {line}\n")

    def delete_pod(self, name: str) -> float:
        """What the kubelet does when a pod is deleted: SIGTERM, the grace period, SIGKILL. Returns seconds to exit."""
        run = self.running[name]
        sent = time.monotonic()
        os.kill(run.proc.pid, signal.SIGTERM)
        grace = run.pod.spec["terminationGracePeriodSeconds"]
        while pid_alive(run.proc.pid) and time.monotonic() - sent < grace:
            time.sleep(0.05)
        if pid_alive(run.proc.pid):
            os.kill(run.proc.pid, signal.SIGKILL)
        return time.monotonic() - sent

    def run(self, *, timeout: float, on_line: Optional[Callable[["JobController"], None]] = None) -> str:
        """Starts every pod and follows them to "Complete" or "Failed" (or raises on the timeout)."""
        for pod in self.pods:
            self.start(pod, 0)
        done, deadline = set(), time.monotonic() + timeout
        while len(done) < len(self.pods):
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"job not done in {timeout} s; see {self.log}")
            if on_line is not None:
                on_line(self)
            for name, run in list(self.running.items()):
                code = run.proc.poll()
                if code is None or name in done or any(e[:2] == (name, run.attempt) for e in self.exits):
                    continue
                container = run.pod.spec["containers"][0]["name"]
                action = "Complete" if code == 0 else failure_action(run.pod.failure_policy, container, code)
                self.exits.append((name, run.attempt, code, action))
                if code == 0:
                    done.add(name)
                elif action == "Ignore":
                    self.start(run.pod, run.attempt + 1)
                elif action == "FailJob" or self.failures >= run.pod.backoff_limit:
                    self.stop()
                    return "Failed"
                else:
                    self.failures += 1
                    self.start(run.pod, run.attempt + 1)
            time.sleep(0.05)
        return "Complete"

    def stop(self) -> None:
        for run in self.running.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(timeout=10)
