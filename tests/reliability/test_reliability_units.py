"""Issue 9 promises that need no cluster: timeout defaults and messages (R2), saves that fail midway leave
the previous backup / checkpoint intact (R3), security basics (R4)."""

import ast
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import harness
import rel_scenarios as rs
from tfaccel.errors import ConfigError, DeviceError
from tfaccel.resilience import backup_agreement as agree
from tfaccel.resilience.backups import BackupState
from tfaccel.strategies import peer_health as ph

REPO = Path(__file__).resolve().parent.parent.parent


# ----------------------------------------------------------------------------------------------- R2 defaults
def test_default_timeouts_are_bounded_and_stated():
    t = ph.resolve_timeouts(environ={})
    assert (t.startup, t.heartbeat, t.collective) == (60.0, 20.0, 0.0)
    assert t.sources == ("default", "default", "default")
    assert t.notes() == ("peer timeouts: start-up 60 s, lost-peer heartbeat 20 s, per-collective off (a peer that "
                         "never starts or dies fails every surviving worker with its name instead of a hang)",)
    given = ph.resolve_timeouts(timeout_seconds=30, environ={})  # what a per-collective timeout costs, said
    assert given.note().endswith("per-collective 30 s (given) (a peer that never starts or dies fails every surviving "
                                 "worker with its name instead of a hang; each collective holds a thread for the "
                                 "per-collective timeout on TensorFlow 2.21, about collectives per second x 30 "
                                 "threads)")


def test_timeouts_precedence_argument_over_environment_over_default():
    env = {"TFACCEL_STARTUP_TIMEOUT": "20", "TFACCEL_HEARTBEAT_TIMEOUT": "5", "TFACCEL_COLLECTIVE_TIMEOUT": "0"}
    t = ph.resolve_timeouts(startup_timeout_seconds=7, environ=env)
    assert (t.startup, t.heartbeat, t.collective) == (7.0, 5.0, 0.0)
    assert t.sources == ("given", "$TFACCEL_HEARTBEAT_TIMEOUT", "$TFACCEL_COLLECTIVE_TIMEOUT")
    assert "start-up 7 s (given)" in t.note() and "per-collective off ($TFACCEL_COLLECTIVE_TIMEOUT)" in t.note()


@pytest.mark.parametrize("kwargs, env, message", [
    ({"startup_timeout_seconds": -1}, {}, "multi_worker: startup_timeout_seconds must be a number of seconds >= 0 "
                                          "(0 disables it); received -1 from strategy option startup_timeout_seconds"),
    ({"heartbeat_timeout_seconds": True}, {}, "heartbeat_timeout_seconds must be a number of seconds >= 0"),
    ({}, {"TFACCEL_STARTUP_TIMEOUT": "soon"}, "received None from $TFACCEL_STARTUP_TIMEOUT"),
])
def test_bad_timeouts_are_config_errors_naming_the_source(kwargs, env, message):
    with pytest.raises(ConfigError) as info:
        ph.resolve_timeouts(environ=env, **kwargs)
    assert message in str(info.value)


def test_multi_worker_rejects_bad_startup_timeout_before_building(clean_tf_config):
    from tfaccel.strategies import get_backend

    with pytest.raises(ConfigError, match="startup_timeout_seconds must be a number of seconds >= 0"):
        get_backend("multi_worker", startup_timeout_seconds=-5)


def test_lost_task_names_from_tensorflow_messages():
    text = ("Collective ops is aborted by: ... remote target /job:worker/replica:0/task:1 while calling RecvBuf ... "
            "The following tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\n"
            "/job:chief/replica:0/task:0")
    assert ph.lost_task_names(text) == ["worker:1", "chief:0"]
    assert ph.lost_task_names("Deadline Exceeded") == []


def test_startup_error_names_silent_peers_by_probing_their_ports():
    """A non-leader only hears "Deadline Exceeded" from TF; tfaccel names the peers whose port is closed."""
    from tfaccel.cluster import ClusterSpec, TaskInfo
    from tfaccel.launch.procs import free_ports

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = listening.getsockname()[1]
        down = free_ports(1)[0]
        spec = ClusterSpec.from_dict({"worker": [f"127.0.0.1:{free_ports(1)[0]}", f"127.0.0.1:{up}"],
                                      "chief": [f"127.0.0.1:{down}"]})
        task = TaskInfo(spec=spec, task_type="worker", task_index=0, environment=None, source="TF_CONFIG")
        err = ph.startup_error(RuntimeError("Deadline Exceeded"), task=task, timeouts=ph.resolve_timeouts(environ={}))
    assert isinstance(err, DeviceError)
    text = str(err)
    assert f"worker:0 waited for: chief:0 (127.0.0.1:{down})" in text and "worker:1" not in text
    assert "start-up timeout of 60 s" in text and "TFACCEL_STARTUP_TIMEOUT" in text
    assert "TensorFlow said: RuntimeError: Deadline Exceeded" in text


