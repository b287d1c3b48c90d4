"""Optimizer-state sharding (ZeRO-1, tfaccel.train.zero): on 2 and 4 mirrored virtual CPUs, tfaccel.fit with
shard_optimizer_state=True trains what plain model.fit trains on one device (Adam with a schedule, AdamW, SGD with
Nesterov momentum and clipnorm, RMSprop with global_clipnorm), each device holds ~1/N of the optimizer state, and
what it cannot train exactly is refused before training, with the reason and the fix. The same across worker
processes, and sharded backups: tests/training/test_zero_workers.py."""

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import harness
import zero_cases as zc
import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.train.request import FitRequest
from tfaccel.memory.shards import largest_share, partition_by_bytes, shard_loads
from tfaccel.train.zero import give_back_callbacks, shard_optimizer_state

PROGRAM = Path(__file__).resolve().parent / "zero_program.py"
SHARDED = ("adam_schedule", "adamw", "sgd_nesterov_clipnorm", "rmsprop_global_clipnorm", "lamb", "adamw_ema",
           "adamw_accumulate", "adam_keras_loop")
SLOTS = {"adam_schedule": 2, "adamw": 2, "sgd_nesterov_clipnorm": 1, "rmsprop_global_clipnorm": 1, "lamb": 2,
         "adamw_ema": 3, "adamw_accumulate": 2, "adam_keras_loop": 2}  # adamw_ema: its moments and the average


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
    run, plain = runs[replicas][case], runs[2][case]  # the plain reference fit: in the N=2 process alone
    assert run["initial"] == plain["initial"]  # the same start in both processes
    uneven = zc.uneven_words(run["slot_sizes"], replicas)
    assert bool(uneven) == (replicas == 4)  # 4 replicas: one kernel is 59% of this model, so one owner holds 2.36x
    assert zc.variable_blind(run["note"]).endswith(
        f"state sharded over {replicas} replicas (ZeRO-1: each variable's slots on one owner, gradients reduced to "
        f"it, its update copied to every replica){zc.accumulated_words(case)}{uneven}{zc.callback_words(case)}; "
        "asked for (shard_optimizer_state=True)")
    assert run["note"] in run["plan_notes"]  # the plan says it, and why
    assert run["history"].keys() == plain["plain_history"].keys()
    for key, values in plain["plain_history"].items():
        np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
    for got, want in zip(run["weights"], plain["plain_weights"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for copies in run["copies"]:  # every replica's copy of every variable is the same
        assert all(np.array_equal(copies[0], c) for c in copies[1:])
    assert run["iterations"] == plain["plain_iterations"] == zc.updates(case)
    assert run["loop"] == ("keras_fit" if case == "adam_keras_loop" else "multi_step")  # both loops shard


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("case", SHARDED)
def test_each_device_holds_its_share_of_the_slots(runs, replicas, case):
    run = runs[replicas][case]
    slot_bytes = [size * SLOTS[case] for size in run["slot_sizes"]]
    assert len(run["held"]) == replicas and run["details_bytes"] == run["held"]
    held = sorted(v - zc.replicated_bytes(case, run["slot_sizes"]) for v in run["held"].values())
    scalars = 8 * 4  # the iteration counter and the rate, mirrored: a few bytes on every device
    ideal = sum(slot_bytes) / replicas
    for per_device in held:  # 1/N of the whole, within one variable's slots (greedy by bytes)
        assert abs(per_device - ideal) <= max(slot_bytes) + scalars, (held, ideal)
    assert sum(held) <= sum(slot_bytes) + replicas * scalars  # no slot held twice


@pytest.mark.parametrize("replicas", [2, 4])
def test_an_accumulating_jobs_keras_file_holds_what_plain_keras_holds(runs, replicas):
    """The accumulators (one per variable) and the micro-batch counter are the job's, not the optimizer's state: the
    .keras file of the sharded accumulating job loads in plain Keras with every optimizer variable, whole and equal."""
    run = runs[replicas]["adamw_accumulate"]
    variables = len(run["slot_sizes"])
    # the iteration counter and AdamW's two moments per variable (the rate is a schedule); trained: + the
    # accumulators and the micro-batch counter
    assert run["keras_file"] == {"class": "AdamW", "count": 1 + 2 * variables, "trained_count": 2 + 3 * variables,
                                 "equal": True}


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("case", ["adamw", "adamw_accumulate"])
def test_the_memory_estimate_predicts_each_devices_share(runs, replicas, case):
    """``tfaccel memory --shard-optimizer-state``: each device's slots, and with gradient accumulation the sums of
    the micro-batches each device also holds, to the byte."""
    run = runs[replicas][case]
    assert sorted(run["estimate"]) == sorted(run["held"].values())


def test_unsharded_run_holds_every_slot_on_every_device(runs):
    """The control: the same measurement catches mirrored slots (what sharding removes)."""
    run = runs[2]["adam_unsharded"]
    full = 2 * sum(run["slot_sizes"])
    assert run["note"] is None and all(v >= full for v in run["held"].values())
    np.testing.assert_allclose(run["history"]["loss"], run["plain_history"]["loss"], rtol=1e-5)


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("case", ["embedding", "embedding_global_clipnorm"])
def test_an_embedding_table_stays_unsharded_and_trains_as_plain_fit(runs, replicas, case):
    """The table's gradient is sparse (IndexedSlices): Keras' own update on every replica, the Dense layers sharded;
    Adam with clipnorm, and with global_clipnorm (the global norm over the sharded and unsharded gradients, which
    bites: the first batches' norms are above it)."""
    run = runs[replicas][case]
    if case == "embedding_global_clipnorm":
        assert min(run["norms"]) > 2 * 0.05, run["norms"]
    assert re.search(r"\(ZeRO-1: .*\); left unsharded \(Embedding tables, whose gradients are sparse: averaged as "
                     r"model\.fit averages them and applied on every replica, replicated slots\): "
                     r"\S*/embedding\w*/embeddings; uneven: one replica holds [^;]*; asked for",
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


@pytest.mark.parametrize("replicas", [2, 4])
def test_accumulation_moving_averages_and_an_unsharded_table_together_train_as_keras(runs, replicas):
    """tfaccel's accumulation (2 micro-batches), use_ema written every 3 updates, an Embedding table left unsharded
    beside sharded Dense layers: Keras' own accumulation on one device, update for update."""
    run = runs[replicas]["embedding_ema_accumulate"]
    assert "; left unsharded (Embedding tables" in run["note"] and "; gradients accumulated over 2" in run["note"]
    assert run["updates"] == [8, 8]
    for key, values in run["plain_history"].items():
        np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
    for got, want in zip(run["weights"], run["plain_weights"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _accumulating_model(keras):
    """A sharded-ready model on this process's 2 mirrored replicas: Adam whose rate decays every 3 micro-batches
    (a resume that read it at another micro-batch would train another model)."""
    keras.utils.set_random_seed(1)
    with tfaccel.scope(strategy="mirrored"):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model.compile(keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 3, 0.8)), "mse")
    return model


@pytest.mark.parametrize("loop", ["keras", "compiled"])  # Keras fit, tfaccel's multi-step loop
def test_backups_of_sharded_accumulation_resume_to_the_uninterrupted_weights(loop, clean_tf_config, cpu_replicas,
                                                                               tmp_path):
    """Sharded state, 2 micro-batches per update, a backup every 4 steps (8 an epoch): stopped at epoch 1 step 5
    (inside the third update of the epoch), the job resumes from the backup at step 4 (an update's end: the sums are
    empty there, and they are not saved) with the micro-batch counter the uninterrupted job had there (iterations x
    2), and ends with the uninterrupted job's weights. Measured with the counter left at 0 on load: 0.0097 apart."""
    import keras

    rng = np.random.RandomState(0)
    x, y = rng.randn(256, 8).astype("float32"), rng.randn(256, 3).astype("float32")
    kw = dict(batch_size=32, epochs=2, shuffle=False, verbose=0, loop=loop, seed=0, shard_optimizer_state=True,
              gradient_accumulation_steps=2)
    whole = _accumulating_model(keras)
    tfaccel.fit(whole, x, y, **kw)
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="stopped for the test"):
        tfaccel.fit(_accumulating_model(keras), x, y, backup_dir=backup, backup_freq=4, callbacks=[zc.StopAt(1, 5)],
                    **kw)
    resumed = _accumulating_model(keras)
    result = tfaccel.fit(resumed, x, y, backup_dir=backup, backup_freq=4, **kw)
    assert result.resumed_from == (1, 4)
    assert result.details["preemption"]["stops_at_update_ends_every"] == 2  # a preemption stops at an update's end
    assert int(resumed.optimizer.iterations.numpy()) == int(whole.optimizer.iterations.numpy()) == 8
    for got, want in zip(resumed.get_weights(), whole.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("case", ["adamw", "sgd_nesterov_clipnorm"])
def test_mixed_precision_trains_as_the_unsharded_job_and_keras(runs, replicas, policy, case):
    """Under mixed_bfloat16 and mixed_float16 (16-bit compute, float32 variables and slots) the sharded job ends where
    the same job unsharded ends and, under mixed_bfloat16 with AdamW, where plain ``model.fit`` under TF's
    MirroredStrategy ends. Under mixed_float16 the inner optimizer of the LossScaleOptimizer is sharded; its first
    scale overflows, so steps are skipped and the scale halved, then doubled every 2 finite steps: the same skips and
    scale as unsharded, every weight finite. Keras' own LossScaleOptimizer under MirroredStrategy lets one replica's
    overflow reach the weights (tfaccel.compat.keras_loss_scale): its run ends NaN, so it is no reference there (and
    no NaN passes for equal here)."""
    run = runs[replicas][f"{case}_{policy}"]
    assert run["policy"] == policy and run["sharded"]["compute"] == policy.split("_")[1]
    assert run["sharded"]["note"].startswith(f"optimizer {'AdamW' if case == 'adamw' else 'SGD'}: state sharded over "
                                             f"{replicas} replicas")
    assert len(run["sharded"]["held"]) == replicas and len(set(run["sharded"]["held"].values())) > 1  # shares
    assert all(np.all(np.isfinite(w)) for w in run["sharded"]["weights"])
    keras_ok = case == "adamw" and policy == "mixed_bfloat16"
    references = [run["unsharded"]] + ([run["keras_mirrored"]] if keras_ok else [])
    for reference in references:
        for key, values in reference["history"].items():
            np.testing.assert_allclose(run["sharded"]["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key,
                                       equal_nan=False)
        for got, want in zip(run["sharded"]["weights"], reference["weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=False)
        if policy == "mixed_float16":
            assert (run["sharded"]["scale"], run["sharded"]["updates"]) == (reference["scale"], reference["updates"])
    if policy == "mixed_float16":
        assert 0 < run["sharded"]["updates"] < 16  # some of the 16 steps skipped, the others applied
        if case == "adamw":  # upstream, checked so that the test says when it changes
            assert np.isnan(run["keras_mirrored"]["history"]["loss"][-1])


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
    assert largest_share([400, 16, 400, 8], 2) == 416 / 412  # even within one small variable
    assert largest_share([600, 100, 100, 100], 2) == 600 / 450  # one variable above half: uneven
    assert largest_share([600, 100, 100, 100], 4) == 600 / 225 and largest_share([], 3) == 1.0


def test_the_keras_and_tf_internals_it_uses_are_there():
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from tensorflow.python.distribute import numpy_dataset

    for name in ("_backend_update_step", "_var_key", "_clip_gradients", "add_variable_from_reference", "update_step",
                 "_backend_apply_gradients", "_update_model_variables_moving_average",  # use_ema's (keras_zero_ema)
                 "_overwrite_model_variables_with_average_value", "_get_variable_index"):  # keras_zero_accumulate's
        assert callable(getattr(TFOptimizer, name)), name
    assert numpy_dataset.SingleDevice("/cpu:0").device == "/cpu:0"
    import keras

    for name in ("_tf_swap_variables", "_tf_finalize_ema_values"):  # SwapEMAWeights' TensorFlow path (keras_zero_ema)
        assert list(inspect.signature(getattr(keras.callbacks.SwapEMAWeights, name)).parameters) == ["self",
                                                                                                     "optimizer"]
    from tensorflow.python.distribute.collective_all_reduce_strategy import CollectiveAllReduceExtended

    assert "self._id_in_cluster = " in inspect.getsource(CollectiveAllReduceExtended)  # this worker's first replica


def _compiled(optimizer=None, model_class=None, policy=None):
    import keras

    if policy:
        keras.mixed_precision.set_dtype_policy(policy)
    try:
        with tfaccel.scope(strategy="mirrored"):
            inputs = keras.Input((4,))
            model = (model_class or keras.Model)(inputs, keras.layers.Dense(1)(inputs))
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
    (lambda k: _compiled(policy="bfloat16"), 1,
     r"'bfloat16' dtype policy; sharding is tested for float32, mixed_bfloat16, mixed_float16 only"),
    (lambda k: _compiled(k.optimizers.SGD(gradient_accumulation_steps=3)), 1,
     r"SGD\(gradient_accumulation_steps=3\): Keras' own accumulation is not sharded; compile the optimizer without "
     r"it and pass gradient_accumulation_steps= to tfaccel.fit"),
    (lambda k: _compiled(policy="mixed_float16"), 2,
     r"gradient accumulation \(2 micro-batches\) with a LossScaleOptimizer \(mixed_float16\) is not sharded"),
    (lambda k: _compiled(), "backups_epoch", r"backup_dir='/tmp/b' with gradient accumulation \(2 micro-batches\): "
                                             r"a backup is written only at the end of an update \(the sums of the "
                                             r"micro-batches before it are not saved\), and an epoch of 7 steps would "
                                             r"end inside one; choose a number of steps per epoch and a backup_freq "
                                             r"that are multiples of 2"),
    (lambda k: _compiled(), "backups_freq", r"backup_dir='/tmp/b' with gradient accumulation \(2 micro-batches\): "
                                            r".* and backup_freq=3 would end inside one"),
    (lambda k: _compiled(), "restore", r"callback BackupAndRestore with gradient accumulation \(2 micro-batches\): "
                                       r"it saves between two updates too"),
    (lambda k: _compiled(model_class=_custom_step_class()), 1, r"OwnStep has its own train_step"),
])
def test_what_is_not_exact_is_refused(make, accumulation, message, clean_tf_config, cpu_replicas):
    import keras

    callbacks = {"restore": [keras.callbacks.BackupAndRestore("/tmp/b")]}.get(accumulation, [])
    steps = {"backups_epoch": 2, "backups_freq": 2, "restore": 2}.get(accumulation, accumulation)
    where = {"callbacks": callbacks, "backup_dir": "/tmp/b" if str(accumulation).startswith("backups") else None,
             "steps_per_epoch": 7 if accumulation == "backups_epoch" else 8,
             "backup_freq": 3 if accumulation == "backups_freq" else 4}
    with pytest.raises(ConfigError, match="^shard_optimizer_state=True: .*" + message):
        shard_optimizer_state(make(keras), True, accumulation_steps=steps, **where)
    with pytest.raises(ConfigError, match="shard_optimizer_state=False"):  # the fix names the way out
        shard_optimizer_state(make(keras), True, accumulation_steps=steps, **where)


def test_keras_swap_ema_weights_swaps_on_the_owners_for_the_job_and_is_given_back(clean_tf_config, cpu_replicas):
    """The plan says so; the callback has tfaccel's subclass (same name) while the job trains, its own class after
    (the parity programs' adamw_ema case trains and evaluates with it against plain model.fit)."""
    import keras

    swap, other = keras.callbacks.SwapEMAWeights(swap_on_epoch=True), keras.callbacks.History()
    note = shard_optimizer_state(_compiled(keras.optimizers.Adam(use_ema=True)), True, accumulation_steps=1,
                                 callbacks=[other, swap])
    assert "; Keras' SwapEMAWeights swaps the weights with their moving averages on the variables' owners, who share " \
           "the result; asked for" in note, note
    assert type(swap) is not keras.callbacks.SwapEMAWeights and type(swap).__name__ == "SwapEMAWeights"
    give_back_callbacks([other, swap])
    assert type(swap) is keras.callbacks.SwapEMAWeights and type(other) is keras.callbacks.History


def test_loss_scaling_is_sharded_by_a_backend_whose_processes_are_the_replicas(clean_tf_config, cpu_replicas):
    """mixed_float16's LossScaleOptimizer under a backend whose processes are the replicas (Horovod's): the backend
    shards it (tests/horovod/test_horovod_zero.py trains it on 2 ranks, one overflowing)."""
    import keras

    sharded = []
    backend = SimpleNamespace(num_replicas_in_sync=2,
                              shard_optimizer=lambda model, **_: sharded.append(model) or "sharded by the backend")
    model = _compiled(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
    note = shard_optimizer_state(model, True, accumulation_steps=1, backend=backend)
    assert sharded == [model] and note.startswith("sharded by the backend"), note


def test_loss_scaling_is_refused_with_the_finite_check_fix_off(clean_tf_config, cpu_replicas, monkeypatch):
    """Sharded loss scaling needs tfaccel.compat.keras_loss_scale's finite check over every replica, under
    tf.distribute and under a backend whose processes are the replicas (Horovod's) alike."""
    import keras

    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", "keras_loss_scale")
    sharded = []
    horovod_like = SimpleNamespace(num_replicas_in_sync=2, shard_optimizer=lambda model, **_: sharded.append(model))
    for backend in (None, horovod_like):
        model = _compiled(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
        with pytest.raises(ConfigError, match=r"its loss scaling is not sharded with tfaccel.compat.keras_loss_scale "
                                              r"off \(switched off by TFACCEL_DISABLE_COMPAT \(keras_loss_scale\)\)"):
            shard_optimizer_state(model, True, accumulation_steps=1, backend=backend)
    assert not sharded


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
    accumulating = shard_optimizer_state(_compiled(), "auto", accumulation_steps=2, batch_size=8,
                                         device_memory_bytes=2**40)
    needs = [int(re.search(r"needs ([\d,]+) bytes", note).group(1).replace(",", "")) for note in (roomy, accumulating)]
    assert needs[1] - needs[0] == 4 * (4 + 1) + 8  # the sums of the micro-batches (Dense(1) on 4 inputs) and counter
    tight = shard_optimizer_state(model, "auto", accumulation_steps=1, batch_size=8, device_memory_bytes=16)
    assert re.fullmatch(r"optimizer Adam: state sharded over 2 replicas \(ZeRO-1: .*\); auto: on, one replica needs "
                        r"[\d,]+ bytes by tfaccel memory's estimate, more than its device's 16 bytes", tight)
    assert is_sharded(model.optimizer)
    with pytest.raises(ConfigError, match=r"^shard_optimizer_state=True: backup_dir='/b' with gradient accumulation"):
        shard_optimizer_state(_compiled(), "auto", accumulation_steps=2, batch_size=8, device_memory_bytes=16,
                              backup_dir="/b")  # what auto turns on, it checks as True does


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


def test_auto_estimates_a_model_with_an_open_axis_from_the_jobs_data(clean_tf_config, cpu_replicas):
    """A dict-input model whose sequence axis is open (as KerasHub's): ``"auto"`` estimates it at the data's own
    example shape (``tfaccel.train.data.example_shape``); where no shape fills the axis, the estimate cannot be made,
    and auto stays off saying why instead of stopping the job."""
    import keras
    import tensorflow as tf

    from tfaccel.compat.keras_zero import is_sharded
    from tfaccel.train.data import FitData, example_shape

    def dict_model():
        with tfaccel.scope(strategy="mirrored"):
            tokens = keras.Input((None,), dtype="int32", name="tokens")
            hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 8)(tokens))
            model = keras.Model({"tokens": tokens}, keras.layers.Dense(3)(hidden))
            model.compile(keras.optimizers.Adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    x = {"tokens": np.zeros((16, 6), np.int32)}
    assert example_shape(FitData("arrays", x)) == (6,)
    batches = tf.data.Dataset.from_tensor_slices((x, np.zeros(16, np.int32))).batch(4)
    assert example_shape(FitData("dataset", batches)) == (6,)
    assert example_shape(FitData("arrays", np.zeros(16))) is None  # one number per example: nothing to fill
    open_axis = shard_optimizer_state(dict_model(), "auto", accumulation_steps=1, batch_size=8, device_memory_bytes=16)
    assert re.fullmatch(r"optimizer state not sharded: auto: off, tfaccel memory could not estimate one replica of "
                        r"this model \(.+\); pass shard_optimizer_state=True to shard it anyway", open_axis, re.S)
    model = dict_model()
    tight = shard_optimizer_state(model, "auto", accumulation_steps=1, batch_size=8, device_memory_bytes=16,
                                  input_shape=(6,))
    assert "auto: on, one replica needs" in tight and is_sharded(model.optimizer)
