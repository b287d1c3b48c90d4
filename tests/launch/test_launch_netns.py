"""Issue 9 R4: local clusters listen on 127.0.0.1 only.

TensorFlow 2.21's servers bind 0.0.0.0/[::] whatever address they are given (tests/reliability records it), so
tfaccel runs a local cluster in a private network namespace whose only interface is lo. These tests look at a
real cluster (chief + worker + ps, real TF gRPC servers under `tfaccel launch`) from the host's side: with the
private network nothing of it listens or answers there; with `--network host` (what tfaccel did before) its
ports listen on 0.0.0.0 of the host, which is what the isolation removes.
"""

import importlib.util
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import harness
from launch_util import SCRIPTS, Launcher, wait_gone
from tfaccel.errors import ConfigError
from tfaccel.launch import netns
from tfaccel.launch.procs import port_open

_spec = importlib.util.spec_from_file_location("net_probe", SCRIPTS / "net_probe.py")
net_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(net_probe)

needs_netns = pytest.mark.skipif(not netns.isolation_available()[0],
                                 reason=f"no network namespaces here: {netns.isolation_available()[1]}")


def host_ipv4_addresses():
    """This machine's own IPv4 addresses outside 127.0.0.0/8 (from the kernel's local routing table)."""
    found, last = set(), None
    for line in Path("/proc/net/fib_trie").read_text().splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "|--":
            last = words[1]
        elif "/32 host LOCAL" in line and last and not ipaddress.ip_address(last).is_loopback:
            found.add(last)
    return sorted(found)


def run_probe_cluster(tmp_path, *extra):
    """Starts chief + worker + ps under `tfaccel launch`; returns (launcher, report, done_file)."""
    done = tmp_path / "done"
    launcher = Launcher("--ps", "1", "--workers", "1", "--timeout", "240", "--grace", "3", *extra, "--",
                        sys.executable, str(SCRIPTS / "net_probe.py"), str(done))
    match = launcher.wait_for(r"NETPROBE (.*)$", timeout=180)
    return launcher, json.loads(match.group(1)), done


def finish(launcher, done):
    done.write_text("ok")
    rc = launcher.wait(timeout=60)
    assert rc == 0, launcher.stderr[-3000:]
    assert wait_gone(launcher.all_pids()) == []


@pytest.mark.slow
@needs_netns
def test_local_cluster_cannot_be_reached_from_the_host(tmp_path):
    launcher, report, done = run_probe_cluster(tmp_path)
    with launcher:
        server_ports = {report["ports"]["ps:0"], report["ports"]["worker:0"]}
        # Inside: a namespace of its own whose only interface is lo, where TF's servers bind the wildcard address.
        assert report["netns"] != os.readlink("/proc/self/ns/net")
        assert report["interfaces"] == ["lo"]
        inside = {port for _, port in report["listening"]}
        assert server_ports <= inside, report
        assert "private network namespace" in launcher.stderr
        # Outside (this process is on the host's network): nothing of the cluster listens or answers.
        host_listening = {port for _, port in net_probe.listening()}
        assert not (server_ports & host_listening), (server_ports, sorted(host_listening))
        for port in server_ports:
            for address in ["127.0.0.1"] + host_ipv4_addresses():
                assert not port_open(address, port, timeout=1.0), f"{address}:{port} answered from the host"
        # Every task of the job lives in that namespace.
        for name, pids in launcher.task_pids.items():
            for pid in pids:
                assert os.readlink(f"/proc/{pid}/ns/net") == report["netns"], name
        finish(launcher, done)


@pytest.mark.slow
def test_host_network_exposes_the_cluster_on_every_interface(tmp_path):
    """What --network host (tfaccel's behaviour before the private network) does: the control for the test above."""
    launcher, report, done = run_probe_cluster(tmp_path, "--network", "host")
    with launcher:
        assert report["netns"] == os.readlink("/proc/self/ns/net")
        server_ports = {report["ports"]["ps:0"], report["ports"]["worker:0"]}
        wildcard = {port for address, port in net_probe.listening() if address in ("0.0.0.0", "::")}
        assert server_ports <= wildcard, (server_ports, net_probe.listening())
        addresses = host_ipv4_addresses()
        if addresses:  # reachable through an address that is not loopback
            assert port_open(addresses[0], report["ports"]["ps:0"], timeout=2.0)
        finish(launcher, done)