# ---------------------------------------------------------------------------------------- R3 atomic saves
def _model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), verbose=0)
    return model


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_backup_that_fails_midway_leaves_the_previous_backup_intact(tmp_path, monkeypatch, asynchronous):
    from tfaccel.resilience import backup_writer, backups
    from tfaccel.resilience.backup_writer import BackupWriter

    model = _model()
    cb = backups.StepBackup(str(tmp_path), save_freq=5, is_chief=True, steps_per_epoch=20,
                            writer=BackupWriter(asynchronous=asynchronous))
    cb.set_model(model)
    cb.on_epoch_begin(0)
    cb.on_train_batch_end(4)  # step 5: a complete backup
    cb.writer.wait()
    good = [w.copy() for w in model.get_weights()]
    assert backups.read_backup(str(tmp_path)).step == 5

    def crash_midway(path, overwrite=True):
        Path(path).write_bytes(b"\x89HDF\r\n half a file")  # the process dies while writing
        raise OSError("disk full")

    if asynchronous:  # the background thread writes from the snapshot
        monkeypatch.setattr(backup_writer, "write_weights", lambda snapshot, path: crash_midway(path))
    else:
        monkeypatch.setattr(model, "save_weights", crash_midway)
    for w in model.weights:
        w.assign(w + 1.0)
    with pytest.raises(OSError, match="disk full"):
        cb.on_train_batch_end(9)  # step 10: the step loop sees the error (sync), or the end of training (async)
        cb.on_train_end()
    monkeypatch.undo()
    state = backups.read_backup(str(tmp_path))
    assert (state.epoch, state.step) == (0, 5)
    assert sorted(os.listdir(tmp_path)) == ["backup-5.weights.h5", "tfaccel_backup.json"]  # no half file left
    model.load_weights(state["weights_path"])
    for restored, expected in zip(model.get_weights(), good):
        np.testing.assert_array_equal(restored, expected)


def test_checkpoint_that_fails_midway_keeps_the_previous_one_as_latest(tmp_path, monkeypatch):
    import tensorflow as tf
    from tensorflow.python.checkpoint import checkpoint_management

    from tfaccel.resilience.backups import ChiefCheckpoint

    model = _model()
    cb = ChiefCheckpoint(str(tmp_path), is_chief=True, every_worker_saves=False)
    cb.set_model(model)
    cb.on_epoch_end(0)
    good = [w.copy() for w in model.get_weights()]
    first = tf.train.latest_checkpoint(str(tmp_path))
    assert first.endswith("ckpt-1")

    def crash(*args, **kwargs):
        raise OSError("killed while recording the checkpoint state")

    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", crash)
    for w in model.weights:
        w.assign(w + 1.0)
    with pytest.raises(OSError, match="killed while recording"):
        cb.on_epoch_end(1)
    monkeypatch.undo()
    assert tf.train.latest_checkpoint(str(tmp_path)) == first  # the pointer moves only after a complete write
    tf.train.Checkpoint(model=model).read(first).expect_partial()
    for restored, expected in zip(model.get_weights(), good):
        np.testing.assert_array_equal(restored, expected)


def test_atomic_write_text_never_leaves_a_mix(tmp_path, monkeypatch):
    from tfaccel.resilience.atomic_io import atomic_write_text

    target = tmp_path / "state.json"
    atomic_write_text(str(target), json.dumps({"step": 5}))

    def crash(*args, **kwargs):
        raise OSError("crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        atomic_write_text(str(target), json.dumps({"step": 10}))
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"step": 5}
    assert os.listdir(tmp_path) == ["state.json"]  # the temporary file was removed


