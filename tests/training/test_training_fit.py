"""compile_and_fit on every strategy, learning a real small task (the 8x8 digits, tfaccel.datasets)."""

import json
import os
import sys

import numpy as np
import pytest

import harness
import tfaccel
from tfaccel.datasets import load_dataset
from tfaccel.errors import ConfigError

SCRIPT = harness.REPO_ROOT / "tests" / "training" / "scripts" / "fit_job.py"
TARGET_ACCURACY = 0.90  # digits, 3 epochs of a 32-unit MLP: ~0.95 on the held-out split
PS_TARGET_ACCURACY = 0.85  # parameter_server, 4 epochs of asynchronous updates: 0.90-0.95 measured


def build():
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", split="train"), load_dataset("digits", split="test")


@pytest.mark.parametrize("strategy,replicas", [("default", 1), ("one_device", 1), ("mirrored", 2)])
def test_in_process_strategies_learn_digits(strategy, replicas, digits, clean_tf_config, cpu_replicas):
    (x, y), (xv, yv) = digits
    result = tfaccel.compile_and_fit(build, (x, y), validation_data=(xv, yv), epochs=3, global_batch_size=64,
                                     strategy=strategy, loss="sparse_categorical_crossentropy",
                                     metrics=["accuracy"], learning_rate=0.01, seed=0, verbose=0)
    assert result.plan.strategy == strategy and result.plan.num_replicas == replicas
    assert result.history["val_accuracy"][-1] >= TARGET_ACCURACY, result.history
    assert len(result.history["loss"]) == 3 and result.history["loss"][-1] < result.history["loss"][0]
    assert result.steps == 3 * result.steps_per_epoch and result.examples_per_sec > 0
    # The compiled rate is used as given on every strategy (scaling by replicas is opt-in: scale_learning_rate=).
    assert result.details["learning_rate"] == "learning rate as compiled"
    import keras

    assert float(keras.ops.convert_to_numpy(result.model.optimizer.learning_rate)) == pytest.approx(0.01)


def test_checkpoints_appear_only_where_specified(tmp_path, digits, clean_tf_config):
    (x, y), _ = digits
    ckpt = tmp_path / "ckpt"
    before = set(os.listdir(tmp_path))
    result = tfaccel.compile_and_fit(build, (x[:256], y[:256]), epochs=2, global_batch_size=64, strategy="default",
                                     loss="sparse_categorical_crossentropy", checkpoint_dir=str(ckpt), verbose=0)
    assert set(os.listdir(tmp_path)) - before == {"ckpt"}
    assert len(result.details["checkpoints"]) == 2
    import tensorflow as tf

    assert tf.train.latest_checkpoint(str(ckpt)).endswith("ckpt-2")


def test_gradient_accumulation_and_clipping_through_compile_and_fit(digits, clean_tf_config, cpu_replicas):
    (x, y), (xv, yv) = digits
    result = tfaccel.compile_and_fit(build, (x, y), validation_data=(xv, yv), epochs=3, global_batch_size=32,
                                     strategy="mirrored", gradient_accumulation_steps=2, global_clipnorm=5.0,
                                     loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                                     learning_rate=0.01, seed=0, verbose=0)
    assert result.history["val_accuracy"][-1] >= TARGET_ACCURACY
    import keras

    updates = int(keras.ops.convert_to_numpy(result.model.optimizer.iterations))
    assert updates == 3 * result.steps_per_epoch // 2


def _calls():
    calls = []

    def counted():
        calls.append(1)
        return build()

    return calls, counted


@pytest.mark.parametrize("kwargs,message", [
    ({"global_batch_size": 64, "per_replica_batch_size": 16}, "disagrees with per_replica_batch_size"),
    ({"epochs": 0}, r"epochs must be a whole number >= 1; received 0"),
    ({"steps_per_execution": "fast"}, r"steps_per_execution must be 'auto' or a whole number >= 1; received 'fast'"),
    ({"strategy": "mirroredd"}, r"mirroredd"),
    ({"optimizer": "adamm"}, r"optimizer: unknown value 'adamm'"),
    ({"verbose": 3}, r"verbose: unknown value 3"),
    ({"callbacks": "tb"}, r"callbacks must be a list of keras callbacks"),
    ({"warmup_epochs": -1}, r"warmup_epochs must be a number >= 0; received -1"),
    ({"loss": None}, r"loss is required"),
    ({"backup_freq": 0}, r"backup_freq must be None or a whole number >= 1; received 0"),
    ({"epochz": 3}, r"compile_and_fit: got an unexpected keyword argument 'epochz'; the options it passes to "
                    r"tfaccel.fit are: .*initial_epoch.*gradient_accumulation_steps"),
])
def test_bad_combinations_fail_before_training(kwargs, message, clean_tf_config):
    x, y = np.zeros((64, 8, 8, 1), "float32"), np.zeros(64, "int64")
    args = {"loss": "sparse_categorical_crossentropy", "strategy": "default", "verbose": 0}
    args.update(kwargs)
    calls, counted = _calls()
    with pytest.raises(ConfigError, match=message):
        tfaccel.compile_and_fit(counted, (x, y), **args)
    if "loss" not in kwargs:
        assert calls == []  # nothing was built, nothing trained