@needs_netns
def test_private_network_api_probe_and_join(tmp_path):
    """PrivateNetwork: a task started in it can listen there, the launcher's probe sees it, the host does not."""
    from tfaccel.launch.procs import free_ports, start_process, terminate

    port = free_ports(1)[0]
    code = ("import socket, sys, time\n"
            "s = socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen()\n"
            "print('listening', flush=True); time.sleep(30)\n")
    with netns.PrivateNetwork.create() as net:
        proc = start_process([sys.executable, "-c", code, str(port)], netns=net, die_with_parent=True)
        harness.STARTED_PIDS.append(proc.pid)
        try:
            assert proc.stdout.readline().strip() == b"listening"
            assert net.port_open("127.0.0.1", port)
            assert not port_open("127.0.0.1", port)
            assert os.readlink(f"/proc/{proc.pid}/ns/net") == f"net:[{net.inode}]"
        finally:
            terminate([proc], grace=2)
        holder = net.holder
    assert holder.poll() is not None  # closing the network ends its helper process


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root (to become an unprivileged user with setpriv) and /usr/bin/python3")
def test_private_network_works_for_an_unprivileged_user():
    """Without root the namespace is made inside a user namespace that maps only the caller's uid (like unshare -rn,
    without the root mapping); its tasks keep their uid. Run as nobody with the system Python (the venv may not be
    readable by nobody), from a copy of tfaccel in a directory nobody can read (pytest's tmp_path is root-only)."""
    top = Path(tempfile.mkdtemp(prefix="tfaccel-netns-"))
    try:
        shutil.copytree(harness.REPO_ROOT / "tfaccel", top / "tfaccel", ignore=shutil.ignore_patterns("__pycache__"))
        for root, dirs, files in os.walk(top):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        script = (
            "import os, sys, time\n"
            "from tfaccel.launch import netns\n"
            "from tfaccel.launch.procs import start_process, port_open, free_ports\n"
            "try:\n"
            "    net = netns.PrivateNetwork.create()\n"
            "except netns.NetworkIsolationError as exc:\n"
            "    print('UNAVAILABLE', exc); sys.exit(0)\n"
            "port = free_ports(1)[0]\n"
            "code = ('import os, socket, sys, time; s = socket.socket(); s.bind((\"0.0.0.0\", int(sys.argv[1]))); '\n"
            "        's.listen(); print(os.getuid(), flush=True); time.sleep(20)')\n"
            "p = start_process([sys.executable, '-c', code, str(port)], netns=net, die_with_parent=True)\n"
            "uid = p.stdout.readline().decode().strip()\n"
            "print('RESULT', net.kind, uid, net.port_open('127.0.0.1', port), port_open('127.0.0.1', port), flush=True)\n"
            "p.kill(); p.wait(); net.close()\n")
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(top), "HOME": str(top)}
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                              "-c", script], env=env, cwd=str(top), capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    if "UNAVAILABLE" in out.stdout:
        pytest.fail(f"root can make network namespaces here but nobody cannot: {out.stdout}")
    assert "RESULT user 65534 True False" in out.stdout, (out.stdout, out.stderr)


# ------------------------------------------------------------------------------------ choices and bad input
def test_network_mode_is_validated():
    with pytest.raises(ConfigError, match=r"network: must be one of auto, private, host; received 'loopback'"):
        netns.check_network_mode("loopback")


def test_run_local_rejects_a_bad_network_before_starting_anything():
    from tfaccel.launch import run_local

    with pytest.raises(ConfigError, match="received 'none'"):
        run_local([sys.executable, "-c", "pass"], network="none")


def test_auto_falls_back_to_the_host_network_with_a_warning(monkeypatch, caplog):
    def refuse(cls, **kwargs):
        raise netns.NetworkIsolationError("unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted")

    monkeypatch.setattr(netns.PrivateNetwork, "create", classmethod(refuse))
    log = _ListLog()
    assert netns.open_network("auto", log=log) is None
    assert "cannot be made here (unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted)" in log.lines[0]
    assert "firewall them" in log.lines[0]
    with pytest.raises(netns.NetworkIsolationError, match=r"network='private'.*Operation not permitted.*"
                                                          r"--network host"):
        netns.open_network("private", log=log)
    assert netns.open_network("host", log=log) is None


class _ListLog:
    def __init__(self):
        self.lines = []

    def warning(self, fmt, *args):
        self.lines.append(fmt % args)

    info = warning