def test_the_progress_and_restart_records_use_the_one_atomic_writer_whose_swaps_remove_backup_knows(tmp_path,
                                                                                                   monkeypatch):
    from tfaccel.resilience import restarts as rst
    from tfaccel.resilience.atomic_io import swap_prefix
    from tfaccel.resilience.backups import remove_backup

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    progress = rst.Progress(str(tmp_path), is_chief=True, steps_per_epoch=10)
    progress.note(0, 3, force=True)
    assert synced and json.loads((tmp_path / rst.PROGRESS_FILE).read_text())["global_step"] == 3  # fsynced

    def crash(*args, **kwargs):
        raise OSError("crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        progress.note(0, 5, force=True)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [rst.PROGRESS_FILE]  # the temporary file was removed, the old content kept
    # What a SIGKILL inside each record's swap leaves behind is tfaccel's, removed with the backup.
    for name in (rst.PROGRESS_FILE, rst.RECORD_FILE, "tfaccel_backup.json"):
        (tmp_path / f"{swap_prefix(name)}k1ll3d").write_text("{")
    (tmp_path / "notes.txt").write_text("the user's")
    remove_backup(str(tmp_path))
    assert os.listdir(tmp_path) == ["notes.txt"]


# --------------------------------------------------------------------------------------------- R4 security
def test_local_clusters_use_loopback_addresses_only():
    from tfaccel.launch.command import child_base_env
    from tfaccel.launch.tasks import build_tasks, local_cluster

    spec = local_cluster(workers=2, ps=1, chief=True, evaluator=True)
    for task in build_tasks(spec, lambda name: ("python", "x.py"), env=child_base_env()):
        cluster = json.loads(task.tf_config)["cluster"]
        hosts = {addr.rpartition(":")[0] for addrs in cluster.values() for addr in addrs}
        assert hosts == {"127.0.0.1"}, cluster


@pytest.mark.slow
def test_tf_server_listens_on_every_interface_upstream(tmp_path):
    """Known upstream limitation (TF 2.21): tf.distribute servers bind 0.0.0.0/[::] whatever address the cluster
    names (grpc_server_lib.cc adds "0.0.0.0:<port>"). That is why tfaccel launch runs local clusters in a private
    loopback-only network namespace (tfaccel/launch/netns.py; proven in tests/launch/test_launch_netns.py). This
    test fails when TF starts honouring the address: the namespace could then become optional."""
    from tfaccel.launch.procs import free_ports, start_process, terminate

    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"], "ps": [f"127.0.0.1:{ports[2]}"]}
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(harness.CHILD_ENV, PYTHONPATH=str(REPO),
               TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}}))
    proc = start_process([sys.executable, "-m", "tfaccel.launch.server"], env=env, cwd=str(tmp_path))
    harness.STARTED_PIDS.append(proc.pid)
    bound = None
    try:
        deadline = time.monotonic() + 90
        while bound is None and time.monotonic() < deadline and proc.poll() is None:
            for table in ("/proc/net/tcp6", "/proc/net/tcp"):
                for line in Path(table).read_text().splitlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == ports[2]:  # 0A: LISTEN
                        bound = local.rsplit(":", 1)[0]
            time.sleep(0.3)
    finally:
        terminate([proc], grace=2)
    assert bound is not None, "the ps server never listened"
    assert set(bound) == {"0"}, f"TF now binds {bound}: update README 'Reliability' (R4) and this test"