def test_non_callable_build_model(clean_tf_config):
    with pytest.raises(ConfigError, match=r"build_model must be a callable .* Pass the function, not its result"):
        tfaccel.compile_and_fit(build(), (np.zeros((4, 8, 8, 1)), np.zeros(4)), loss="mse")


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batched_dataset_with_global_batch_is_refused(drop_remainder, clean_tf_config):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.zeros((64, 8, 8, 1), "float32"), np.zeros(64)))
    ds = ds.batch(8, drop_remainder=drop_remainder).prefetch(1)  # drop_remainder: a static batch dimension
    calls, counted = _calls()
    with pytest.raises(ConfigError, match="already batched"):
        tfaccel.compile_and_fit(counted, ds, global_batch_size=32, loss="mse", strategy="default")
    assert calls == []


def test_batched_dataset_used_as_given(digits, clean_tf_config):
    import tensorflow as tf

    (x, y), _ = digits
    ds = tf.data.Dataset.from_tensor_slices((x[:256], y[:256])).batch(32)
    result = tfaccel.compile_and_fit(build, ds, loss="sparse_categorical_crossentropy", strategy="default",
                                     verbose=0, steps_per_epoch=8)
    assert result.global_batch_size is None and "used as given" in result.details["data"]


def test_multi_worker_two_processes_identical_weights_and_history(tmp_path):
    ckpt = tmp_path / "ckpt"
    results = harness.run_tasks(SCRIPT, workers=2, timeout=300,
                                env={"FIT_STRATEGY": "auto", "FIT_CHECKPOINT_DIR": str(ckpt), "FIT_EPOCHS": "3"})
    harness.assert_all_ok(results)
    a, b = (harness.last_json_line(r.stdout) for r in results)
    assert a["strategy"] == b["strategy"] == "multi_worker" and a["replicas"] == 2
    assert a["digest"] == b["digest"]  # identical weights
    assert a["history"]["loss"] == b["history"]["loss"]  # identical loss history
    assert a["history"]["val_accuracy"][-1] >= TARGET_ACCURACY
    assert a["details"]["learning_rate"] == "learning rate as compiled"  # not scaled by the 2 replicas
    # tfaccel's multi-step loop (Keras 3.15's own fails under MWMS): every batch of an epoch in one call.
    assert a["details"]["loop"].startswith("tfaccel's multi-step loop: 23 steps of the model's train_step per call")
    assert a["details"]["steps_per_execution"] == "23 (auto: min(steps/epoch=23, 64))"
    # Only the chief (worker 0) keeps checkpoints; worker 1's temporary directories are gone.
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("ckpt-3"))
    assert not any(p.name.startswith("tfaccel-worker-ckpt-") for p in tmp_path.iterdir())


