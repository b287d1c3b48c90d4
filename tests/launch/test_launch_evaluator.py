"""Issue 15: the side-car evaluator of `tfaccel launch --ps 1 --workers 1 --evaluator` (a real job, ~40 s), and the
evaluator's message paths in one process."""

import importlib.util
import json
import os

import numpy as np
import pytest

import launch_util
from tfaccel.cluster import ClusterSpec, TaskInfo
from tfaccel.errors import ConfigError
from tfaccel.resilience import evaluator

SCRIPT = launch_util.SCRIPTS / "ps_evaluator.py"


def _job_module():
    spec = importlib.util.spec_from_file_location("ps_evaluator_job", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if "RESULT {" in line:
            result = json.loads(line[line.index("RESULT ") + 7:])
            out[result["task"]] = result
    return out


def _tensorboard_values(log_dir: str, tag: str) -> dict:
    import tensorflow as tf

    values = {}
    for name in os.listdir(log_dir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return values


def test_evaluator_follows_every_checkpoint_and_ends_with_the_job(tmp_path) -> None:
    import tensorflow as tf

    from tfaccel.launch.procs import free_ports

    # The chief's addresses are fixed (a cluster file), and an earlier job's finished progress file names this very
    # chief, written just now: only the launch's job id (issue 24) tells the evaluator it is not this job's.
    chief_port, worker_port, ps_port, evaluator_port = free_ports(4)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"chief: ['127.0.0.1:{chief_port}']\nworker: ['127.0.0.1:{worker_port}']\n"
                       f"ps: ['127.0.0.1:{ps_port}']\nevaluator: ['127.0.0.1:{evaluator_port}']\n")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / evaluator.PROGRESS_FILE).write_text(json.dumps({
        "chief": f"127.0.0.1:{chief_port}", "checkpoints": [], "done": True,
        "job": {**_job()["job"], "id": "an-earlier-job"}}))
    with launch_util.Launcher("--cluster", str(cluster), "--job-id", "eval-job-1", "--", str(SCRIPT),
                              env={"EVAL_DIR": str(tmp_path)}) as job:
        assert job.wait(timeout=240) == 0, job.stdout[-3000:] + job.stderr[-3000:]
    text = job.stdout + job.stderr
    results = _results(text)
    chief, side = results["chief"], results["evaluator"]
    assert chief["job_id"] == side["job_id"] == "eval-job-1"
    assert chief["strategy"] == "parameter_server" and side["strategy"] == "default"
    assert any("this task is the side-car evaluator" in n and "strategy 'parameter_server' is for the training "
               "tasks" in n for n in side["notes"])
    job_module = _job_module()
    assert len(side["evaluations"]) == job_module.EPOCHS == len(chief["checkpoints"])
    assert [e["checkpoint"] for e in side["evaluations"]] == chief["checkpoints"]
    assert side["history"]["val_loss"] == chief["history"]["val_loss"]  # the chief's own validation of each epoch
    _, _, (vx, vy) = job_module.data()
    for item in side["evaluations"]:  # metrics equal model.evaluate of the saved checkpoint, here
        model = job_module.build()
        tf.train.Checkpoint(model=model).read(item["checkpoint"]).expect_partial()
        logs = model.evaluate(vx, vy, verbose=0, return_dict=True)
        for name, value in logs.items():
            np.testing.assert_allclose(item["metrics"][f"val_{name}"], value, rtol=1e-6)
        assert f"[evaluator 0] tfaccel INFO: evaluator: checkpoint {os.path.basename(item['checkpoint'])} " \
               f"(epoch {item['epoch']}): val_accuracy: " in text
    assert "evaluator: training ended; 3 checkpoint(s) evaluated" in text
    assert "evaluator:0 pid=" in text and "finished OK" in text
    written = _tensorboard_values(str(tmp_path / "tb" / "evaluator"), "epoch_loss")
    assert sorted(written) == [1, 2, 3]
    np.testing.assert_allclose([written[s] for s in (1, 2, 3)], side["history"]["val_loss"], rtol=1e-6)