def test_private_network_refuses_a_cluster_with_non_loopback_addresses(tmp_path):
    from tfaccel.launch.tasks import local_specs, network_for

    addresses = host_ipv4_addresses()
    if not addresses:
        pytest.skip("this machine has no address outside loopback")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"worker:\n  - {addresses[0]}:2222\n  - 127.0.0.1:2223\n")
    make_spec, _ = local_specs(cluster=str(cluster))
    with pytest.raises(ConfigError, match=rf"network='private'.*worker:0 \({addresses[0]}:2222\).*--network host"):
        network_for(make_spec(0), "private", "cluster")
    assert network_for(make_spec(0), "auto", "cluster") == "host"
    loopback = tmp_path / "loopback.yaml"
    loopback.write_text("worker:\n  - 127.0.0.1:2222\n  - localhost:2223\n")
    make_spec, _ = local_specs(cluster=str(loopback))
    assert network_for(make_spec(0), "private", "cluster") == "private"


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = str(harness.REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "tfaccel", "launch", *args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=str(harness.REPO_ROOT))


def test_cli_network_option_errors_and_dry_run(tmp_path):
    out = _cli("--network", "private", "--cluster", str(harness.REPO_ROOT / "tf_config" / "two_workers.yaml"),
               "--task", "worker:0", "--", "python", "train.py")
    assert out.returncode == 2
    assert "--network: only for local clusters" in out.stderr and "Traceback" not in out.stderr
    out = _cli("--network", "sideways", "--", "python", "x.py")
    assert out.returncode == 2 and "invalid choice: 'sideways'" in out.stderr
    out = _cli("--dry-run", "--workers", "2", "--network", "private", "--", sys.executable, "-c", "pass")
    assert out.returncode == 0, out.stderr
    assert '"network": "private"' in out.stdout
    out = _cli("--dry-run", "--workers", "2", "--", sys.executable, "-c", "pass")
    assert '"network": "auto"' in out.stdout and "--network auto" in out.stderr


@needs_netns
def test_private_network_command_failure_hints_at_host_network(tmp_path):
    """A command that needs another machine fails inside the private network; the launcher says what to do."""
    out = _cli("--workers", "1", "--network", "private", "--timeout", "60", "--", sys.executable, "-c",
               "import socket; socket.create_connection(('192.0.2.1', 9), timeout=3)")
    assert out.returncode != 0
    assert "--network host" in out.stderr and "Traceback" in out.stderr  # the task's own traceback, prefixed
    assert "[worker 0]" in out.stderr


def test_env_report_says_whether_local_clusters_are_private():
    from tfaccel.report import _local_network

    ok, detail = netns.isolation_available()
    info = _local_network()
    assert info["private"] is ok
    assert ("private loopback-only network namespace" in info["detail"]) if ok else (detail in info["detail"])


@pytest.mark.slow
@needs_netns
def test_horovod_ranks_on_localhost_run_in_the_private_network():
    """horovodrun's rendezvous server and Gloo listen on every interface too: local ranks get the same namespace."""
    code = ("import os, horovod.tensorflow as hvd, tensorflow as tf\n"
            "hvd.init()\n"
            "total = float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum))\n"
            "print('RANKNET', hvd.rank(), os.readlink('/proc/self/ns/net'), total, flush=True)\n")
    out = _cli("--backend", "horovod", "-np", "2", "--timeout", "240", "--", sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = {}
    for line in out.stdout.splitlines():
        if "RANKNET" in line:
            rank, ns, total = line.split("RANKNET", 1)[1].split()
            seen[int(rank)] = (ns, float(total))
    assert sorted(seen) == [0, 1], out.stdout[-3000:]
    assert seen[0] == seen[1] and seen[0][1] == 3.0  # one namespace, and Gloo's all-reduce works inside it
    assert seen[0][0] != os.readlink("/proc/self/ns/net")
    assert "private network namespace" in out.stderr


def test_horovod_private_network_needs_local_hosts(monkeypatch):
    from tfaccel.launch import horovod

    monkeypatch.setattr(horovod, "find_horovodrun", lambda: "/bin/false")
    with pytest.raises(ConfigError, match=r"network='private'.*'node1:2,node2:2'.*--network host"):
        horovod.run_horovod(2, ["python", "train.py"], hosts="node1:2,node2:2", network="private",
                            horovodrun="/bin/false")
    with pytest.raises(ConfigError, match="received 'lan'"):
        horovod.run_horovod(2, ["python", "train.py"], network="lan", horovodrun="/bin/false")
    out = _cli("--dry-run", "--backend", "horovod", "-np", "2", "--network", "host", "--", sys.executable, "-c", "1")
    assert out.returncode == 0 and '"network": "host"' in out.stdout, out.stderr
