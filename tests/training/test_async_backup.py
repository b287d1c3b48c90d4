"""Asynchronous backups (issue 35, point 6): the step loop hands a backup to a writer thread and trains on; a backup
due during a write waits for it (counted); a preemption stop and the end of training wait until it is on disk."""

import json
import time
from types import SimpleNamespace

import keras
import numpy as np
import pytest

import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.resilience import backup_writer, backups, job
from tfaccel.resilience.backup_writer import ASYNC_ENV, BackupWriter

X = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")
WRITE_S = 2.0  # how much longer the injected writer takes per backup file


def _model():
    with tfaccel.scope(strategy="default"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


@pytest.fixture
def slow_writes(monkeypatch):
    """Every backup file takes WRITE_S longer to write; the moments the writes ended."""
    ended, real = [], backup_writer.write_weights

    def slow(snapshot, path):
        time.sleep(WRITE_S)
        real(snapshot, path)
        ended.append(time.monotonic())

    monkeypatch.setattr(backup_writer, "write_weights", slow)
    return ended


class _StepEnds(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.at = {}

    def on_train_batch_end(self, batch, logs=None):
        self.at[batch + 1] = time.monotonic()


def test_the_step_after_a_due_backup_runs_while_the_backup_is_written(tmp_path, slow_writes):
    ends = _StepEnds()
    result = tfaccel.fit(_model(), X, Y, batch_size=8, epochs=1, verbose=0, seed=1, backup_dir=str(tmp_path / "b"),
                         backup_freq=4, callbacks=[ends], steps_per_execution=1)
    assert ends.at[5] < slow_writes[0], "step 5 waited for the backup of step 4"
    # the epoch end's backup was due while step 4's was still being written: it waited, once
    assert result.details["backups_written"] == 2 and len(slow_writes) == 2
    writer = result.details["backup_writer"]
    assert writer["mode"] == "async" and writer["waited"] == 1 and writer["write_seconds"] >= 2 * WRITE_S, writer
    assert not (tmp_path / "b").exists()  # the end waited for the last write before removing the backup


class _Crash(Exception):
    pass


class _CrashAfter(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            raise _Crash()


def test_an_error_in_the_loop_leaves_the_backup_in_flight_on_disk(tmp_path, slow_writes):
    """The backup of step 4 is still being written when step 5 raises: the error goes on once it is durable, so a
    restart resumes from step 4, not from the start."""
    with pytest.raises(_Crash):
        tfaccel.fit(_model(), X, Y, batch_size=8, epochs=1, verbose=0, seed=1, backup_dir=str(tmp_path / "b"),
                    backup_freq=4, callbacks=[_CrashAfter(5)], steps_per_execution=1)
    assert len(slow_writes) == 1
    state = json.loads((tmp_path / "b" / "tfaccel_backup.json").read_text())
    assert (state["epoch"], state["step"]) == (0, 4)


def _ctx(backup):
    backend = SimpleNamespace(uses_keras_fit=True, worker_index=0, num_workers=1, is_chief=True,
                              sum_over_processes=None, strategy=None)
    return SimpleNamespace(backend=backend, model=backup.model, named={"backup": backup}, callbacks=[], start_step=0,
                           request=SimpleNamespace(backups=SimpleNamespace(backup_dir=backup.backup_dir), epochs=1),
                           data=SimpleNamespace(steps_per_epoch=8))


def test_a_preemption_stop_returns_once_its_backup_is_on_disk(tmp_path, slow_writes):
    model = _model()
    model.optimizer.build(model.trainable_variables)
    backup = backups.StepBackup(str(tmp_path), save_freq=None, is_chief=True, steps_per_epoch=8)
    backup.set_model(model)
    ctx = _ctx(backup)
    job.add_preemption(ctx)
    ctx.preemption.save(0, 3)  # what Preemption does at the agreed step, before the process exits 75
    assert json.loads((tmp_path / "tfaccel_backup.json").read_text())["weights"] == "backup-3.weights.h5"
    assert not backup.writer.pending and len(slow_writes) == 1


def test_async_backups_can_be_switched_off_and_a_bad_value_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(ASYNC_ENV, "0")
    assert not BackupWriter().asynchronous
    result = tfaccel.fit(_model(), X, Y, batch_size=8, epochs=1, verbose=0, seed=1, backup_dir=str(tmp_path / "b"),
                         backup_freq=4, steps_per_execution=1)
    assert result.details["backup_writer"]["mode"] == f"sync ({ASYNC_ENV}=0)"
    assert result.details["backups_written"] == 2 and result.details["backup_writer"]["waited"] == 0
    monkeypatch.setenv(ASYNC_ENV, "yes")
    with pytest.raises(ConfigError, match=rf"{ASYNC_ENV} must be 1 \(write backups in a background thread, the "
                                          r"default\) or 0 .*received 'yes'. Unset it for the default"):
        tfaccel.fit(_model(), X, Y, batch_size=8, epochs=1, verbose=0, backup_dir=str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()
