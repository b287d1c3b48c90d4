"""Optimizer-state sharding (ZeRO-1, tfaccel.train.zero): on 2 and 4 mirrored virtual CPUs, tfaccel.fit with
shard_optimizer_state=True trains what plain model.fit trains on one device (Adam with a schedule, AdamW, SGD with
Nesterov momentum and clipnorm, RMSprop with global_clipnorm), each device holds ~1/N of the optimizer state, and
what it cannot train exactly is refused before training, with the reason and the fix."""

import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness
import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.train.request import FitRequest
from tfaccel.memory.shards import partition_by_bytes, shard_loads
from tfaccel.train.zero import shard_optimizer_state

PROGRAM = Path(__file__).resolve().parent / "zero_program.py"
SHARDED = ("adam_schedule", "adamw", "sgd_nesterov_clipnorm", "rmsprop_global_clipnorm", "adam_keras_loop")
SLOTS = {"adam_schedule": 2, "adamw": 2, "sgd_nesterov_clipnorm": 1, "rmsprop_global_clipnorm": 1, "adam_keras_loop": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process per replica count (2 and 4 virtual CPUs), both at once, every optimizer case in each."""
    out = tmp_path_factory.mktemp("zero")
    env = {**harness.CHILD_ENV, "PYTHONPATH": str(harness.REPO_ROOT)}
    procs = {n: subprocess.Popen([sys.executable, str(PROGRAM), str(n), str(out / f"{n}.json")], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (2, 4)}
    results = {}
    try:
        for n, proc in procs.items():
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
            results[n] = json.loads((out / f"{n}.json").read_text())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("case", SHARDED)
def test_sharded_training_equals_plain_fit(runs, replicas, case):
    run = runs[replicas][case]
    assert run["note"].endswith(f"state sharded over {replicas} replicas (ZeRO-1: each variable's slots on one "
                                "owner, gradients reduced to it, its update copied to every replica); asked for "
                                "(shard_optimizer_state=True)")
    assert run["note"] in run["plan_notes"]  # the plan says it, and why
    assert run["history"].keys() == run["plain_history"].keys()
    for key, values in run["plain_history"].items():
        np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
    for got, want in zip(run["weights"], run["plain_weights"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for copies in run["copies"]:  # every replica's copy of every variable is the same
        assert all(np.array_equal(copies[0], c) for c in copies[1:])
    assert run["iterations"] == run["plain_iterations"] == 16
    assert run["loop"] == ("keras_fit" if case == "adam_keras_loop" else "multi_step")  # both loops shard


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("case", SHARDED)
def test_each_device_holds_its_share_of_the_slots(runs, replicas, case):
    run = runs[replicas][case]
    slot_bytes = [size * SLOTS[case] for size in run["slot_sizes"]]
    held = sorted(run["held"].values())
    assert len(held) == replicas and run["details_bytes"] == run["held"]
    scalars = 8 * 4  # the iteration counter and the rate, mirrored: a few bytes on every device
    ideal = sum(slot_bytes) / replicas
    for per_device in held:  # 1/N of the whole, within one variable's slots (greedy by bytes)
        assert abs(per_device - ideal) <= max(slot_bytes) + scalars, (held, ideal)
    assert sum(held) <= sum(slot_bytes) + replicas * scalars  # no slot held twice


@pytest.mark.parametrize("replicas", [2, 4])
def test_the_memory_estimate_predicts_each_devices_share(runs, replicas):
    run = runs[replicas]["adamw"]
    assert sorted(run["estimate"]) == sorted(run["held"].values())


def test_unsharded_run_holds_every_slot_on_every_device(runs):
    """The control: the same measurement catches mirrored slots (what sharding removes)."""
    run = runs[2]["adam_unsharded"]
    full = 2 * sum(run["slot_sizes"])
    assert run["note"] is None and all(v >= full for v in run["held"].values())
    np.testing.assert_allclose(run["history"]["loss"], run["plain_history"]["loss"], rtol=1e-5)


@pytest.mark.parametrize("replicas", [2, 4])
def test_an_embedding_table_stays_unsharded_and_trains_as_plain_fit(runs, replicas):
    """The table's gradient is sparse (IndexedSlices): Keras' own update on every replica, the Dense layers sharded."""
    run = runs[replicas]["embedding"]
    assert re.search(r"\(ZeRO-1: .*\); left unsharded \(Embedding tables, whose gradients are sparse: Keras' own "
                     r"all-reduce and update on every replica, replicated slots\): \S*/embedding\w*/embeddings; asked for",
                     run["note"]), run["note"]
    for key, values in run["plain_history"].items():
        np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
    for got, want in zip(run["weights"], run["plain_weights"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for copies in run["copies"]:
        assert all(np.array_equal(copies[0], c) for c in copies[1:])
    table = 2 * 50 * 8 * 4  # Adam's two slots of the 50 x 8 table, on every device
    assert all(held >= table for held in run["held"].values())
    assert sorted(run["estimate"]) == sorted(run["held"].values())  # the estimate counts the table on every device


def test_cli_flag_trains_sharded(runs):
    assert runs[2]["cli_rc"] == 0
    summary = runs[2]["cli"]
    assert summary["replicas"] == 2 and summary["optimizer_state"].startswith("optimizer Adam: state sharded over 2")
    assert len(summary["optimizer_state_bytes"]) == 2


def test_partition_is_greedy_by_bytes_and_deterministic():
    assert partition_by_bytes([400, 16, 400, 8], 2) == [0, 0, 1, 1]
    assert partition_by_bytes([5, 5, 5], 4) == [0, 1, 2]
    sizes = [int(s) for s in np.random.RandomState(0).randint(1, 10_000, 50)]
    owners = partition_by_bytes(sizes, 4)
    assert owners == partition_by_bytes(sizes, 4)
    loads = [sum(s for s, o in zip(sizes, owners) if o == r) for r in range(4)]
    assert max(loads) - min(loads) <= max(sizes)
    assert shard_loads(sizes, 4) == loads and shard_loads([400, 16, 400, 8], 2) == [416, 408]


def test_the_keras_and_tf_internals_it_uses_are_there():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from tensorflow.python.distribute import numpy_dataset

    for name in ("_backend_update_step", "_var_key", "_clip_gradients", "add_variable_from_reference", "update_step"):
        assert callable(getattr(TFOptimizer, name)), name
    assert numpy_dataset.SingleDevice("/cpu:0").device == "/cpu:0"
    from tensorflow.python.distribute.collective_all_reduce_strategy import CollectiveAllReduceExtended

    assert "self._id_in_cluster = " in inspect.getsource(CollectiveAllReduceExtended)  # this worker's first replica


def _compiled(optimizer=None, layers=None, model_class=None, policy=None):
    import keras

    if policy:
        keras.mixed_precision.set_dtype_policy(policy)
    try:
        with tfaccel.scope(strategy="mirrored"):
            inputs = keras.Input((4,), dtype="int32" if layers else "float32")
            outputs = keras.layers.Dense(1)(keras.layers.Flatten()(layers(inputs)) if layers else inputs)
            model = (model_class or keras.Model)(inputs, outputs)
            model.compile(optimizer or keras.optimizers.Adam(), "mse")
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    return model


def _custom_step_class():
    import keras

    class OwnStep(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    return OwnStep


@pytest.mark.parametrize("make,accumulation,message", [
    (lambda k: _compiled(k.optimizers.LossScaleOptimizer(k.optimizers.Adam())), 1,
     r"LossScaleOptimizer \(mixed_float16\): loss scaling is not sharded yet; use precision='float32'"),
    (lambda k: _compiled(policy="mixed_bfloat16"), 1, r"'mixed_bfloat16' dtype policy; sharding is tested for float32"),
    (lambda k: _compiled(), 2, r"gradient accumulation \(2 micro-batches\) is not sharded yet; use "
                               r"gradient_accumulation_steps=1"),
    (lambda k: _compiled(k.optimizers.SGD(gradient_accumulation_steps=3)), 1, r"gradient accumulation \(3 micro"),
    (lambda k: _compiled(k.optimizers.Adam(use_ema=True)), 1, r"Adam\(use_ema=True\): the moving averages"),
    (lambda k: _compiled(k.optimizers.Adam(global_clipnorm=1.0), layers=k.layers.Embedding(10, 2)), 1,
     r"global_clipnorm=1.0 with the Embedding table\(s\) of embedding.* left unsharded \(sparse gradients\).*; "
     r"use clipnorm"),
    (lambda k: _compiled(model_class=_custom_step_class()), 1, r"OwnStep has its own train_step"),
])
def test_what_is_not_exact_is_refused(make, accumulation, message, clean_tf_config, cpu_replicas):
    import keras

    with pytest.raises(ConfigError, match="^shard_optimizer_state=True: .*" + message):
        shard_optimizer_state(make(keras), True, accumulation_steps=accumulation)
    with pytest.raises(ConfigError, match="shard_optimizer_state=False"):  # the fix names the way out
        shard_optimizer_state(make(keras), True, accumulation_steps=accumulation)


def test_other_strategies_and_built_optimizers_are_refused(clean_tf_config, cpu_replicas):
    import keras
    import tensorflow as tf

    with tf.distribute.get_strategy().scope():
        alone = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        alone.compile("adam", "mse")
    with pytest.raises(ConfigError, match=r"under mirrored and multi_worker only for now; this job runs under "
                                          r"_DefaultDistributionStrategy with 1 replica\(s\)"):
        shard_optimizer_state(alone, True, accumulation_steps=1)
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        one = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        one.compile("adam", "mse")
    with pytest.raises(ConfigError, match="there is one replica, so nothing to shard"):
        shard_optimizer_state(one, True, accumulation_steps=1)
    built = _compiled()
    with built.distribute_strategy.scope():
        built.optimizer.build(built.trainable_variables)
    with pytest.raises(ConfigError, match=r"optimizer Adam is already built with a full copy of its slots"):
        shard_optimizer_state(built, True, accumulation_steps=1)
    assert shard_optimizer_state(built, False, accumulation_steps=1) is None


def test_auto_shards_only_when_the_estimate_exceeds_the_device(clean_tf_config, cpu_replicas):
    from tfaccel.compat.keras_zero import is_sharded

    model = _compiled()
    off = shard_optimizer_state(model, "auto", accumulation_steps=1, batch_size=8)  # CPU: no device memory size
    assert off == ("optimizer state not sharded: auto: off, the replicas' devices report no memory size (CPU "
                   "replicas share the host's memory)") and not is_sharded(model.optimizer)
    roomy = shard_optimizer_state(model, "auto", accumulation_steps=1, batch_size=8, device_memory_bytes=2**40)
    assert re.fullmatch(r"optimizer state not sharded: auto: off, one replica needs [\d,]+ bytes by tfaccel memory's "
                        r"estimate, within its device's 1,099,511,627,776 bytes", roomy)
    assert not is_sharded(model.optimizer)
    tight = shard_optimizer_state(model, "auto", accumulation_steps=1, batch_size=8, device_memory_bytes=16)
    assert re.fullmatch(r"optimizer Adam: state sharded over 2 replicas \(ZeRO-1: .*\); auto: on, one replica needs "
                        r"[\d,]+ bytes by tfaccel memory's estimate, more than its device's 16 bytes", tight)
    assert is_sharded(model.optimizer)
    with pytest.raises(ConfigError, match=r"^shard_optimizer_state=True: gradient accumulation"):  # auto refuses too
        shard_optimizer_state(_compiled(), "auto", accumulation_steps=2, batch_size=8, device_memory_bytes=16)


def test_auto_stays_off_on_cpus_and_outside_mirrored(clean_tf_config, cpu_replicas):
    import keras
    import tensorflow as tf

    with tf.distribute.get_strategy().scope():
        alone = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        alone.compile("adam", "mse")
    assert shard_optimizer_state(alone, "auto", accumulation_steps=1, device_memory_bytes=2**10) == (
        "optimizer state not sharded: auto: off, sharding needs a mirrored or multi_worker strategy over several "
        "replicas (this job: _DefaultDistributionStrategy, 1 replica(s))")
    model = _compiled()
    x, y = np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32")
    result = tfaccel.fit(model, x, y, batch_size=4, verbose=0, shard_optimizer_state="auto")
    assert result.details["optimizer_state"].startswith("optimizer state not sharded: auto: off, the replicas' "
                                                        "devices report no memory size")
    assert result.details["optimizer_state"] in result.plan.notes
    assert "optimizer_state_bytes" not in result.details


def test_bad_values_are_refused_before_training():
    with pytest.raises(ConfigError, match=r"shard_optimizer_state: unknown value 'yes'; valid values are: 'False', "
                                          r"'True', 'auto'"):
        FitRequest.from_fit(shard_optimizer_state="yes")
    with pytest.raises(ConfigError, match="shard_optimizer_state"):
        FitRequest.from_fit(shard_optimizer_state=1)


def test_cli_refuses_sharding_on_one_device(clean_tf_config, capsys):
    from tfaccel.cli.main import main

    rc = main(["fit", "--model", "mnist_cnn", "--dataset", "digits", "--epochs", "1", "--num-examples", "64",
               "--strategy", "default", "--shard-optimizer-state"])
    assert rc == 2
    assert "tfaccel fit: error: shard_optimizer_state=True: tfaccel shards optimizer state under mirrored and " \
           "multi_worker only" in capsys.readouterr().err


def test_cli_auto_trains_unsharded_on_one_device_and_says_why(clean_tf_config, capsys, tmp_path):
    from tfaccel.cli.main import main

    summary = tmp_path / "summary.json"
    rc = main(["fit", "--model", "mnist_cnn", "--dataset", "digits", "--epochs", "1", "--num-examples", "64",
               "--strategy", "default", "--shard-optimizer-state", "auto", "--json-out", str(summary)])
    assert rc == 0
    note = json.loads(summary.read_text())["optimizer_state"]
    assert note.startswith("optimizer state not sharded: auto: off, sharding needs a mirrored or multi_worker")
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model", "mnist_cnn", "--shard-optimizer-state", "yes"])
    assert exit_.value.code == 2
    assert "argument --shard-optimizer-state: invalid choice: 'yes' (choose from 'auto')" in capsys.readouterr().err


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory):
    """Two multi_worker processes (one CPU each, loopback), every optimizer case sharded over them, then a sharded
    job stopped, its backup kept (``kept``) and resumed, and the resumed model saved (``model.keras``)."""
    work = tmp_path_factory.mktemp("zero-workers")
    results = harness.run_tasks(Path(__file__).resolve().parent / "zero_workers_program.py", workers=2, timeout=240,
                                args=[str(work)], env={"TFACCEL_JOB_ID": "zero-workers"})
    harness.assert_all_ok(results)
    return [{**harness.last_json_line(r.stdout), "work": work} for r in results]


@pytest.mark.parametrize("case", SHARDED[:4])
def test_sharded_over_two_workers_equals_plain_fit(worker_runs, case):
    for run in (w[case] for w in worker_runs):
        for key, values in run["plain_history"].items():
            np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
        for got, want in zip(run["weights"], run["plain_weights"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    held = [w[case]["bytes"] for w in worker_runs]
    full = worker_runs[0][case]["full_bytes"]
    assert sum(held) <= full + 2 * 16 and max(held) < 0.7 * full, (held, full)  # each worker holds its share only


def test_checkpoint_dir_under_sharded_multi_worker_is_refused(worker_runs):
    for w in worker_runs:
        assert "checkpoint_dir" in w["checkpoint_dir_refusal"] and "only the writing worker's" in \
            w["checkpoint_dir_refusal"] and "keep backup_dir" in w["checkpoint_dir_refusal"], w["checkpoint_dir_refusal"]


def _close(got, want, atol=1e-5):
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a, "float64"), np.asarray(b, "float64"), rtol=0, atol=atol)


def test_each_worker_backs_up_its_shard_and_the_resumed_job_trains_on_exactly(worker_runs):
    """The sharded Adam-with-schedule fit, stopped at epoch 1 step 5 (8 steps an epoch) with a backup every 3 steps:
    the backup at step 11 has one shard file per worker, named by the pointer with the owners; the resumed run (its
    weights and history checked against plain fit by test_sharded_over_two_workers_equals_plain_fit) ends within
    1e-5 of the uninterrupted run's weights (with the shards left unread, measured: 0.027 apart)."""
    for w in worker_runs:
        run = w["resume"]
        shards = run["pointer"]["optimizer_shards"]
        assert (run["pointer"]["epoch"], run["pointer"]["step"], run["pointer"]["global_step"]) == (1, 3, 11)
        assert shards["count"] == shards["processes"] == 2 and sorted(set(shards["owners"])) == [0, 1]
        assert shards["files"] == ["backup-11.shard-0-of-2.npz", "backup-11.shard-1-of-2.npz"]
        assert set(shards["files"]) | {"backup-11.weights.h5"} <= set(run["left"])
        assert run["resumed_from"] == [1, 3]
        _close(w["adam_schedule"]["weights"], w["adam_schedule"]["plain_weights"])
    assert not (worker_runs[0]["work"] / "backup").exists()  # the finished job removed it, shards included


def test_a_keras_file_of_sharded_state_loads_in_plain_keras_with_every_slot(worker_runs):
    """model.save on every worker: the chief's .keras file names plain Keras' Adam and holds every slot, each equal
    to the uninterrupted plain fit's."""
    run = worker_runs[0]["resume"]
    assert run["loaded_class"] == "keras.src.optimizers.adam.Adam"
    assert [np.shape(v) for v in run["loaded_state"]] == [np.shape(v) for v in run["plain_state"]]
    _close(run["loaded_state"], run["plain_state"])
    _close(run["loaded_weights"], worker_runs[0]["adam_schedule"]["weights"], atol=0)


def _resume_model():
    """zero_workers_program.py's model, data and Adam with a schedule, under this process's mirrored strategy."""
    import keras

    rng = np.random.RandomState(0)
    x = rng.randn(256, 8).astype("float32")
    y = (x @ rng.randn(8, 3)).astype("float32")
    keras.utils.set_random_seed(1)
    with tfaccel.scope(strategy="mirrored"):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model.compile(keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 3, 0.9)), "mse")
    return model, x, y