def test_cluster_yaml_is_loaded_safely(tmp_path):
    from tfaccel.cluster import ClusterSpec

    marker = tmp_path / "pwned"
    bad = tmp_path / "cluster.yaml"
    bad.write_text(f"worker: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError) as info:
        ClusterSpec.from_file(bad)
    assert str(bad) in str(info.value)
    assert not marker.exists()


def test_launcher_never_goes_through_a_shell(tmp_path):
    """A command string is split into argv and run directly: shell syntax stays literal text."""
    from tfaccel.launch import run_local

    marker = tmp_path / "pwned"
    result = run_local(f"{sys.executable} -c 'import sys; print(sys.argv[1:])' ; touch {marker}", workers=1,
                       timeout=60, echo=False, env={"PYTHONPATH": str(REPO)})
    harness.STARTED_PIDS.extend(result.pids)
    assert result.returncode == 0, result.tasks[0].stderr
    assert f"[';', 'touch', '{marker}']" in result.tasks[0].stdout
    assert not marker.exists()


def test_no_shell_anywhere_in_the_library():
    """No shell=True, os.system, os.popen or subprocess.getoutput in tfaccel/."""
    offenders = []
    for path in sorted((REPO / "tfaccel").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "shell" and not (
                    isinstance(node.value, ast.Constant) and node.value.value is False):
                offenders.append(f"{path}:{node.value.lineno} shell=")
            if isinstance(node, ast.Attribute) and node.attr in ("system", "popen", "getoutput", "getstatusoutput") \
                    and isinstance(node.value, ast.Name) and node.value.id in ("os", "subprocess", "commands"):
                offenders.append(f"{path}:{node.lineno} {node.value.id}.{node.attr}")
    assert offenders == []


# ------------------------------------------------------------------------------- what a killed job resumes from
def test_a_killed_job_may_resume_from_the_backup_before_one_still_being_written():
    """Backups are written in the background: killed 3 steps after a backup, the job may resume from it or, had it
    still been in flight, from the one before (CI saw (2, 5) after a kill at (2, 13)); a chief killed at a backup
    step never wrote it."""
    assert rs.BACKUP_FREQ == 5
    assert rs.expected_resume(2, 13, victim_is_chief=True) == [(2, 5), (2, 10)]
    assert rs.expected_resume(2, 10, victim_is_chief=True) == [(2, 5)]
    assert rs.expected_resume(2, 10, victim_is_chief=False) == [(2, 5), (2, 10)]
    assert rs.expected_resume(1, 7, victim_is_chief=False) == [(1, 0), (1, 5)]  # (1, 0): the epoch end's
    assert rs.expected_resume(1, 3, victim_is_chief=False) == [(1, 0)]
    assert rs.expected_resume(0, 3, victim_is_chief=True) == [None]  # nothing written yet: a fresh start


# ------------------------------------------------------------------------- multi_worker: the chief's backup for all
class _Workers:
    """The sums two workers' ``agree_with_chief`` calls see, worker by worker (each call is one collective): the
    test drives both workers' reads, then replays each worker's side against the other's."""

    def __init__(self, reads):
        self.reads = reads  # worker index -> [first read, read again]

    def run(self):
        first = {w: agree.backup_position(reads[0]) for w, reads in self.reads.items()}
        chief = first[0]
        final = {w: first[w] if first[w] == chief else agree.backup_position(self.reads[w][1]) for w in first}
        differ = sum(final[w] != chief for w in final)
        results = {}
        for w, reads in self.reads.items():
            replies = iter([chief, [differ, 0, 0, 0, 0]])
            calls = iter(reads[1:])
            try:
                results[w] = agree.agree_with_chief(reads[0], lambda: next(calls), total=lambda _v: next(replies),
                                                    is_chief=w == 0, workers=len(self.reads))
            except ConfigError as exc:
                results[w] = exc
        return results


def _backup(epoch, step, **extra):
    return BackupState(epoch=epoch, step=step, global_step=epoch * 23 + step, weights="w", weights_path="p", **extra)


def test_multi_worker_agreement_sums_the_chiefs_position_and_counts_who_differs():
    """The real sums over two workers, as a fake ``total`` records them: the chief's position, then the count."""
    sent = []

    def total(values):
        sent.append(list(values))
        return [float(v) for v in ([1, 2, 5, 51, 0] if len(sent) == 1 else [0, 0, 0, 0, 0])]

    state = _backup(2, 5)
    assert agree.agree_with_chief(state, None, total=total, is_chief=False, workers=2) is state
    assert sent == [[0.0] * 5, [0.0] * 5]  # a worker adds nothing to the chief's position, and agrees


def test_multi_worker_workers_that_read_the_chiefs_backup_resume_from_it():
    state = _backup(1, 5)
    results = _Workers({0: [state], 1: [_backup(1, 5)]}).run()
    assert results[0] is state and results[1]["step"] == 5


def test_multi_worker_a_worker_that_read_before_the_chiefs_last_backup_reads_it_again():
    """A refit after an error: worker 1 read the pointer before the chief moved it to (1, 10)."""
    newer = _backup(1, 10)
    results = _Workers({0: [_backup(1, 10)], 1: [_backup(1, 5), newer]}).run()
    assert results[1] is newer and results[0]["step"] == 10


def test_multi_worker_a_worker_without_the_chiefs_backup_stops_every_worker_with_why():
    """No shared backup_dir: worker 1's directory is empty (today's training would go on with two models)."""
    results = _Workers({0: [_backup(1, 5)], 1: [None, None]}).run()
    assert all(isinstance(r, ConfigError) for r in results.values()), results
    assert "the chief resumes from the backup at epoch 1, step 5, and 1 of 2 workers read another backup or none " \
           "(this worker: no backup)" in str(results[1])
    assert "(this worker: the backup at epoch 1, step 5)" in str(results[0])
    assert "backup_dir must be one directory that every worker reads" in str(results[0])

