"""Backups that cannot delete or lose what they should not (issue 24, points 1-4).

Pointers and progress files confined to their directory; data and directory fsynced before the pointer swap, the
previous backup removed only after; a job in every pointer and progress file, a second running job refused naming
both; resume checks the file (readable, same layers and shapes, step inside the epoch) with a ConfigError.
"""

import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.job_id import JOB_ID_ENV
from tfaccel.resilience import backup_guard, backups, evaluator

X = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")
STEPS = 4  # 32 examples, batch 8


def _model(*hidden):
    with tfaccel.scope(strategy="default"):
        layers = [keras.layers.Dense(h, activation="relu") for h in hidden]
        model = keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return model


def _backup_of(model, backup_dir, *, step=2, epoch=0):
    """A backup written by StepBackup (as fit writes it) at ``(epoch, step)``."""
    cb = backups.StepBackup(str(backup_dir), save_freq=step, is_chief=True, steps_per_epoch=STEPS)
    cb.set_model(model)
    cb.on_epoch_begin(epoch)
    cb.on_train_batch_end(step - 1)
    cb.writer.wait()  # written in the background
    return json.loads((backup_dir / "tfaccel_backup.json").read_text())


def _fit(model, backup_dir, **kw):
    return tfaccel.fit(model, X, Y, batch_size=8, epochs=2, verbose=0, seed=1, backup_dir=str(backup_dir), **kw)


def _edit_pointer(backup_dir, **changes):
    path = backup_dir / "tfaccel_backup.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.fixture
