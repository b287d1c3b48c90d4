"""Parameter-server jobs back up from the coordinator and resume from the last backup.

Real clusters on 127.0.0.1 (chief + 2 workers + 1 ps, each its own process, ports from the OS). Asynchronous PS
training is not bit-reproducible, so the tests assert step counts and that the restored state equals the saved
one, not final weights equal to an uninterrupted run.
"""

import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import harness
import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.launch.procs import start_process, terminate
from tfaccel.resilience.restarts import PROGRESS_FILE, RECORD_FILE

JOB = harness.REPO_ROOT / "tests" / "training" / "scripts" / "ps_backup_job.py"
STEPS_PER_EPOCH = -(-1437 // 64)  # digits train split, global batch 64: 22 whole batches + a partial one, as fit
EPOCHS = 4
BACKUP_FREQ = 5
LOST_PS_LIMIT_S = 60.0


class _Task:
    """One task process of a hand-built cluster: output lines kept, bounded waits, ended by PID."""

    def __init__(self, name, cluster, env):
        role, index = name.split(":")
        child = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("PSB_")}
        child.update(harness.CHILD_ENV)
        child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO_ROOT), os.environ.get("PYTHONPATH")]))
        child.update({k: str(v) for k, v in env.items()})
        child["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": role, "index": int(index)}})
        self.name = name
        self.proc = start_process([sys.executable, str(JOB)], env=child, cwd=str(harness.REPO_ROOT))
        harness.STARTED_PIDS.append(self.proc.pid)
        self.lines = []
        self._threads = [threading.Thread(target=self._read, args=(s,), daemon=True)
                         for s in (self.proc.stdout, self.proc.stderr)]
        for thread in self._threads:
            thread.start()

    def _read(self, stream):
        for raw in iter(stream.readline, b""):
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
        stream.close()

    @property
    def text(self):
        return "\n".join(list(self.lines))

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if re.search(pattern, self.text):
                return True
            time.sleep(0.05)
        return bool(re.search(pattern, self.text))

    def wait(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        except Exception:
            terminate([self.proc], grace=2)
        for thread in self._threads:
            thread.join(timeout=5)
        return self.proc.returncode

    def report(self):
        return harness.last_json_line(self.text)


def _servers(cluster):
    return {name: _Task(name, cluster, {}) for name in ("ps:0", "worker:0", "worker:1")}


def _end(tasks):
    terminate([t.proc for t in tasks], grace=2)
    for task in tasks:
        task.wait(10)


def _restore_into_fresh_objects(ckpt_dir):
    """The backup's values, read back through a fresh model + optimizer of the job's shape (assert_consumed)."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    opt = keras.optimizers.Adam(0.003)
    opt.build(model.trainable_variables)
    steps = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, optimizer=opt, steps=steps).read(str(Path(ckpt_dir) / "ckpt")).assert_consumed()
    return model.get_weights(), [np.asarray(v.numpy()) for v in opt.variables], int(steps.numpy())


@pytest.mark.slow
def test_killed_chief_restarts_and_resumes_from_the_last_backup(tmp_path):
    """The chief (coordinator) is SIGKILLed mid-epoch 3 of 4, right after its step-5 backup; a new chief against the
    same ps and workers resumes at the backed-up (epoch, step), restores exactly the saved variables and counts
    the whole schedule."""
    cluster = harness.loopback_cluster(2, ps=1, chief=True)
    backup = tmp_path / "backup"
    servers = _servers(cluster)
    tasks = list(servers.values())
    try:
        job = {"PSB_EPOCHS": EPOCHS, "PSB_BACKUP_DIR": backup, "PSB_BACKUP_FREQ": BACKUP_FREQ,
               "PSB_STEP_SLEEP": "0.2"}
        first = _Task("chief:0", cluster, job)
        tasks.append(first)
        reached = first.wait_for(rf"PSB: backup written epoch=2 step={BACKUP_FREQ}\b", timeout=240)
        assert reached, f"the chief never backed up step {BACKUP_FREQ} of epoch 2:\n{first.text[-3000:]}"
        first.proc.send_signal(signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL, f"the chief was not killed mid-run:\n{first.text[-3000:]}"

        state = json.loads((backup / "tfaccel_backup.json").read_text())
        epoch, step = state["epoch"], state["step"]
        assert state["format"] == "tf.train.Checkpoint" and state["steps_per_epoch"] == STEPS_PER_EPOCH
        assert (epoch, step) >= (2, BACKUP_FREQ) and step % BACKUP_FREQ == 0 and step < STEPS_PER_EPOCH, state
        saved_at = epoch * STEPS_PER_EPOCH + step
        assert state["global_step"] == saved_at
        # The pointer names one complete checkpoint directory; the previous ones were removed (beside it: the
        # pointer, and the chief's progress and restarts records).
        bookkeeping = {"tfaccel_backup.json", PROGRESS_FILE, RECORD_FILE}
        assert sorted(p.name for p in backup.iterdir() if p.name not in bookkeeping) == [state["weights"]]
        snapshot = tmp_path / "snapshot"
        shutil.copytree(backup / state["weights"], snapshot)

        second = _Task("chief:0", cluster, {**job, "PSB_STEP_SLEEP": "0",
                                            "PSB_RESTORED_OUT": tmp_path / "restored.npz"})
        tasks.append(second)
        assert second.wait(300) == 0, f"the restarted chief failed:\n{second.text[-3000:]}"
    finally:
        _end(tasks)

    report = second.report()
    total = EPOCHS * STEPS_PER_EPOCH
    print(f"measured: killed after the (2, {BACKUP_FREQ}) backup; resumed_from={report['resumed_from']}; "
          f"details={report['details']}; steps this run={report['steps']} of {total}")
    assert report["resumed_from"] == [epoch, step]
    assert report["details"]["optimizer_iterations"] == total  # the schedule, exactly, over both runs
    assert report["details"]["steps_counted"] == total
    assert report["steps"] == total - saved_at  # this run ran only the rest
    resumed = report["details"]["resumed"]
    assert (resumed["epoch"], resumed["step"], resumed["global_step"]) == (epoch, step, saved_at)
    assert resumed["optimizer_iterations"] == resumed["steps_counted"] == saved_at
    assert resumed["backup"].endswith(state["weights"])
    assert len(report["loss"]) == EPOCHS - epoch  # one value per epoch run here (the first may be partial)
    assert f"resumed from the backup at epoch {epoch}, step {step}" in second.text
    assert not backup.exists()  # training completed: the backup is removed

    # What the new chief restored (read back from the ps tasks right after the restore) is what was saved.
    weights, opt_vars, steps = _restore_into_fresh_objects(snapshot)
    restored = np.load(tmp_path / "restored.npz")
    assert int(restored["steps"]) == steps == saved_at
    for i, expected in enumerate(weights):
        np.testing.assert_array_equal(restored[f"model_{i}"], expected)
    for i, expected in enumerate(opt_vars):
        np.testing.assert_array_equal(restored[f"opt_{i}"], expected)
    assert int(opt_vars[0]) == saved_at  # Adam's iterations counter, first of its variables


@pytest.mark.slow
def test_launcher_restarts_a_ps_job_whose_chief_died_and_it_resumes(tmp_path):
    """`tfaccel launch --ps 1 --workers 2 --max-restarts 1`: the chief SIGKILLed mid-epoch 3 makes the launcher
    restart the whole job on a new cluster (fresh ports, new ps), whose chief resumes from the backup."""
    backup = tmp_path / "backup"
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("PSB_")}
    env.update(harness.CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update({"PSB_EPOCHS": str(EPOCHS), "PSB_BACKUP_DIR": str(backup), "PSB_BACKUP_FREQ": str(BACKUP_FREQ),
                "PSB_STEP_SLEEP": "0.2"})
    launcher = start_process([sys.executable, "-m", "tfaccel", "launch", "--ps", "1", "--workers", "2",
                              "--max-restarts", "1", "--timeout", "400", "--", sys.executable, str(JOB)],
                             env=env, cwd=str(harness.REPO_ROOT))
    harness.STARTED_PIDS.append(launcher.pid)
    lines = []

    def read(stream):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            lines.append(line)
            harness.STARTED_PIDS.extend(int(pid) for pid in re.findall(r"started \w+:\d+ pid=(\d+)", line))
        stream.close()

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in (launcher.stdout, launcher.stderr)]
    for reader in readers:
        reader.start()
    killed = None
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and launcher.poll() is None:
            text = "\n".join(lines)
            if killed is None and f"PSB: backup written epoch=2 step={BACKUP_FREQ}" in text:
                killed = int(re.findall(r"started chief:0 pid=(\d+)", text)[-1])
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
    finally:
        terminate([launcher], grace=5)
        for reader in readers:
            reader.join(timeout=5)
    text = "\n".join(lines)
    assert killed is not None, f"the chief never backed up step {BACKUP_FREQ} of epoch 2:\n{text[-3000:]}"
    assert launcher.returncode == 0, f"rc={launcher.returncode}:\n{text[-3000:]}"
    assert "restarting the whole job (restart 1 (a failure, counted: 1 of 1 restarts used)" in text
    report = harness.last_json_line("\n".join(line[line.find("{"):] for line in lines if '{"steps"' in line))
    epoch, step = report["resumed_from"]
    saved_at = epoch * STEPS_PER_EPOCH + step
    print(f"measured: resumed_from={report['resumed_from']}, steps this run={report['steps']}, "
          f"optimizer_iterations={report['details']['optimizer_iterations']}")
    assert (epoch, step) >= (2, BACKUP_FREQ) and step % BACKUP_FREQ == 0
    assert report["details"]["resumed"]["optimizer_iterations"] == saved_at
    assert report["details"]["optimizer_iterations"] == EPOCHS * STEPS_PER_EPOCH
    assert report["steps"] == EPOCHS * STEPS_PER_EPOCH - saved_at
    assert not backup.exists()


@pytest.mark.slow
def test_lost_ps_still_fails_clearly_and_leaves_the_last_backup_whole(tmp_path):
    """A ps task SIGKILLed after epoch 1: the chief exits non-zero naming ps:0 within the limit (as without
    backups), and the last backup it wrote is complete and readable."""
    cluster = harness.loopback_cluster(2, ps=1, chief=True)
    backup = tmp_path / "backup"
    servers = _servers(cluster)
    tasks = list(servers.values())
    try:
        chief = _Task("chief:0", cluster, {"PSB_EPOCHS": EPOCHS, "PSB_BACKUP_DIR": backup,
                                           "PSB_BACKUP_FREQ": BACKUP_FREQ, "PSB_STEP_SLEEP": "0.2"})
        tasks.append(chief)
        assert chief.wait_for(rf"epoch 1/{EPOCHS}", timeout=240), f"no epoch 1:\n{chief.text[-3000:]}"
        servers["ps:0"].proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        rc = chief.wait(LOST_PS_LIMIT_S + 30)
        after = time.monotonic() - killed_at
    finally:
        _end(tasks)
    print(f"measured: rc={rc}, chief failed {after:.1f} s after ps:0 was killed")
    assert rc not in (0, None), f"rc={rc}:\n{chief.text[-3000:]}"
    assert after <= LOST_PS_LIMIT_S, f"the chief took {after:.0f} s to fail"
    assert re.search(r"/job:ps/replica:0/task:0|\bps:0\b", chief.text), chief.text[-3000:]
    state = json.loads((backup / "tfaccel_backup.json").read_text())
    assert (state["epoch"], state["step"]) >= (1, 0), state
    assert [p.name for p in backup.iterdir() if p.name.startswith(".tmp-")] == []  # no half-written backup left
    _, opt_vars, steps = _restore_into_fresh_objects(backup / state["weights"])
    assert steps == int(opt_vars[0]) == state["global_step"]


# ----------------------------------------------------------------------------------- atomic saves, no cluster
def _variables():
    import tensorflow as tf

    return tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64)


def test_backup_that_fails_midway_leaves_the_previous_backup_intact(tmp_path, monkeypatch):
    import tensorflow as tf

    from tfaccel.resilience.backups import read_backup, remove_backup
    from tfaccel.resilience.backups import restore_checkpoint_backup, write_checkpoint_backup

    weights, steps = _variables()
    ckpt = tf.train.Checkpoint(w=weights, steps=steps)
    write_checkpoint_backup(str(tmp_path), ckpt, epoch=1, step=0, steps_per_epoch=10)
    weights.assign([5.0, 6.0])
    steps.assign(15)

    real_write = tf.train.Checkpoint.write

    def crash_midway(self, prefix, options=None):
        Path(f"{prefix}.index").write_bytes(b"half an index")  # the process dies while writing
        raise OSError("disk full")

    monkeypatch.setattr(tf.train.Checkpoint, "write", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint_backup(str(tmp_path), ckpt, epoch=1, step=5, steps_per_epoch=10)
    monkeypatch.setattr(tf.train.Checkpoint, "write", real_write)
    state = read_backup(str(tmp_path))
    assert (state.epoch, state.step, state["global_step"]) == (1, 0, 10)
    assert sorted(os.listdir(tmp_path)) == ["backup-10.ckpt", "tfaccel_backup.json"]  # no half backup left

    # The pointer write itself fails after the checkpoint was renamed into place: still the previous backup.
    import tfaccel.resilience.backups

    def no_pointer(path, text):
        raise OSError("read-only file system")

    monkeypatch.setattr(tfaccel.resilience.backups, "atomic_write_text", no_pointer)
    with pytest.raises(OSError, match="read-only"):
        write_checkpoint_backup(str(tmp_path), ckpt, epoch=1, step=5, steps_per_epoch=10)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["backup-10.ckpt", "tfaccel_backup.json"]

    restore_checkpoint_backup(read_backup(str(tmp_path)), ckpt, backup_dir=str(tmp_path))
    assert weights.numpy().tolist() == [1.0, 2.0] and int(steps.numpy()) == 3

    # A later good save replaces it and removes the old data; remove_backup clears everything it wrote.
    weights.assign([7.0, 8.0])
    write_checkpoint_backup(str(tmp_path), ckpt, epoch=1, step=5, steps_per_epoch=10)
    assert sorted(os.listdir(tmp_path)) == ["backup-15.ckpt", "tfaccel_backup.json"]
    (tmp_path / ".tmp-backup-crashed.ckpt").mkdir()  # what a SIGKILL during a write leaves
    remove_backup(str(tmp_path))
    assert not tmp_path.exists()


def test_restore_refuses_a_keras_path_backup_and_a_different_model(tmp_path):
    import tensorflow as tf

    from tfaccel.resilience.backups import read_backup
    from tfaccel.resilience.backups import restore_checkpoint_backup, write_checkpoint_backup

    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "backup-5.weights.h5").write_bytes(b"h5")
    (tmp_path / "keras" / "tfaccel_backup.json").write_text(
        json.dumps({"epoch": 0, "step": 5, "global_step": 5, "weights": "backup-5.weights.h5"}))
    with pytest.raises(ConfigError, match=r"holds backup-5.weights.h5, a backup of the Keras training path; a "
                                          r"parameter_server job resumes only from its own tf.train.Checkpoint"):
        restore_checkpoint_backup(read_backup(str(tmp_path / "keras")), None, backup_dir=str(tmp_path / "keras"))

    weights, steps = _variables()
    write_checkpoint_backup(str(tmp_path / "ps"), tf.train.Checkpoint(w=weights, steps=steps), epoch=1, step=0,
                            steps_per_epoch=10)
    other = tf.train.Checkpoint(w=tf.Variable([0.0, 0.0]))
    with pytest.raises(ConfigError, match=r"backup-10.ckpt does not match this model and optimizer .*Remove the "
                                          r"directory to start from scratch"):
        restore_checkpoint_backup(read_backup(str(tmp_path / "ps")), other, backup_dir=str(tmp_path / "ps"))


def test_keras_path_refuses_a_parameter_server_backup_before_training(tmp_path, clean_tf_config):
    import keras
    import tensorflow as tf

    from tfaccel.resilience.backups import write_checkpoint_backup

    weights, steps = _variables()
    write_checkpoint_backup(str(tmp_path), tf.train.Checkpoint(w=weights, steps=steps), epoch=1, step=0,
                            steps_per_epoch=10)
    with tfaccel.scope(strategy="default"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    with pytest.raises(ConfigError, match=r"holds backup-10.ckpt, a tf.train.Checkpoint backup written by a "
                                          r"parameter_server job; strategy default resumes only from its own"):
        tfaccel.fit(model, np.zeros((8, 4), "float32"), np.zeros(8, "int64"), epochs=1, backup_dir=str(tmp_path))
    assert int(model.optimizer.iterations.numpy()) == 0  # nothing trained
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    assert sorted(os.listdir(tmp_path)) == ["backup-10.ckpt", "tfaccel_backup.json"]  # nothing lost
