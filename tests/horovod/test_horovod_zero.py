"""Optimizer-state sharding (ZeRO-1) under Horovod (tfaccel.strategies.horovod.zero): on 2 and 4 real Gloo ranks,
tfaccel.fit(shard_optimizer_state=True) trains what plain model.fit trains in one process (Adam with a schedule,
AdamW, SGD with Nesterov momentum and clipnorm, RMSprop with global_clipnorm; an Embedding table left unsharded
beside sharded Dense layers, with clipnorm and with global_clipnorm; AdamW under mixed_float16, one rank
overflowing), every rank ends with the same weights and holds ~1/N of the slots; backups hold every rank's shard and
a stopped job resumes exactly; what it cannot train exactly, or back up whole, is refused before training (in one
process, with Horovod's collectives faked: the refusals come before any collective)."""

import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import keras
import numpy as np
import pytest

import harness
import zero_cases as zc
from hvd_testing import FakeHvd, require_horovod
from tfaccel.compat.keras_zero import is_sharded
from tfaccel.compat.keras_zero_ranks import unsharded_variables
from tfaccel.errors import ConfigError
from tfaccel.launch.horovod import run_horovod
from tfaccel.launch.procs import pid_alive
from tfaccel.strategies.horovod import distribute_in_place, make_backend
from tfaccel.train.zero import shard_optimizer_state

PROGRAM = Path(__file__).resolve().parent / "hvd_zero_program.py"
CASES = ("adam_schedule", "adamw", "sgd_nesterov_clipnorm", "rmsprop_global_clipnorm", "lamb", "adamw_ema",
         "adamw_accumulate")
SLOTS = {"adam_schedule": 2, "adamw": 2, "sgd_nesterov_clipnorm": 1, "rmsprop_global_clipnorm": 1, "lamb": 2,
         "adamw_ema": 3, "adamw_accumulate": 2}  # adamw_ema: its moments and the moving average