def test_parameter_server_exact_steps_and_learns(tmp_path):
    """chief (coordinator) + 2 workers + 1 ps, started by tfaccel's launcher as a user would."""
    from tfaccel.launch import run_local

    result = run_local([sys.executable, str(SCRIPT)], workers=2, ps=1, timeout=300, echo=False,
                       env={"FIT_STRATEGY": "auto", "FIT_EPOCHS": "4", "FIT_CHECKPOINT_DIR": str(tmp_path / "c"),
                            "PYTHONPATH": str(harness.REPO_ROOT)})
    harness.STARTED_PIDS.extend(result.pids)  # the leftover-process fixture checks them too
    chief = result.task("chief:0")
    assert result.returncode == 0, f"{result.message}\n{chief.stderr[-3000:]}"
    report = harness.last_json_line(chief.stdout)
    assert report["strategy"] == "parameter_server"
    steps_per_epoch = -(-1437 // 64)  # digits train split: 22 whole batches + the partial one, as Keras fit
    assert report["steps"] == 4 * steps_per_epoch  # exact, although 2 workers update concurrently
    assert report["details"]["optimizer_iterations"] == 4 * steps_per_epoch
    # Asynchronous updates from 2 workers are noisier than synchronous training: a lower stated bar.
    assert report["history"]["val_accuracy"][-1] >= PS_TARGET_ACCURACY, report["history"]
    assert (tmp_path / "c" / "checkpoint").exists()


def test_killed_mid_epoch_resumes_from_backup_with_same_result(tmp_path):
    """A single process SIGKILLed at epoch 1, step 7 resumes from the step-5 backup (or the epoch end's, when the
    step-5 one was still being written) and ends with the same weights as an uninterrupted run (data order is a
    function of (seed, epoch))."""
    base = {"FIT_STRATEGY": "default", "FIT_EPOCHS": "3", "FIT_BACKUP_FREQ": "5", "FIT_SPE": "1"}
    ref = harness.run_tasks(SCRIPT, tasks=[("local", 0, None)], timeout=200,
                            env={**base, "FIT_BACKUP_DIR": str(tmp_path / "ref_backup"),
                                 "FIT_WEIGHTS_OUT": str(tmp_path / "ref.npz")})
    harness.assert_all_ok(ref)
    reference = harness.last_json_line(ref[0].stdout)
    steps_per_epoch = reference["steps"] // 3
    job = {**base, "FIT_BACKUP_DIR": str(tmp_path / "backup"), "FIT_KILL_AT": "1:7",
           "FIT_KILL_MARKER": str(tmp_path / "killed"), "FIT_WEIGHTS_OUT": str(tmp_path / "resumed.npz")}
    first = harness.run_tasks(SCRIPT, tasks=[("local", 0, None)], timeout=200, env=job)
    assert first[0].returncode == -9
    state = json.loads((tmp_path / "backup" / "tfaccel_backup.json").read_text())
    # backups are written in the background: the step-5 one may still have been in flight at the kill, and then the
    # last complete backup is the epoch end's
    position = (state["epoch"], state["step"])
    assert position in ((1, 5), (1, 0)), position
    second = harness.run_tasks(SCRIPT, tasks=[("local", 0, None)], timeout=200, env=job)
    harness.assert_all_ok(second)
    resumed = harness.last_json_line(second[0].stdout)
    assert resumed["resumed_from"] == list(position)
    assert resumed["steps"] == (steps_per_epoch - position[1]) + steps_per_epoch
    ref_w, res_w = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "resumed.npz")
    for key in ref_w.files:
        np.testing.assert_allclose(res_w[key], ref_w[key], rtol=1e-5, atol=1e-6)
    assert not (tmp_path / "backup").exists()  # removed once training completed


