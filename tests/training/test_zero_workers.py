"""Optimizer-state sharding (ZeRO-1) across worker processes: multi_worker with one CPU per worker, 2 and 4 real
processes on loopback. Each optimizer case sharded over them trains what plain model.fit trains on one device; each
step reduce-scatters the gradients to their owners and all-gathers the updated values (the bytes of one all-reduce,
counted from the tensors given to the collectives, ``tfaccel.compat.keras_zero_collective``); backups hold every
worker's shard, resume on another layout, and a .keras file saved at the end loads in plain Keras."""

import json
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

import harness
import zero_cases as zc
import tfaccel
from tfaccel.compat import keras_zero_collective
from tfaccel.compat.keras_zero import sharded_class
from tfaccel.compat.keras_zero_collective import (check_rows, densify, even_pieces, foldable, local_squares,
                                                   plan_buckets, rank_order)
from tfaccel.compat.keras_zero_ranks import shard_over_ranks
from tfaccel.errors import ConfigError
from tfaccel.memory.shards import partition_by_bytes, shard_loads
from tfaccel.train.zero import shard_optimizer_state, xla_fallback

PROGRAM = Path(__file__).resolve().parent / "zero_workers_program.py"
CASES = ("adam_schedule", "adamw", "sgd_nesterov_clipnorm", "rmsprop_global_clipnorm", "lamb", "adamw_ema",
         "adamw_accumulate")


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """``{2: [...], 4: [...]}``: each worker's results of the 2-worker launch (every optimizer case, then a sharded job
    stopped, its backup kept in ``kept`` and resumed, the resumed model saved as ``model.keras``) and of the 4-worker
    launch (every optimizer case), the two launched side by side."""
    work = {n: tmp_path_factory.mktemp(f"zero-{n}-workers") for n in (2, 4)}
    args = {2: [str(work[2])], 4: [str(work[4]), "parity"]}
    results = {}

    def launch(n):
        results[n] = harness.run_tasks(PROGRAM, workers=n, timeout=300, args=args[n],
                                       env={"TFACCEL_JOB_ID": f"zero-{n}-workers"})

    threads = [threading.Thread(target=launch, args=(n,)) for n in (2, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for n in (2, 4):
        harness.assert_all_ok(results[n])
    return {n: [{**harness.last_json_line(r.stdout), "work": work[n]} for r in results[n]] for n in (2, 4)}


@pytest.fixture(scope="module")
def worker_runs(launches):
    return launches[2]


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("case", CASES)
def test_sharded_over_workers_equals_plain_fit(launches, workers, case):
    plain = launches[workers][0][case]  # the chief's plain fit on one device
    for run in (w[case] for w in launches[workers]):
        for key, values in plain["plain_history"].items():
            np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
        for got, want in zip(run["weights"], plain["plain_weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    replicated = zc.replicated_bytes(case, plain["variable_bytes"])  # accumulation: on every worker
    held = [w[case]["bytes"] - replicated for w in launches[workers]]
    full = plain["full_bytes"] - (sum(plain["variable_bytes"]) if replicated else 0)  # Keras' accumulators out
    assert sum(held) <= full + workers * 16 and max(held) < 0.7 * full, (held, full)  # each holds its share only


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("case", ["embedding", "embedding_global_clipnorm", "embedding_unclipped"])
def test_an_embedding_table_stays_unsharded_over_workers_and_trains_as_plain_fit(launches, workers, case):
    """Every worker updates its full copy of the table with full slots, from the table's summed gradient; the Dense
    layers beside it are sharded; Adam with clipnorm, with global_clipnorm (the global norm over the sharded and
    unsharded gradients), and unclipped."""
    runs = [w[case] for w in launches[workers]]
    plain = runs[0]  # the chief's plain fit on one device
    assert re.search(r"over \d replicas \(ZeRO-1: .*\); left unsharded \(Embedding tables, .*\): \S*embedding\S*/"
                     r"embeddings; uneven: one replica holds [^;]*; asked for", plain["note"]), plain["note"]
    for run in runs:
        for key, values in plain["plain_history"].items():
            np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
        for got, want in zip(run["weights"], plain["plain_weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert run["slot_shapes"].count([50, 8]) == 2, run["slot_shapes"]  # Adam's m and v of the whole table
    kernels = [s for run in runs for s in run["slot_shapes"] if len(s) == 2 and s != [50, 8]]
    assert len(kernels) == 4, kernels  # each Dense kernel's m and v on one worker only
    # The table's sum: with global_clipnorm it rides in the sharded exchange (Keras densifies the slices there, and
    # its 400 elements are fewer than the Dense layers' 801), split evenly over the owners; with
    # clipnorm or unclipped (Keras' update reads the gathered slices) the strategy's own all-reduce gathers the slices.
    dense = [n for path, n in plain["variable_sizes"].items() if "embedding" not in path]
    table = even_pieces(400, workers) if case == "embedding_global_clipnorm" else [0] * workers
    chunk = max(load + piece for load, piece in zip(shard_loads(dense, workers), table))
    expected = {"all_to_all": {"calls": 1, "bytes_in": workers * (chunk + 1) * 4, "bytes_out": workers * (chunk + 1) * 4},
                "all_gather": {"calls": 1, "bytes_in": chunk * 4, "bytes_out": workers * chunk * 4}}
    if case == "embedding_global_clipnorm":
        expected["all_reduce"] = {"calls": 1, "bytes_in": 4, "bytes_out": 4}
    assert all(run["exchange"] == expected for run in runs), [run["exchange"] for run in runs]


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("case", CASES)
def test_a_step_moves_one_all_reduce_of_bytes(launches, workers, case):
    """Per step and worker: one all-to-all of one row per worker (the owner's share, padded to the largest share, and
    a tag), summed by its receiver (the reduce-scatter), and one all-gather of the owner's updated share; with
    global_clipnorm one scalar all-reduce more. Without padding, n * chunk is every gradient: the two move the bytes
    of one ring all-reduce of the gradients (each worker sends 2 (n - 1) / n of them)."""
    run = launches[workers][0][case]
    sizes = [b // 4 for b in run["variable_bytes"]]  # elements, float32
    chunk = max(shard_loads(sizes, workers))  # the largest owner's share, by the optimizer's own partition
    expected = {"all_to_all": {"calls": 1, "bytes_in": workers * (chunk + 1) * 4, "bytes_out": workers * (chunk + 1) * 4},
                "all_gather": {"calls": 1, "bytes_in": chunk * 4, "bytes_out": workers * chunk * 4}}
    if case == "rmsprop_global_clipnorm":
        expected["all_reduce"] = {"calls": 1, "bytes_in": 4, "bytes_out": 4}
    if case == "adamw_ema":  # the moving averages written to the weights (every 3rd step): the owners' shares again
        expected["all_gather_ema"] = expected["all_gather"]
    assert all(w[case]["exchange"] == expected for w in launches[workers]), [w[case]["exchange"] for w in launches[workers]]
    assert sum(sizes) <= workers * chunk < sum(sizes) + workers * max(sizes)


def test_buckets_are_per_dtype_in_owner_order_padded_to_the_largest_share():
    buckets = plan_buckets([(2, 3), (4,), (5,), (1,)], ["float32", "float32", "float64", "float32"], [1, 0, 0, 1], 2)
    assert [(b.dtype, b.members, b.chunk) for b in buckets] == [
        (tf.float32, ((1,), (0, 3)), 7), (tf.float64, ((2,), ()), 5)]
    assert buckets[0].sizes == (6, 4, 5, 1)


def test_a_table_gradient_is_folded_into_the_exchange_only_where_it_is_smaller_and_exact():
    """The sum of an unsharded variable's gradient rides in the sharded exchange where Keras' update would read that
    dense sum too (a dense gradient; slices under global_clipnorm, which Keras densifies) and the table is no larger
    than the sharded variables together (a bound every worker computes alike, whatever its share of the batch)."""
    table = tf.Variable(tf.zeros([50, 8]))
    slices = tf.IndexedSlices(tf.ones([3, 8]), tf.constant([1, 1, 4]), tf.constant([50, 8]))
    assert foldable(tf.zeros([50, 8]), table, exchanged=1, global_clipnorm=False)  # dense: the same sum
    assert foldable(slices, table, exchanged=400, global_clipnorm=True)  # 400 elements: at most doubles the rows
    assert not foldable(slices, table, exchanged=399, global_clipnorm=True)  # a larger table moves as slices
    assert not foldable(slices, table, exchanged=10**6, global_clipnorm=False)  # Keras' update reads the slices
    # why: Keras' Adam squares each slice (a row looked up twice: g1**2 + g2**2), and only global_clipnorm densifies
    variable = keras.Variable(np.ones((3, 2), np.float32))
    two_rows = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([1, 1]), tf.constant([3, 2]))
    for clip, differs in (({}, True), ({"global_clipnorm": 100.0}, False)):
        after = []
        for grad in (two_rows, tf.convert_to_tensor(two_rows)):
            variable.assign(np.ones((3, 2), np.float32))
            optimizer = keras.optimizers.Adam(**clip)
            optimizer.build([variable])
            for _ in range(2):
                optimizer.apply([grad], [variable])
            after.append(variable.numpy())
        assert (np.abs(after[0] - after[1]).max() > 1e-4) == differs, (clip, after)
    dense = densify(slices, table).numpy()
    assert dense.shape == (50, 8) and dense[1].tolist() == [2.0] * 8 and dense[4].tolist() == [1.0] * 8
    assert dense.sum() == 24.0
    # Keras' global norm squares the slices (a row touched twice counts twice), not their sum
    assert float(local_squares(slices)) == 24.0 and local_squares(tf.ones([2])) is None
    assert even_pieces(10, 4) == [3, 3, 2, 2] and even_pieces(2, 4) == [1, 1, 0, 0]


def test_ranks_follow_tensorflows_order_of_task_names():
    """TensorFlow ranks a collective group by its task names as strings (measured with 11 worker processes: the
    gathered task ids came back as 0, 1, 10, 2, ..., 9)."""
    workers = {"worker": [f"127.0.0.1:{1000 + i}" for i in range(11)]}
    assert rank_order(workers) == [0, 1, 10, 2, 3, 4, 5, 6, 7, 8, 9]
    with_chief = {"chief": ["127.0.0.1:999"], **workers}
    assert rank_order(with_chief) == [0, 1, 2, 11, 3, 4, 5, 6, 7, 8, 9, 10]
    assert rank_order({"worker": ["a:1", "b:2"]}) == [0, 1]


def test_rows_meant_for_another_replica_stop_the_step():
    check_rows(tf.constant([1.0, 1.0]), 1, [0, 1])  # every row for replica 1: passes
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tfaccel ZeRO-1: the worker of replica 1 received "
                       r"gradient rows meant for other replicas: TensorFlow ranked the collective group in another "
                       r"order than tfaccel expects \(replica id by rank: \[0, 1\]\); train with "
                       r"shard_optimizer_state=False"):
        check_rows(tf.constant([0.0, 1.0]), 1, [0, 1])


def test_the_tensorflow_and_keras_internals_it_uses_are_there():
    import inspect

    from tensorflow.python.distribute import collective_all_reduce_strategy, cross_device_utils, multi_worker_util

    launcher = cross_device_utils.CollectiveReplicaLauncher
    assert callable(launcher._next_instance_key) and callable(launcher._get_ordering_token)
    keys = cross_device_utils.CollectiveKeys(group_key_start=keras_zero_collective.GROUP_KEY)
    assert keys.get_group_key(["/job:worker/replica:0/task:0/device:CPU:0"]) == keras_zero_collective.GROUP_KEY
    source = inspect.getsource(collective_all_reduce_strategy.CollectiveAllReduceExtended)
    assert "self._communication_options = " in source and "group_key_start=1 + self._collective_key_base" in source
    assert multi_worker_util.id_in_cluster({"chief": ["a:1"], "worker": ["b:1"]}, "worker", 0) == 1
    for op in ("CollectiveAllToAllV2", "CollectiveGatherV2", "CollectiveReduceV2"):
        assert hasattr(tf.raw_ops, op), op


def test_checkpoint_dir_under_sharded_multi_worker_is_refused(worker_runs):
    for w in worker_runs:
        assert "checkpoint_dir" in w["checkpoint_dir_refusal"] and "only the writing worker's" in \
            w["checkpoint_dir_refusal"] and "keep backup_dir" in w["checkpoint_dir_refusal"], w["checkpoint_dir_refusal"]


def test_loss_scaling_sharded_over_workers_trains_as_unsharded(worker_runs):
    """mixed_float16's LossScaleOptimizer sharded over the workers: its first scale overflows, so steps are skipped
    on every worker alike (tfaccel.compat.keras_loss_scale's finite check over every replica) and the scale
    halved, then doubled; the same history, weights, scale and updates as the unsharded job, every weight finite.
    Stopped after a backup and resumed, it ends the same (each worker's shard in the backup:
    tfaccel.compat.keras_zero_loss_scale; before, the first backup's save ran a collective on the chief alone and
    the job failed), and its .keras file loads in plain Keras with the unsharded job's whole optimizer state."""
    for w in worker_runs:
        want = w["loss_scaled"]["unsharded"]
        for mode in ("sharded", "resumed"):
            got = w["loss_scaled"][mode]
            assert got["note"].startswith("optimizer AdamW: state sharded over 2 replicas"), got["note"]
            assert all(np.all(np.isfinite(v)) for v in got["weights"])
            assert (got["scale"], got["updates"]) == (want["scale"], want["updates"]) and 0 < got["updates"] < 16
            for key, values in want["history"].items():
                np.testing.assert_allclose(got["history"][key], values, rtol=1e-5, atol=1e-5, equal_nan=False)
            _close(got["weights"], want["weights"])
        assert w["loss_scaled"]["resumed"]["resumed_from"] == [1, 3]  # the backup at step 11 (8 steps an epoch)
    assert worker_runs[0]["loss_scaled"]["sharded"]["weights"] == worker_runs[1]["loss_scaled"]["sharded"]["weights"]
    saved, want = worker_runs[0]["loss_scaled"]["saved_state"], worker_runs[0]["loss_scaled"]["unsharded"]["state"]
    assert [np.shape(v) for v in saved] == [np.shape(v) for v in want]  # every slot whole, none an empty stand-in
    _close(saved, want)


def _close(got, want, atol=1e-5):
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a, "float64"), np.asarray(b, "float64"), rtol=0, atol=atol)


def test_each_worker_backs_up_its_shard_and_the_resumed_job_trains_on_exactly(worker_runs):
    """The sharded Adam-with-schedule fit, stopped at epoch 1 step 5 (8 steps an epoch) with a backup every 3 steps:
    the backup at step 11 has one shard file per worker, named by the pointer with the owners; the resumed run (its
    weights and history checked against plain fit by test_sharded_over_workers_equals_plain_fit) ends within
    1e-5 of the uninterrupted run's weights (with the shards left unread, measured: 0.027 apart)."""
    for w in worker_runs:
        run = w["resume"]
        zc.assert_two_shard_backup(run)
        _close(w["adam_schedule"]["weights"], worker_runs[0]["adam_schedule"]["plain_weights"])
    assert not (worker_runs[0]["work"] / "backup").exists()  # the finished job removed it, shards included


def test_a_backup_of_sharded_accumulation_resumes_at_an_update_end_to_keras_own_accumulation(worker_runs):
    """The 2-worker launch's accumulation case (2 micro-batches, a backup every 4 steps) was stopped at epoch 1 step
    5, inside an update, and resumed from the backup at step 4 (test_sharded_over_workers_equals_plain_fit checks
    its weights and history against Keras' own accumulation on one device)."""
    assert [w["adamw_accumulate"]["resumed_from"] for w in worker_runs] == [[1, 4], [1, 4]]


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


def test_xla_falls_back_to_off_where_the_sharded_exchange_cannot_compile():
    """On GPUs, jit_compile=True under multi_worker or Horovod would reach tfaccel's sharded exchange, whose
    collectives XLA has no kernels for: the job trains without XLA and says why (on CPUs the strategy already turns
    XLA off, so this is the decision alone)."""
    workers = tf.distribute.MultiWorkerMirroredStrategy.__new__(tf.distribute.MultiWorkerMirroredStrategy)
    mirrored = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    sharded = sharded_class(keras.optimizers.Adam, partition_by_bytes)()
    ranks = shard_over_ranks(keras.optimizers.Adam(), partition_by_bytes, collectives=None)
    model = lambda optimizer, strategy: SimpleNamespace(optimizer=optimizer, distribute_strategy=strategy)  # noqa
    assert "no XLA kernels" in xla_fallback(model(sharded, workers), True)
    assert "Horovod ops" in xla_fallback(model(ranks, mirrored), True)
    assert xla_fallback(model(sharded, workers), False) is None
    assert xla_fallback(model(sharded, mirrored), True) is None  # one process: the strategy's own collectives
    assert xla_fallback(model(keras.optimizers.Adam(), workers), True) is None
