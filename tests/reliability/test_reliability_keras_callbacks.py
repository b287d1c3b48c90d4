"""The user's own keras.callbacks.BackupAndRestore, ModelCheckpoint and CSVLogger under `tfaccel launch --workers 2`
and `tfaccel launch --backend horovod -np 2` (issue 24, point 9): the chief writes the real paths, the other worker
private temporary ones; a worker SIGKILLed after an epoch, the job restarted, ends with the weights of an
uninterrupted run.

Real processes on 127.0.0.1 through the real front end (rel_scenarios.Run); the job is scripts/rel_job.py with
REL_KERAS_BACKUP / REL_KERAS_CHECKPOINT / REL_KERAS_CSV (Keras' callbacks passed to compile_and_fit, no tfaccel
backup_dir).
"""

import os

import pytest

import rel_scenarios as rs

BACKENDS = {"multi_worker": (["--workers", "2"], ("worker0", "worker1"), "worker:1"),
            "horovod": (["--backend", "horovod", "-np", "2", "--gloo-timeout", "120"], ("rank0", "rank1"), "rank:1")}


def _launch(work, backend, *, kill=None, timeout=300):
    work.mkdir(parents=True, exist_ok=True)
    (work / "tmp").mkdir(exist_ok=True)
    env = dict(REL_BACKUP_FREQ="", REL_KERAS_BACKUP=work / "keras-backup",
               REL_KERAS_CHECKPOINT=work / "ckpt" / "m-{epoch}.weights.h5", REL_KERAS_CSV=work / "rows.csv",
               REL_WEIGHTS_OUT=work / "res-{task}.npz",
               TMPDIR=work / "tmp")
    if kill:
        env["REL_KILL_AT"] = kill
    args = BACKENDS[backend][0] + ["--timeout", str(timeout - 10)] + (["--max-restarts", "1"] if kill else [])
    run = rs.Run(args + ["--", str(rs.JOB)], env=rs.job_env(work, **env))
    run.wait(timeout)
    assert run.returncode == 0, f"rc={run.returncode} timed out={run.timed_out}\n{run.tail(60)}"
    return run


def _csv_epochs(work):
    """The epoch column of the appending CSVLogger's file: each epoch once, from the chief alone."""
    lines = (work / "rows.csv").read_text().splitlines()
    assert lines[0].startswith("epoch,"), lines
    return [int(line.split(",")[0]) for line in lines[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["multi_worker", pytest.param("horovod", marks=pytest.mark.horovod)])
def test_keras_backup_and_checkpoint_survive_a_killed_worker_and_end_like_an_uninterrupted_run(tmp_path, backend):
    if backend == "horovod":
        if os.environ.get("TFACCEL_NO_HOROVOD") == "1":
            pytest.skip("TFACCEL_NO_HOROVOD=1: Horovod deliberately not built here")
        from tfaccel.launch.horovod import find_horovodrun

        find_horovodrun()  # fails (not skips) when Horovod is not built: CI builds it (scripts/install_horovod.sh)
    tasks, victim = BACKENDS[backend][1:]
    _launch(tmp_path / "reference", backend)
    ref = tmp_path / "reference"
    assert sorted(p.name for p in (ref / "ckpt").iterdir()) == [f"m-{e}.weights.h5" for e in (1, 2, 3)]
    tmp = ref / "tmp"
    assert rs.job_files_in_tmp(str(p.relative_to(tmp)) for p in tmp.rglob("*")) == []
    assert not (ref / "keras-backup").exists()
    assert _csv_epochs(ref) == [0, 1, 2]
    run = _launch(tmp_path / "killed", backend, kill=f"{victim}:1:3")  # epoch 1 (0-based), after the backup of epoch 0
    work = tmp_path / "killed"
    assert (work / "killed").read_text().strip() == "1:3" and "restart" in run.text
    reports = run.json_lines()
    assert len(reports) == 2 and all(r["steps"] == 2 * rs.STEPS_PER_EPOCH for r in reports), reports  # epochs 1-2
    mismatch, max_diff = rs.compare_weights(ref / f"res-{tasks[0]}.npz", work, tasks, rtol=1e-5, atol=1e-5)
    assert mismatch is None, mismatch
    # the chief wrote the real paths; Keras removed its backup at the end; no private directory is left behind
    # (the killed worker's own is removed by its restart)
    assert sorted(p.name for p in (work / "ckpt").iterdir()) == [f"m-{e}.weights.h5" for e in (1, 2, 3)]
    assert not (work / "keras-backup").exists()
    assert _csv_epochs(work) == [0, 1, 2]  # the killed run appended epochs 1-2 after its restart
    assert [p.name for p in (work / "tmp").iterdir() if p.name.startswith("tfaccel-worker-")] == []