# ------------------------------------------------------------------------------------------- message paths
def _job() -> dict:
    """The job record a chief of this job writes into its progress file (written now)."""
    from tfaccel.resilience.backup_guard import job_identity

    return {"job": job_identity()}


def _task(role: str = "evaluator", evaluator_role: bool = True) -> TaskInfo:
    spec = ClusterSpec.from_hosts(workers=["localhost:2000"], ps=["localhost:3000"], chief="localhost:4000",
                                  evaluator="localhost:5000" if evaluator_role else None)
    return TaskInfo(spec, role, 0)


@pytest.fixture
def tiny_model():
    import tfaccel

    with tfaccel.scope(strategy="default"):
        model = _job_module().build()
    return model


def test_evaluator_needs_checkpoint_dir_and_validation_data(tiny_model) -> None:
    with pytest.raises(ConfigError, match=r"tfaccel.fit in the evaluator task \(evaluator:0\): checkpoint_dir is "
                                          r"required; received checkpoint_dir=None \(backup_dir='/b' cannot be "
                                          r"followed: backups are removed when training ends\)"):
        evaluator.run_evaluator(tiny_model, validation_data=([0], [0]), checkpoint_dir=None, backup_dir="/b",
                                task=_task())
    with pytest.raises(ConfigError, match=r"checkpoint_dir is required; received checkpoint_dir=''\. The side-car"):
        evaluator.run_evaluator(tiny_model, validation_data=([0], [0]), checkpoint_dir="", task=_task())
    with pytest.raises(ConfigError, match=r"validation_data is required; received None"):
        evaluator.run_evaluator(tiny_model, validation_data=None, checkpoint_dir="/c", task=_task())
    with pytest.raises(ConfigError, match=r"validation_data must be \(x, y\) or \(x, y, sample_weight\) or a "
                                          r"dataset; received a list of length 1"):
        evaluator.run_evaluator(tiny_model, validation_data=[[0]], checkpoint_dir="/c", task=_task())


def test_evaluator_waits_are_bounded(tiny_model, tmp_path, monkeypatch) -> None:
    _, _, val = _job_module().data()
    monkeypatch.setenv(evaluator.TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match=r"TFACCEL_EVALUATOR_TIMEOUT must be a number of seconds > 0; received "
                                          r"'soon'"):
        evaluator.run_evaluator(tiny_model, validation_data=val, checkpoint_dir=str(tmp_path), task=_task())
    monkeypatch.setenv(evaluator.TIMEOUT_ENV, "1")
    # a progress file of another job (another chief address) is not followed
    (tmp_path / evaluator.PROGRESS_FILE).write_text(json.dumps({"chief": "localhost:9", "checkpoints": [],
                                                                 "done": True, **_job()}))
    with pytest.raises(evaluator.EvaluatorTimeout, match=r"evaluator: no progress from the chief in .* for 1 s "
                                                         r"\(chief localhost:4000\).*Set TFACCEL_EVALUATOR_TIMEOUT"):
        evaluator.run_evaluator(tiny_model, validation_data=val, checkpoint_dir=str(tmp_path), task=_task())
    (tmp_path / evaluator.PROGRESS_FILE).write_text(json.dumps({"chief": "localhost:4000", "checkpoints": [],
                                                                 "done": False, **_job()}))
    with pytest.raises(evaluator.EvaluatorTimeout, match=r"evaluator: no new checkpoint from the chief in .* for 1 s"):
        evaluator.run_evaluator(tiny_model, validation_data=val, checkpoint_dir=str(tmp_path), task=_task())