def _launch(size, out):
    """``size`` ranks of the program, every optimizer case inside; each rank's JSON."""
    launch = run_horovod(size, [sys.executable, str(PROGRAM), str(out)], timeout=300, echo=False,
                         capture_lines=200, gloo_timeout=120,
                         env=dict(harness.CHILD_ENV, PYTHONPATH=str(harness.REPO_ROOT)))
    harness.STARTED_PIDS.extend(launch.pids)
    task = launch.tasks[0]
    assert launch.ok, f"{launch.message}\n{task.stdout[-3000:]}\n{task.stderr[-3000:]}"
    infos = [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]
    for info in infos:  # no rank outlives the launch
        deadline = time.monotonic() + 10
        while pid_alive(info["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(info["pid"]), f"a rank (pid {info['pid']}) outlived horovodrun"
    return infos


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One launch per rank count (2 and 4, both at once), every optimizer case inside it."""
    require_horovod()
    with ThreadPoolExecutor(2) as pool:
        futures = {size: pool.submit(_launch, size, tmp_path_factory.mktemp(f"hvdzero{size}")) for size in (2, 4)}
        return {size: future.result() for size, future in futures.items()}


@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_sharded_ranks_train_what_plain_fit_trains(runs, size):
    for case in CASES:
        ranks = [info[case] for info in runs[size]]
        run = ranks[0]
        assert zc.variable_blind(run["note"]) == (
            f"optimizer {run['note'].split()[1]} state sharded over {size} Horovod ranks (ZeRO-1: each variable's "
            "slots on one rank, gradients averaged by one grouped all-reduce, the owners' updates all-gathered)"
            f"{zc.accumulated_words(case)}{zc.uneven_words(run['slot_sizes'], size)}{zc.callback_words(case)}; "
            "asked for (shard_optimizer_state=True)"), run["note"]
        assert run["note"] in run["plan_notes"] and run["strategy"] == "horovod"
        assert run["history"].keys() == run["plain_history"].keys()
        for key, values in run["plain_history"].items():
            np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=f"{case} {key}")
        for got, want in zip(run["weights"], run["plain_weights"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=case)
        for other in ranks[1:]:  # every rank ends with the same model and history
            assert other["history"] == run["history"]
            for a, b in zip(other["weights"], run["weights"]):
                np.testing.assert_array_equal(a, b)
        assert [r["iterations"] for r in ranks] == [zc.updates(case)] * size


@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_each_rank_holds_its_share_of_the_slots(runs, size):
    for case in CASES:
        ranks = [info[case] for info in runs[size]]
        slot_bytes = [n * SLOTS[case] for n in ranks[0]["slot_sizes"]]
        assert [list(r["details_bytes"].values()) for r in ranks] == [[r["held"]] for r in ranks]  # FitResult says it
        held = [r["held"] - zc.replicated_bytes(case, ranks[0]["slot_sizes"]) for r in ranks]
        scalars = 2 * 8  # the iteration counter and the rate, on every rank
        for per_rank in held:  # 1/N of the whole, within one variable's slots (greedy by bytes)
            assert abs(per_rank - sum(slot_bytes) / size) <= max(slot_bytes) + scalars, (case, held)
        assert sum(held) <= sum(slot_bytes) + size * scalars  # no slot held twice
        assert min(held) > scalars  # every rank owns some


@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("case", ["embedding", "embedding_global_clipnorm"])
def test_an_embedding_table_stays_unsharded_and_trains_what_plain_fit_trains(runs, size, case):
    """The table's sparse gradient is all-gathered (slices kept, as model.fit keeps them) and every rank updates its
    full copy with full slots; the Dense layers beside it are sharded; Adam with clipnorm, and with global_clipnorm
    (the global norm over the sharded and unsharded gradients)."""
    ranks = [info[case] for info in runs[size]]
    run = ranks[0]
    assert re.search(r"\(ZeRO-1: .*\); left unsharded \(Embedding tables, .*\): \S*embedding\S*/embeddings; "
                     r"uneven: one replica holds [^;]*; asked for", run["note"]), run["note"]
    for key, values in run["plain_history"].items():
        np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=key)
    for got, want in zip(run["weights"], run["plain_weights"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for other in ranks:
        assert other["weights"] == run["weights"]
        assert other["slot_shapes"].count([50, 8]) == 2, other["slot_shapes"]  # Adam's m and v of the whole table
    dense_slots = [[s for s in r["slot_shapes"] if len(s) == 2 and s != [50, 8]] for r in ranks]
    assert sum(len(d) for d in dense_slots) == 4, dense_slots  # each Dense kernel's m and v on one rank only


@pytest.mark.horovod
@pytest.mark.slow
def test_loss_scaling_sharded_over_ranks_skips_the_steps_one_device_skips(runs):
    """mixed_float16's LossScaleOptimizer, its inner AdamW sharded over 2 ranks, where one rank's gradients overflow
    (inf inputs on that rank only): the ranks sum the count of overflowing ranks before the finite check
    (tfaccel.compat.keras_loss_scale), so both skip the step and halve the scale, as plain model.fit on one process
    does (without it, only one rank enters the owners' all-gather and the job hangs); weights finite, equal to the same
    job unsharded (1e-5), and to plain fit's within float16's rounding. Each rank computes half the batch in float16,
    so the weights are not plain fit's to 1e-5: after 16 AdamW steps (learning rate 0.01) they were 4.2e-5 apart on
    one machine; on another (2026-11-30) 3.7e-4 in one run and, in the next, 6.2e-3 on 7 of 512 weights (one output
    unit whose gradient is near zero, where Adam's normalised step follows the rounding's sign), sharded or not. So
    against plain fit: the typical weight (median) within 1e-4, every weight within two steps (2e-2); the steps
    applied and the loss scale are checked exactly."""
    ranks = [info["loss_scaled"] for info in runs[2]]
    plain = ranks[0]
    for run in ranks:
        want = run["unsharded"]
        for mode in ("sharded", "unsharded"):
            got = run[mode]
            assert all(np.all(np.isfinite(w)) for w in got["weights"]), mode
            assert (got["scale"], got["updates"]) == (plain["plain_scale"], plain["plain_updates"]), mode
            assert 0 < got["updates"] < 16, got["updates"]
            for a, b, c in zip(got["weights"], want["weights"], plain["plain_weights"]):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=mode)
                gap = np.abs(np.asarray(a) - np.asarray(c))
                assert np.median(gap) <= 1e-4 and gap.max() <= 2e-2, (mode, float(np.median(gap)), float(gap.max()))
            for key, values in want["history"].items():
                np.testing.assert_allclose(got["history"][key], values, rtol=1e-5, atol=1e-5, err_msg=mode)
        assert "skips a step when any rank's gradients overflow" in run["sharded"]["note"], run["sharded"]["note"]
    assert ranks[0]["sharded"]["weights"] == ranks[1]["sharded"]["weights"]


@pytest.mark.horovod
@pytest.mark.slow
def test_each_rank_backs_up_its_shard_and_the_resumed_job_trains_on_exactly(runs):
    """Two ranks, the sharded Adam-with-schedule fit stopped at epoch 1 step 5 (8 steps an epoch) with a backup every
    3 steps: the backup at step 11 has one shard file per rank, named by the pointer with the owners; a fresh model
    resumes it on every rank (each loading the slots it owns) and ends within 1e-5 of plain model.fit's weights (with
    the shards left unread it does not). The finished epoch's logs come back from the backup; the resumed epoch's
    cover the steps after the resume, as every Horovod resume's do (each rank keeps its own metric state)."""
    plain = runs[2][0]["adam_schedule"]
    for info in runs[2]:
        run = info["resume"]
        zc.assert_two_shard_backup(run)
        for key, values in plain["plain_history"].items():
            assert len(run["history"][key]) == len(values), key
            np.testing.assert_allclose(run["history"][key][0], values[0], rtol=1e-5, atol=1e-5, err_msg=key)
        for got, want in zip(run["weights"], plain["plain_weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.horovod
@pytest.mark.slow
def test_a_backup_of_sharded_accumulation_resumes_at_an_update_end_and_ends_as_keras_own_accumulation(runs):
    """Two ranks, sharded state with 2 micro-batches per update and a backup every 4 steps, stopped at epoch 1 step 5
    (inside an update): both resume from the backup at step 4 and end within 1e-5 of Keras' own accumulation on one
    device (the finished epoch's logs too; the resumed epoch's cover the steps after the resume, as above)."""
    plain = runs[2][0]["adamw_accumulate"]
    for info in runs[2]:
        run = info["accumulate_resume"]
        assert run["resumed_from"] == [1, 4]
        for key, values in plain["plain_history"].items():
            np.testing.assert_allclose(run["history"][key][0], values[0], rtol=1e-5, atol=1e-5, err_msg=key)
        for got, want in zip(run["weights"], plain["plain_weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _model(optimizer=None, layers=None):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), *(layers or [keras.layers.Dense(16), keras.layers.Dense(3)])])
    model.compile(optimizer or keras.optimizers.Adam(0.01), "mse")
    return model


def _backend(size=2, rank=0, **options):
    return make_backend(_hvd=FakeHvd(size=size, rank=rank, local_rank=rank), pin_gpu=False, **options)


class _OwnStep(keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)


@pytest.mark.parametrize("make, where, message", [
    (lambda: (_model(), _backend(size=1)), {}, "under Horovod: there is one rank, so nothing to shard; launch"),
    (lambda: (_model(), _backend(compression="fp16")), {}, "compression='fp16' sends float16 gradients"),
    (lambda: (_model(), _backend()), {"checkpoint_dir": "/tmp/c"}, "checkpoint_dir='/tmp/c': rank 0 alone writes"),
])
def test_what_is_not_exact_under_horovod_is_refused(make, where, message):
    model, backend = make()
    with pytest.raises(ConfigError, match=message):
        shard_optimizer_state(model, True, accumulation_steps=1, backend=backend, **where)
    assert not is_sharded(model.optimizer)


def test_an_embedding_table_is_left_unsharded_beside_sharded_dense_layers():
    """In one process with Horovod faked (rank 0 of 2): the plan names the table, this rank holds the table's whole
    slots, and of the Dense variables only the ones it owns (the others: empty stand-ins)."""
    model = _model(layers=[keras.layers.Embedding(10, 3, name="emb"), keras.layers.Flatten(),
                           keras.layers.Dense(64, name="big"), keras.layers.Dense(2, name="small")])
    note = shard_optimizer_state(model, True, accumulation_steps=1, backend=_backend(size=2, rank=0))
    assert re.search(r"state sharded over 2 Horovod ranks .*; left unsharded \(Embedding tables, .*\): "
                     r"\S*emb/embeddings; "
                     r"uneven: one replica holds 1\.78x the mean share of the sharded state \(whole variables are "
                     r"partitioned, and \S*big/kernel alone is 89% of it\); asked for", note), note
    model.optimizer.build(model.trainable_variables)
    shapes = [tuple(v.shape) for v in model.optimizer.variables]
    assert shapes.count((10, 3)) == 2, shapes  # Adam's m and v of the whole table
    assert shapes.count((24, 64)) + shapes.count((64, 2)) == 2, shapes  # one of the two kernels is this rank's
    assert shapes.count((0,)) >= 2, shapes  # the other's slots: stand-ins
    table_slots = [v for v in model.optimizer.variables if tuple(v.shape) == (10, 3)]
    assert all(any(v is u for u in unsharded_variables(model.optimizer)) for v in table_slots)


def test_backups_inside_an_update_custom_train_step_and_built_optimizers_are_refused_under_horovod():
    with pytest.raises(ConfigError, match="backup_dir='/tmp/b' with gradient accumulation \\(2 micro-batches\\): .*an "
                                          "epoch of 7 steps would end inside one"):
        shard_optimizer_state(_model(), True, accumulation_steps=2, backend=_backend(), backup_dir="/tmp/b",
                              steps_per_epoch=7)
    keras.utils.set_random_seed(1)
    own = _OwnStep([keras.Input((8,)), keras.layers.Dense(3)])
    own.compile("adam", "mse")
    with pytest.raises(ConfigError, match="_OwnStep has its own train_step"):
        shard_optimizer_state(own, True, accumulation_steps=1, backend=_backend())
    built = _model()
    built.optimizer.build(built.trainable_variables)
    with pytest.raises(ConfigError, match="already built with a full copy of its slots"):
        shard_optimizer_state(built, True, accumulation_steps=1, backend=_backend())


def test_auto_under_horovod_follows_the_memory_estimate():
    model, backend = _model(), _backend()
    note = shard_optimizer_state(model, "auto", accumulation_steps=1, backend=backend, batch_size=32)
    assert note == ("optimizer state not sharded: auto: off, the replicas' devices report no memory size (CPU "
                    "replicas share the host's memory)") and not is_sharded(model.optimizer)
    note = shard_optimizer_state(model, "auto", accumulation_steps=1, backend=backend, batch_size=32,
                                 device_memory_bytes=10**12)
    assert note.startswith("optimizer state not sharded: auto: off, one replica needs ") and not is_sharded(
        model.optimizer)
    note = shard_optimizer_state(model, "auto", accumulation_steps=1, backend=backend, batch_size=32,
                                 device_memory_bytes=1000)
    assert note.startswith("optimizer Adam: state sharded over 2 Horovod ranks") and is_sharded(model.optimizer)
    assert "; auto: on, one replica needs " in note and note.endswith("more than its device's 1,000 bytes")


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_builds_only_its_own_slots_and_the_wrapper_and_broadcast_leave_them(rank):
    model = _model(keras.optimizers.Adam(0.01), [keras.layers.Dense(16), keras.layers.Dense(3)])
    backend = _backend(rank=rank)
    shard_optimizer_state(model, True, accumulation_steps=1, backend=backend)
    optimizer = model.optimizer
    assert distribute_in_place(optimizer, _hvd=FakeHvd()) is optimizer and is_sharded(optimizer)  # not averaged twice
    optimizer.build(model.trainable_variables)
    # kernel 8x16 (512 B) -> rank 0, kernel 16x3 (192 B) and both biases -> rank 1 (greedy by bytes)
    owned = {0: {0}, 1: {1, 2, 3}}[rank]  # kernel, bias, kernel, bias
    for i, (var, m, v) in enumerate(zip(model.trainable_variables, optimizer._momentums, optimizer._velocities)):
        full = i in owned
        assert tuple(m.shape) == tuple(v.shape) == (tuple(var.shape) if full else (0,)), var.path
    shared = unsharded_variables(optimizer)
    assert sorted(v.name for v in shared) == ["iteration", "learning_rate"]
