"""The user's BackupAndRestore / ModelCheckpoint on a worker other than the chief (issue 24, point 9), in one
process: what tfaccel.resilience.keras_callbacks hands that worker. The multi-process proof (a killed worker, a restart,
the uninterrupted run's weights) is tests/reliability/test_reliability_keras_callbacks.py."""

import dataclasses
import os
import subprocess
import sys
import tempfile

import keras
import numpy as np
import pytest

from tfaccel.resilience import keras_callbacks

X = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
Y = np.ones((16, 2), "float32")


@dataclasses.dataclass
class Backend:  # the fields of tfaccel's Backend that keras_callbacks reads
    is_chief: bool
    num_workers: int = 2

    def scope(self):
        import contextlib

        return contextlib.nullcontext()


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp"


def test_the_chief_and_a_single_worker_keep_the_users_callbacks():
    user = [keras.callbacks.BackupAndRestore("/b"), keras.callbacks.ModelCheckpoint("/c/m.keras")]
    assert keras_callbacks.worker_callbacks(user, backend=Backend(is_chief=True)) == user
    assert keras_callbacks.worker_callbacks(user, backend=Backend(is_chief=False, num_workers=1)) == user


def test_another_worker_reads_the_chiefs_backup_and_writes_only_privately(tmp_path, private_tmp):
    real, ckpt = tmp_path / "backup", tmp_path / "ckpt"
    chief_model = _model()
    chief_model.fit(X, Y, epochs=2, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(real),
                                                                                            delete_checkpoint=False)])
    before = {p.name: p.stat().st_mtime_ns for p in real.iterdir()}
    backup = keras.callbacks.BackupAndRestore(str(real))
    checkpoint = keras.callbacks.ModelCheckpoint(str(ckpt / "m-{epoch}.weights.h5"), save_weights_only=True)
    given = keras_callbacks.worker_callbacks([backup, checkpoint], backend=Backend(is_chief=False))
    assert backup.backup_dir == str(real) and checkpoint.filepath == str(ckpt / "m-{epoch}.weights.h5")
    assert isinstance(given[0], keras.callbacks.BackupAndRestore) and given[0].reads_from == str(real)
    assert isinstance(given[1], keras.callbacks.ModelCheckpoint) and given[1] is not checkpoint
    [private] = list(private_tmp.iterdir())
    assert private.name.startswith(f"tfaccel-worker-{os.getpid()}-")
    assert given[1].filepath.startswith(str(private)) and given[1].filepath.endswith("m-{epoch}.weights.h5")

    worker_model = _model()
    seen = []
    probe = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(sorted(
        str(p.relative_to(private)) for p in private.rglob("*") if p.is_file())))
    history = worker_model.fit(X, Y, epochs=4, verbose=0, callbacks=given + [probe])
    assert len(history.history["loss"]) == 2  # resumed at the chief's epoch 2
    assert "0/latest.weights.h5" in seen[0] and "1/m-3.weights.h5" in seen[0]  # written privately
    assert {p.name: p.stat().st_mtime_ns for p in real.iterdir()} == before  # the real backup untouched
    assert not ckpt.exists() and list(private_tmp.iterdir()) == []  # nothing real written, private dir removed


def test_a_dead_workers_private_directory_is_removed_by_the_next_one(private_tmp):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True, timeout=60)
    (private_tmp / f"tfaccel-worker-{int(dead.stdout)}-abc").mkdir()
    (private_tmp / f"tfaccel-worker-{os.getppid()}-live").mkdir()  # a live process's: kept
    (private_tmp / "tfaccel-worker-ckpt-xyz").mkdir()  # not a pid: kept
    keras_callbacks.worker_callbacks([keras.callbacks.BackupAndRestore("/b")], backend=Backend(is_chief=False))
    names = sorted(p.name for p in private_tmp.iterdir())
    assert f"tfaccel-worker-{int(dead.stdout)}-abc" not in names
    assert f"tfaccel-worker-{os.getppid()}-live" in names and "tfaccel-worker-ckpt-xyz" in names


def test_the_epoch_a_users_backup_resumes_at_is_known_before_training(tmp_path):
    model = _model()
    model.fit(X, Y, epochs=3, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path),
                                                                                      delete_checkpoint=False)])
    fresh = _model()
    assert keras_callbacks.keras_resume_epoch([keras.callbacks.BackupAndRestore(str(tmp_path))], model=fresh,
                                              backend=Backend(is_chief=True)) == 3
    np.testing.assert_array_equal(fresh.get_weights()[0], model.get_weights()[0])
    assert keras_callbacks.keras_resume_epoch([], model=_model(), backend=Backend(is_chief=True)) == 0


def test_another_worker_logs_tensorboard_and_csv_rows_privately(tmp_path, private_tmp):
    """Only the chief writes the user's TensorBoard logs and CSV rows (an appending CSVLogger's file had both
    workers' rows)."""
    logs, rows = tmp_path / "logs", tmp_path / "rows.csv"
    board = keras.callbacks.TensorBoard(str(logs))
    csv = keras.callbacks.CSVLogger(str(rows), append=True)
    given = keras_callbacks.worker_callbacks([board, csv], backend=Backend(is_chief=False))
    assert board.log_dir == str(logs) and csv.filename == str(rows)  # the user's objects are untouched
    assert type(given[0]) is keras.callbacks.TensorBoard and type(given[1]) is keras.callbacks.CSVLogger
    [private] = list(private_tmp.iterdir())
    assert given[0].log_dir.startswith(str(private)) and given[1].filename == str(private / "1" / "rows.csv")
    written = []
    probe = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: written.extend(
        str(p.relative_to(private)) for p in private.rglob("*") if p.is_file()))
    _model().fit(X, Y, epochs=2, verbose=0, callbacks=given + [probe])
    assert "1/rows.csv" in written and any(name.startswith("0/train/events.out") for name in written), written
    assert not logs.exists() and not rows.exists() and list(private_tmp.iterdir()) == []
    chief = keras_callbacks.worker_callbacks([board, csv], backend=Backend(is_chief=True))
    _model().fit(X, Y, epochs=2, verbose=0, callbacks=chief)
    assert len(rows.read_text().splitlines()) == 3 and (logs / "train").is_dir()  # header + 2 epochs