def other_process():
    """A live process of this host standing for another job (ended by PID after the test)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def _job_of(pid):
    return {"id": f"other-job-{pid}", "host": backup_guard.socket.gethostname(), "pid": pid,
            "pid_start": backup_guard.pid_start(pid), "written_at": time.time()}


# --------------------------------------------------------------------------------------------- 1 confinement
@pytest.mark.parametrize("name", ["../victim", "{victim}", "sub/../../victim", "..", "", 7, "link"])
def test_a_pointer_naming_anything_outside_backup_dir_is_refused_and_nothing_outside_is_touched(tmp_path, name):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    backup_dir = tmp_path / "backup"
    _backup_of(_model(), backup_dir)
    os.symlink(victim, backup_dir / "link")  # a name inside that leads outside
    _edit_pointer(backup_dir, weights=name.format(victim=victim) if isinstance(name, str) else name)
    with pytest.raises(ConfigError, match=r"backup_dir .*backup: tfaccel_backup.json 'weights' must name a file "
                                          r"inside backup_dir; received .*Nothing outside backup_dir was touched"):
        backups.read_backup(str(backup_dir))
    with pytest.raises(ConfigError, match=r"must name a file inside backup_dir"):  # the next save would rmtree it
        backups.commit_backup(str(backup_dir), {"epoch": 0, "step": 3, "global_step": 3, "weights": "backup-3.ckpt"})
    backups.remove_backup(str(backup_dir))  # removes tfaccel's own files only, never through the link
    assert (victim / "precious.txt").read_text() == "keep me"


def test_a_progress_file_naming_a_checkpoint_outside_checkpoint_dir_is_refused(tmp_path):
    outside = tmp_path / "elsewhere" / "ckpt-1"
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    (ckpt_dir / evaluator.PROGRESS_FILE).write_text(json.dumps(
        {"chief": "h:1", "checkpoints": [str(outside)], "done": True, "job": backup_guard.job_identity()}))
    with pytest.raises(ConfigError, match=r"checkpoint_dir .*ckpt: tfaccel-progress.json 'checkpoints' must name a "
                                          r"file inside checkpoint_dir; received '.*elsewhere/ckpt-1'"):
        evaluator._read_progress(str(ckpt_dir / evaluator.PROGRESS_FILE), "h:1", 0.0)


# --------------------------------------------------------------------------------------------- 2 durability
def test_data_and_directory_are_fsynced_before_the_pointer_swap_and_the_old_backup_removed_after(
        tmp_path, monkeypatch):
    model, backup_dir = _model(), tmp_path / "backup"
    _backup_of(model, backup_dir, step=1)
    events = []
    real_fsync, real_replace, real_unlink = os.fsync, os.replace, os.unlink

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", os.path.basename(b))),
                                                      real_replace(a, b))[1])
    monkeypatch.setattr(os, "unlink", lambda p: (events.append(("unlink", os.path.basename(p))), real_unlink(p))[1])
    cb = backups.StepBackup(str(backup_dir), save_freq=2, is_chief=True, steps_per_epoch=STEPS)
    cb.set_model(model)
    cb.on_epoch_begin(0)
    cb.on_train_batch_end(1)
    cb.writer.wait()  # written in the background
    monkeypatch.undo()
    order = [e for e in events if e[1] in ("backup", "backup-2.weights.h5", "backup-1.weights.h5",
                                           "tfaccel_backup.json") or e[1].startswith("backup-2.tmp")]
    data_synced = order.index(next(e for e in order if e[0] == "fsync" and e[1].startswith("backup-2.tmp")))
    data_renamed = order.index(("replace", "backup-2.weights.h5"))
    pointer = order.index(("replace", "tfaccel_backup.json"))
    removed = order.index(("unlink", "backup-1.weights.h5"))
    assert data_synced < data_renamed < order.index(("fsync", "backup")) < pointer
    assert pointer < len(order) - 1 - order[::-1].index(("fsync", "backup")) < removed, order
    assert sorted(os.listdir(backup_dir)) == ["backup-2.weights.h5", "tfaccel_backup.json"]


# --------------------------------------------------------------------------------------------- 3 job identity
def test_every_pointer_and_progress_file_carries_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_ID_ENV, "train-42")
    pointer = _backup_of(_model(), tmp_path / "backup")
    assert pointer["job"]["id"] == "train-42" and pointer["job"]["pid"] == os.getpid()
    assert pointer["steps_per_epoch"] == STEPS

    class Saved:
        saved = [str(tmp_path / "ckpt-1")]

    [progress] = evaluator.evaluator_callbacks(checkpoint_dir=str(tmp_path), checkpoints=Saved(), is_chief=True,
                                               task=_evaluator_task())
    progress.on_train_end()
    assert json.loads((tmp_path / evaluator.PROGRESS_FILE).read_text())["job"]["id"] == "train-42"
    monkeypatch.setenv(JOB_ID_ENV, "bad id/../x")
    with pytest.raises(ConfigError, match=r"TFACCEL_JOB_ID must be 1-128 characters .*received 'bad id/../x'"):
        backup_guard.job_identity()


def _evaluator_task():
    from tfaccel.cluster import ClusterSpec, TaskInfo

    spec = ClusterSpec.from_hosts(workers=["localhost:2000"], ps=["localhost:3000"], chief="localhost:4000",
                                  evaluator="localhost:5000")
    return TaskInfo(spec=spec, task_type="chief", task_index=0)


def test_a_second_running_job_on_the_same_backup_dir_is_refused_naming_both(tmp_path, other_process):
    backup_dir = tmp_path / "backup"
    _backup_of(_model(), backup_dir)
    other = _job_of(other_process.pid)
    _edit_pointer(backup_dir, job=other)
    mine = backup_guard.job_identity()["id"]
    with pytest.raises(ConfigError, match=rf"backup_dir .*backup is in use by job 'other-job-{other_process.pid}' "
                                          rf"\(host .*, pid {other_process.pid}\), which is still running; this is "
                                          rf"job '{mine}'.*give this one another backup_dir"):
        _fit(_model(), backup_dir)
    # the other job wrote its pointer while this one was training: this save is refused, its data untouched
    (backup_dir / "backup-3.weights.h5").write_bytes(b"this job's new data")
    with pytest.raises(ConfigError, match=rf"job 'other-job-{other_process.pid}' .* wrote a backup there while job "
                                          rf"'{mine}' .* was training; two jobs cannot share a backup_dir"):
        backups.commit_backup(str(backup_dir), {"epoch": 0, "step": 3, "global_step": 3,
                                                "weights": "backup-3.weights.h5"})
    assert sorted(os.listdir(backup_dir)) == ["backup-2.weights.h5", "tfaccel_backup.json"]


def test_a_job_that_ended_is_taken_over_by_its_restart(tmp_path):
    backup_dir = tmp_path / "backup"
    model = _model()
    _backup_of(model, backup_dir)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True, timeout=60)
    _edit_pointer(backup_dir, job=_job_of(int(ended.stdout)))
    result = _fit(_model(), backup_dir)
    assert result.resumed_from == (0, 2) and not backup_dir.exists()


def test_an_old_progress_file_is_not_followed_by_a_new_evaluator(tmp_path, monkeypatch):
    path = tmp_path / evaluator.PROGRESS_FILE
    old = {**backup_guard.job_identity(), "written_at": time.time() - 3600}
    path.write_text(json.dumps({"chief": "h:1", "checkpoints": [], "done": True, "job": old}))
    assert evaluator._read_progress(str(path), "h:1", time.time() - 60) is None  # another, earlier job's
    path.write_text(json.dumps({"chief": "h:1", "checkpoints": [], "done": True}))
    assert evaluator._read_progress(str(path), "h:1", 0.0) is None  # no job: written before job ids
    monkeypatch.setenv(JOB_ID_ENV, "job-b")
    path.write_text(json.dumps({"chief": "h:1", "checkpoints": [], "done": True, "job": {
        **backup_guard.job_identity(), "id": "job-a"}}))
    assert evaluator._read_progress(str(path), "h:1", 0.0) is None  # a fresh file, but of job-a
    path.write_text(json.dumps({"chief": "h:1", "checkpoints": [], "done": True, "job": backup_guard.job_identity()}))
    assert evaluator._read_progress(str(path), "h:1", time.time() + 3600)["done"] is True  # the id decides


# --------------------------------------------------------------------------------------------- 4 resume checks
@pytest.mark.parametrize("damage", [b"", b"\x89HDF\r\n\x1a\n truncated", None])
def test_resume_refuses_an_unreadable_weights_file(tmp_path, damage):
    backup_dir = tmp_path / "backup"
    pointer = _backup_of(_model(), backup_dir)
    weights = backup_dir / pointer["weights"]
    weights.write_bytes(damage if damage is not None else weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ConfigError, match=r"backup_dir .*backup: backup-2.weights.h5 is unreadable \(\d+ bytes; .*\): "
                                          r"the file was damaged after tfaccel wrote it"):
        _fit(_model(), backup_dir)


def test_resume_refuses_another_models_weights(tmp_path):
    backup_dir = tmp_path / "backup"
    _backup_of(_model(3), backup_dir)  # 2 Dense layers: 4-3-2
    with pytest.raises(ConfigError, match=r"backup_dir .*backup: backup-2.weights.h5 was written by another model: "
                                          r"layers/dense/vars/0 has shape \(4, 3\) in the backup, \(4, 2\) in this "
                                          r"model; .*layers/dense_1/vars/0 \(3, 2\) is in the backup, not in this "
                                          r"model.*\. Resume with the model that wrote it"):
        _fit(_model(), backup_dir)  # 1 Dense layer: 4-2, same last-layer name
    backup_dir2 = tmp_path / "backup2"
    _backup_of(_model(), backup_dir2)
    with pytest.raises(ConfigError, match=r"written by another model: .*layers/dense_1/vars/0 \(2, 2\) is in this "
                                          r"model, not in the backup"):
        with tfaccel.scope(strategy="default"):  # same first layer shapes, one layer more
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), keras.layers.Dense(2)])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        _fit(model, backup_dir2)


def test_resume_refuses_a_step_outside_the_epoch(tmp_path):
    backup_dir = tmp_path / "backup"
    _backup_of(_model(), backup_dir)
    _edit_pointer(backup_dir, step=9)
    with pytest.raises(ConfigError, match=r"backup_dir .*backup: the backup is at step 9 of epoch 0 of 4 steps per "
                                          r"epoch, but this job has 2 steps per epoch \(another batch size"):
        tfaccel.fit(_model(), X, Y, batch_size=16, epochs=2, verbose=0, seed=1, backup_dir=str(backup_dir))
    _edit_pointer(backup_dir, step=-1)
    with pytest.raises(ConfigError, match=r"epoch and step must be whole numbers >= 0; received epoch=0, step=-1"):
        _fit(_model(), backup_dir)


def test_a_pointer_swap_killed_midway_leaves_nothing_once_training_completes(tmp_path):
    """Found by the kills-during-saves tally: a SIGKILL inside the pointer's atomic write left its temporary
    file, so backup_dir survived the completed job."""
    backup_dir = tmp_path / "backup"
    _backup_of(_model(), backup_dir)
    (backup_dir / ".tmp-tfaccel_backup.json-k1ll3d").write_text('{"epoch": 0, "st')
    (backup_dir / "notes.txt").write_text("the user's")
    result = _fit(_model(), backup_dir)
    assert result.resumed_from == (0, 2)
    assert os.listdir(backup_dir) == ["notes.txt"]  # tfaccel's files gone, the user's kept


def test_flushing_a_backup_dir_skips_a_file_renamed_meanwhile(tmp_path, monkeypatch):
    """Workers writing their optimizer shards into one backup_dir at once: a temporary file another worker renamed
    between this worker's listing and its open is not an error (that worker flushed it itself). The race is forced
    by a listing that names a file already gone."""
    (tmp_path / "backup-3.shard-0-of-2.npz").write_bytes(b"x")
    listing = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: listing(path) + [".tmp-backup-3.shard-1-of-2-99.npz"])
    monkeypatch.setattr(os.path, "isfile", lambda path: True)  # it was there when listed
    backup_guard.fsync_path(str(tmp_path))
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError):  # a file that is missing outright still fails
        backup_guard.fsync_path(str(tmp_path / "gone.weights.h5"))