def test_evaluator_skips_removed_and_refuses_unfitting_checkpoints(tiny_model, tmp_path) -> None:
    import logging

    import keras
    import tensorflow as tf

    from tfaccel.log import get_logger

    _, _, val = _job_module().data()
    progress = tmp_path / evaluator.PROGRESS_FILE
    gone = str(tmp_path / "ckpt-1")
    progress.write_text(json.dumps({"chief": "localhost:4000", "checkpoints": [gone], "done": True, **_job()}))
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    get_logger().addHandler(handler)
    try:
        result = evaluator.run_evaluator(tiny_model, validation_data=val, checkpoint_dir=str(tmp_path), task=_task())
    finally:
        get_logger().removeHandler(handler)
    assert result.details["evaluations"] == [] and result.history == {}
    assert [r.getMessage() for r in records] == [f"evaluator: checkpoint {gone} was removed before it could be "
                                                 "evaluated (the chief keeps the last 3); skipped"]
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tf.train.Checkpoint(model=other).write(str(tmp_path / "other"))
    progress.write_text(json.dumps({"chief": "localhost:4000", "checkpoints": [path], "done": True, **_job()}))
    with pytest.raises(ConfigError, match=r"evaluator: checkpoint .*other does not fit the model 'tiny'"):
        evaluator.run_evaluator(tiny_model, validation_data=val, checkpoint_dir=str(tmp_path), task=_task())


def test_progress_only_when_the_cluster_has_an_evaluator(tmp_path) -> None:
    class Saved:
        saved = ["a/ckpt-1"]

    assert evaluator.evaluator_callbacks(checkpoint_dir=str(tmp_path), checkpoints=Saved(), is_chief=True,
                                         task=_task("chief", evaluator_role=False)) == []
    assert evaluator.evaluator_callbacks(checkpoint_dir=str(tmp_path), checkpoints=Saved(), is_chief=False,
                                         task=_task("chief")) == []
    [callback] = evaluator.evaluator_callbacks(checkpoint_dir=str(tmp_path), checkpoints=Saved(), is_chief=True,
                                               task=_task("chief"))
    callback.on_train_end()
    written = json.loads((tmp_path / evaluator.PROGRESS_FILE).read_text())
    assert written.pop("job")["id"]
    assert written == {"chief": "localhost:4000", "checkpoints": ["a/ckpt-1"], "done": True}
    assert evaluator.is_evaluator_task(_task()) and not evaluator.is_evaluator_task(_task("chief"))


def test_plan_note_in_the_evaluator() -> None:
    from tfaccel.plan import _evaluator_note

    note = _evaluator_note("parameter_server", {"variable_partitioner": 2})
    assert note == ("this task is the side-car evaluator: tfaccel.fit evaluates the chief's checkpoints "
                    "(checkpoint_dir) on validation_data and does not train; strategy 'parameter_server' and its "
                    "options ['variable_partitioner'] are for the training tasks, so this task takes the local rules "
                    "of 'auto'")


def test_compile_and_fit_in_the_evaluator_task_evaluates(tmp_path, monkeypatch) -> None:
    import tensorflow as tf

    import tfaccel

    job_module = _job_module()
    x, y, (vx, vy) = job_module.data()
    reference = job_module.build()  # stands for the chief's model at its first checkpoint
    path = tf.train.Checkpoint(model=reference).write(str(tmp_path / "ckpt-1"))
    (tmp_path / evaluator.PROGRESS_FILE).write_text(json.dumps({"chief": "localhost:4000", "checkpoints": [path],
                                                                 "done": True, **_job()}))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": _task().spec.roles,
                                                "task": {"type": "evaluator", "index": 0}}))
    result = tfaccel.compile_and_fit(job_module.build, (x, y), validation_data=(vx, vy), strategy="default",
                                     checkpoint_dir=str(tmp_path), epochs=2, global_batch_size=32)
    expected = reference.evaluate(vx, vy, verbose=0, return_dict=True)
    assert result.steps == 0 and [e["epoch"] for e in result.details["evaluations"]] == [1]
    np.testing.assert_allclose(result.history["val_loss"], [expected["loss"]], rtol=1e-6)
    assert result.plan.notes[-1].startswith("this task is the side-car evaluator")