def test_a_backup_of_two_workers_shards_resumes_on_one_process(worker_runs, clean_tf_config, cpu_replicas, tmp_path):
    """Another layout: the 2-worker backup (two shard files) resumed on this process's 2 mirrored replicas, which
    hold every slot between them: it ends with the uninterrupted run's weights; a mirrored backup keeps every slot
    in its weights file (no shard files) and records the layout."""
    import keras

    backup = tmp_path / "backup"
    shutil.copytree(worker_runs[0]["work"] / "kept", backup)
    model, x, y = _resume_model()
    seen = []

    class Pointer(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append({**json.loads((backup / "tfaccel_backup.json").read_text()),
                         "left": sorted(p.name for p in backup.iterdir())})

    result = tfaccel.fit(model, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, loop="keras", seed=0,
                         shard_optimizer_state=True, backup_dir=str(backup), backup_freq=3, callbacks=[Pointer()])
    assert result.resumed_from == (1, 3)
    _close(model.get_weights(), worker_runs[0]["adam_schedule"]["plain_weights"])
    shards = seen[-1]["optimizer_shards"]
    assert shards["count"] == 2 and shards["processes"] == 1 and shards["files"] == []
    assert shards["owners"] == worker_runs[0]["resume"]["pointer"]["optimizer_shards"]["owners"]  # same rule
    assert [n for n in seen[-1]["left"] if n.endswith(".npz")] == []  # the 2 workers' shards removed, none written


def test_what_does_not_fit_a_sharded_backup_is_refused_with_the_fix(clean_tf_config, cpu_replicas, tmp_path, caplog):
    """Each message of tfaccel.resilience.shard_backup and of the sharded optimizer's loading, on a sharded
    mirrored model: a shard the pointer names but the directory lacks, a shard backup for an unsharded optimizer, an
    unreadable shard, a slot in no shard, a worker that could not write its shard, and a weights file written with
    its slots apart loaded outside tfaccel's backups."""
    import keras

    from tfaccel.compat.keras_zero import slots_apart
    from tfaccel.resilience.backups import StepBackup, read_backup
    from tfaccel.resilience.shard_backup import agree_written, load_shards, loading_context

    model, _, _ = _resume_model()
    shard_optimizer_state(model, True, accumulation_steps=1)
    with model.distribute_strategy.scope():
        model.optimizer.build(model.trainable_variables)
    (tmp_path / "backup-3.weights.h5").write_bytes(b"")
    pointer = {"epoch": 0, "step": 3, "weights": "backup-3.weights.h5",
               "optimizer_shards": {"count": 2, "processes": 2, "owners": [0], "files": ["backup-3.shard-0-of-2.npz"]}}
    (tmp_path / "tfaccel_backup.json").write_text(json.dumps(pointer))
    with pytest.raises(ConfigError, match=r"names the optimizer shard\(s\) backup-3.shard-0-of-2.npz, which are "
                                          r"missing; restore them, or remove the directory"):
        read_backup(str(tmp_path))
    (tmp_path / "backup-3.shard-0-of-2.npz").write_bytes(b"not a shard")
    state = read_backup(str(tmp_path))
    plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    plain.compile("adam", "mse")
    with pytest.raises(ConfigError, match=r"holds optimizer state sharded over 2 workers \(one shard file each\); "
                                          r"this job's optimizer Adam is not sharded. Resume with shard_optimizer_st"):
        loading_context(plain, state, backup_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"the optimizer shard backup-3.shard-0-of-2.npz is unreadable"):
        load_shards(model, state, backup_dir=str(tmp_path))
    first = next(i for i, v in enumerate(model.optimizer.variables) if tuple(v.shape) == (8, 32))  # a kernel's slot
    np.savez(tmp_path / "backup-3.shard-0-of-2.npz", **{str(first): np.zeros((5,), "float32")})
    with pytest.raises(ConfigError, match=r"do not fit this optimizer: adam\w*/\w*dense\w*_kernel_momentum: shape "
                                          r"\(5,\) in its shard, \(8, 32\) here; adam\w*/.*: in no shard"):
        load_shards(model, state, backup_dir=str(tmp_path))
    with pytest.raises(OSError, match=r"1 of 2 workers could not write their shard of backup-3.weights.h5"):
        agree_written(lambda mine: mine + 0.0, written=True, processes=2, backup_dir="b", name="backup-3.weights.h5")
    backup = StepBackup(str(tmp_path / "tfaccel_backup.json"), save_freq=3, is_chief=True, steps_per_epoch=8)
    backup.set_model(model)
    backup._total = float  # one process: the sum over the workers is its own
    with pytest.raises(OSError, match=r"1 of 1 workers could not write their shard"):
        backup._save_apart("backup-3.weights.h5", 3)  # its backup_dir is a file
    assert "this worker's part of backup-3.weights.h5 was not written" in caplog.text
    apart = str(tmp_path / "apart.weights.h5")
    with slots_apart(model.optimizer):
        model.save_weights(apart)
    with pytest.raises(ValueError, match=r"is saved with shape \(0,\), not \(8, 32\): a file written with its "
                                         r"slots apart \(a tfaccel backup of sharded state\) loads through tfaccel"):
        model.load_weights(apart)