def test_parameter_server_refuses_options_its_loop_cannot_honour(monkeypatch, clean_tf_config, tmp_path):
    """The message path only: the backend is swapped for a PS-shaped one (the real PS run is tested above)."""
    import tensorflow as tf

    import tfaccel.plan
    import tfaccel.train.scope
    from tfaccel.strategies.base import Backend

    real_resolve = tfaccel.plan.resolve_plan

    def ps_shaped(**kwargs):
        plan, _ = real_resolve(strategy="default")
        return plan, Backend(name="parameter_server", strategy=tf.distribute.get_strategy(), uses_keras_fit=False)

    monkeypatch.setattr(tfaccel.train.scope, "resolve_plan", ps_shaped)  # where scope() looks it up
    models = []

    def recorded():
        models.append(build())
        return models[-1]

    data = (np.zeros((64, 8, 8, 1), "float32"), np.zeros(64, "int64"))
    with pytest.raises(ConfigError, match=r"steps_per_execution=4: strategy parameter_server runs its steps in "
                                          r"closures scheduled on the workers by tfaccel's ClusterCoordinator loop"):
        tfaccel.compile_and_fit(recorded, data, loss="sparse_categorical_crossentropy", backup_dir=str(tmp_path),
                                backup_freq=5, tensorboard_dir="/tmp/t", steps_per_execution=4)
    # backup_dir is honoured (tests/training/test_ps_backup.py); what its loop cannot do is refused clearly.
    with pytest.raises(ConfigError, match=r"parameter_server: backup_freq=5 must be a multiple of "
                                          r"gradient_accumulation_steps=2: .* \(try backup_freq=4\)"):
        tfaccel.compile_and_fit(recorded, data, loss="sparse_categorical_crossentropy", backup_dir=str(tmp_path),
                                backup_freq=5, gradient_accumulation_steps=2, global_batch_size=8)
    (tmp_path / "backup-7.ckpt").mkdir()
    (tmp_path / "tfaccel_backup.json").write_text(json.dumps(
        {"epoch": 0, "step": 7, "global_step": 7, "weights": "backup-7.ckpt", "format": "tf.train.Checkpoint"}))
    with pytest.raises(ConfigError, match=r"the backup is at step 7 of epoch 0, but an epoch now has 2 steps in "
                                          r"updates of 1; the data, batch size or gradient_accumulation_steps changed"):
        tfaccel.compile_and_fit(recorded, data, loss="sparse_categorical_crossentropy", backup_dir=str(tmp_path),
                                global_batch_size=32)
    (tmp_path / "backup-7.weights.h5").write_bytes(b"h5")
    (tmp_path / "tfaccel_backup.json").write_text(json.dumps(
        {"epoch": 0, "step": 7, "global_step": 7, "weights": "backup-7.weights.h5"}))
    with pytest.raises(ConfigError, match=r"holds backup-7.weights.h5, a backup of the Keras training path"):
        tfaccel.compile_and_fit(recorded, data, loss="sparse_categorical_crossentropy", backup_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"parameter_server backend has no ClusterCoordinator"):
        tfaccel.compile_and_fit(recorded, data, loss="sparse_categorical_crossentropy")
    # compile_and_fit builds in the scope, then fit refuses before the first step: nothing trained.
    assert len(models) == 5 and all(int(m.optimizer.iterations.numpy()) == 0 for m in models)
    monkeypatch.undo()
    with tfaccel.scope(strategy="default"):  # the default strategy's plan is the real one again for later tests
        pass


def _front_end(argv, timeout=240):
    import subprocess

    env = {**harness.CHILD_ENV, "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(harness.REPO_ROOT)}
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(harness.REPO_ROOT))
    return proc


def test_tfaccel_fit_cli_states_what_it_trained():
    """`tfaccel fit` (the README's first command, one process here): the rate as given by default (opt-in, as in
    tfaccel.fit), `--scale-learning-rate linear` scales it; jit is what the model trained with."""
    common = ["-m", "tfaccel", "fit", "--model", "mnist_cnn", "--dataset", "digits", "--epochs", "1",
              "--num-examples", "256", "--strategy", "default", "--json"]
    proc = _front_end(common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["strategy"] == "default" and summary["global_batch_size"] == 32 and summary["steps"] == 8
    assert summary["learning_rate"] == "learning rate as compiled"
    assert summary["jit_compile"] is False  # convolutions on CPU: "auto" keeps XLA off for this model
    assert "tfaccel INFO: trained 8 steps" in proc.stderr and "DEBUG" not in proc.stderr  # one line per job
    proc = _front_end(common + ["--scale-learning-rate", "linear", "--per-replica-batch-size", "64",
                                "--base-batch-size", "32", "--verbose"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tfaccel DEBUG: plan: strategy default (1 replica; requested explicitly)" in proc.stderr  # the details
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["plan"]["strategy"] == "default" and summary["plan"]["jit_reason"]
    assert summary["learning_rate"] == "linear: x2 (global batch 64 / base batch 32)"
    assert summary["global_batch_size"] == 64
    bad = _front_end(common + ["--scale-learning-rate", "cubic"], timeout=120)
    assert bad.returncode == 2 and "--scale-learning-rate: invalid choice: 'cubic'" in bad.stderr


def test_scripts_train_py_runs_the_same_job():
    proc = _front_end([str(harness.REPO_ROOT / "scripts" / "train.py"), "--model", "mnist_cnn", "--epochs", "1",
                       "--num_examples", "128", "--strategy", "default", "--scale_learning_rate", "sqrt",
                       "--base_batch_size", "8"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    line, summary = proc.stdout.strip().splitlines()[-2:]
    assert line.startswith("tfaccel fit: mnist_cnn on digits: val_accuracy ") and "(default x1 replicas" in line
    assert json.loads(summary)["learning_rate"] == "sqrt: x2 (sqrt of 32 / 8)"
