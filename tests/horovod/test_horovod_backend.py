"""tfaccel.strategies.horovod in one process: the optimizer wrapper, callbacks, GPU pinning, the Backend.

Collectives are faked here (FakeHvd); tests/horovod/test_horovod_two_ranks.py runs the real thing over Gloo.
"""

import logging
import sys
from typing import Any, List

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvd_testing import FakeHvd, LogCapture, require_horovod
from tfaccel.errors import BackendUnavailableError, ConfigError, DeviceError
from tfaccel.strategies import horovod as th
from tfaccel.strategies.horovod import callbacks as th_callbacks
from tfaccel.strategies.horovod import optimizer as th_optimizer


@pytest.fixture
def log_records():
    logger = logging.getLogger("tfaccel")
    handler = LogCapture()
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


# ------------------------------------------------------------------------------------------- check_optimizer

@pytest.mark.horovod
def test_upstream_keras2_wrapper_is_refused_with_a_clear_error() -> None:
    require_horovod()
    import horovod.tensorflow.keras as hvd_keras

    upstream = hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.1))
    with pytest.raises(ConfigError) as info:
        th.check_optimizer(upstream)
    msg = str(info.value)
    assert "optimizer: received Adam wrapped by Horovod's Keras 2 integration" in msg
    assert "silently does not average gradients" in msg
    assert "keras.optimizers.Adam(...)" in msg and "distributed_optimizer(optimizer)" in msg
    # Wrapping it again through tfaccel is refused the same way, not silently double-wrapped.
    with pytest.raises(ConfigError, match="Keras 2 integration"):
        th.distributed_optimizer(upstream, _hvd=FakeHvd())


def test_non_keras3_optimizer_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        th.check_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    assert "GradientDescentOptimizer, which is not a Keras 3 optimizer" in str(info.value)
    assert "keras.optimizers.Adam(1e-3)" in str(info.value)


def test_plain_and_tfaccel_wrapped_optimizers_pass_the_check() -> None:
    th.check_optimizer(keras.optimizers.Adam())
    th.check_optimizer(th.distributed_optimizer(keras.optimizers.Adam(), _hvd=FakeHvd()))


# --------------------------------------------------------------------------------------- distributed_optimizer

def test_wrapper_averages_gradients_through_one_grouped_allreduce() -> None:
    fake = FakeHvd(scale=0.5)
    opt = th.distributed_optimizer(keras.optimizers.SGD(learning_rate=1.0), compression="fp16", _hvd=fake)
    assert isinstance(opt, keras.optimizers.SGD) and th.is_distributed_optimizer(opt)
    assert type(opt).__name__ == "SGD" and opt.learning_rate.numpy() == pytest.approx(1.0)
    a, b = keras.Variable(np.ones((2,), "float32")), keras.Variable(np.ones((3,), "float32"))
    opt.apply([tf.ones((2,)), tf.ones((3,)) * 4], [a, b])
    # the "all-reduced" gradient (x0.5) was applied: 1 - 0.5 and 1 - 2
    np.testing.assert_allclose(a.numpy(), [0.5, 0.5])
    np.testing.assert_allclose(b.numpy(), [-1.0, -1.0, -1.0])
    assert fake.calls == [("grouped_allreduce", 2, "Average", "compression.fp16")]


def test_allreduce_keeps_none_gradients_and_gathers_sparse_ones_as_slices() -> None:
    fake = FakeHvd(scale=2.0)
    sparse = tf.IndexedSlices(tf.constant([[1.0, 3.0]]), tf.constant([1]), tf.constant([3, 2]))
    out = th_optimizer.allreduce_gradients(fake, [None, tf.constant([1.0]), sparse], compression="c")
    assert out[0] is None
    np.testing.assert_allclose(out[1].numpy(), [2.0])
    assert isinstance(out[2], tf.IndexedSlices)  # every rank's slices, values / 2 ranks, duplicates kept
    np.testing.assert_allclose(out[2].values.numpy(), [[0.5, 1.5], [0.5, 1.5]])
    np.testing.assert_array_equal(out[2].indices.numpy(), [1, 1])
    assert fake.calls == [("grouped_allreduce", 1, "Average", "c"), ("allgather", (1, 2)), ("allgather", (1,))]
    assert th_optimizer.allreduce_gradients(fake, [None], compression="c") == [None]


def test_gathered_slices_train_what_keras_adam_trains_on_them() -> None:
    """Keras' Adam applies two slices of one row differently from their sum: the gathered slices must reach it
    as slices (as under MirroredStrategy), not densified."""
    def trained(grad: object) -> np.ndarray:
        var = keras.Variable(np.zeros((3, 2), "float32"))
        opt = keras.optimizers.Adam(1e-3)
        opt.build([var])
        opt.apply([grad], [var])
        return var.numpy()

    slices = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([0, 0]), tf.constant([3, 2]))
    gathered = th_optimizer.allreduce_gradients(FakeHvd(size=1), [slices], compression="c")[0]
    np.testing.assert_array_equal(trained(gathered), trained(slices))
    assert not np.allclose(trained(tf.convert_to_tensor(slices)), trained(slices), rtol=0, atol=1e-5)


def test_wrapping_twice_returns_the_same_optimizer() -> None:
    fake = FakeHvd()
    opt = th.distributed_optimizer(keras.optimizers.Adam(), _hvd=fake)
    assert th.distributed_optimizer(opt, _hvd=fake) is opt


def test_unknown_compression_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        th.distributed_optimizer(keras.optimizers.Adam(), compression="int8", _hvd=FakeHvd())
    assert "compression: unknown value 'int8'; valid values are: 'none', 'fp16'" in str(info.value)


def test_a_built_optimizer_is_refused() -> None:
    opt = keras.optimizers.Adam()
    opt.build([keras.Variable(np.zeros((2,), "float32"))])
    with pytest.raises(ConfigError) as info:
        th.distributed_optimizer(opt, _hvd=FakeHvd())
    assert "optimizer: received a built Adam" in str(info.value) and "before the first fit" in str(info.value)


def test_mixed_float16_wraps_the_loss_scale_optimizer_so_all_ranks_skip_together() -> None:
    old = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        opt = th.distributed_optimizer(keras.optimizers.Adam(0.01), _hvd=FakeHvd())
    finally:
        keras.config.set_dtype_policy(old)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) and th.is_distributed_optimizer(opt)
    assert isinstance(opt.inner_optimizer, keras.optimizers.Adam)


def test_fit_with_wrapper_and_callbacks_then_save_and_load(tmp_path) -> None:
    fake = FakeHvd(scale=1.0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=th.distributed_optimizer(keras.optimizers.Adam(0.01), _hvd=fake), loss="mse",
                  jit_compile=False)
    local: List[float] = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: local.append(logs["loss"]))
    callbacks = [th.BroadcastVariablesCallback(_hvd=fake), record, th.GlobalMetricsCallback(_hvd=fake)]
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=callbacks)
    kinds = [c[0] for c in fake.calls]
    assert kinds[0] == "broadcast_variables" and "grouped_allreduce" in kinds and kinds[-1] == "grouped_allreduce"
    assert fake.calls[-1][2] == "Sum"  # the metric states, summed at the epoch's end
    broadcast = fake.calls[0][1]
    # model variables + built optimizer variables (iterations, learning rate, m and v slots), all tf.Variables
    assert all(isinstance(v, tf.Variable) for v in broadcast)
    assert len(broadcast) == len(model.variables) + len(model.optimizer.variables) > len(model.variables)
    # GlobalMetricsCallback runs before History: History records the metrics of the "summed" state (the fake
    # all-reduce leaves the values as they are with scale=1.0: one rank)
    assert history.history["loss"] == [pytest.approx(local[0])]
    path = tmp_path / "m.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert type(restored.optimizer) is keras.optimizers.Adam  # checkpoints carry the plain optimizer


def test_in_place_wrapping_keeps_the_users_object_schedule_clipping_and_state() -> None:
    """tfaccel.fit wraps model.optimizer in place (distribute_in_place): nothing is rebuilt from config."""
    fake = FakeHvd(scale=0.5)
    schedule = keras.optimizers.schedules.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
    opt = keras.optimizers.SGD(learning_rate=schedule, clipvalue=10.0)
    a = keras.Variable(np.ones((2,), "float32"))
    opt.apply([tf.ones((2,))], [a])  # already built and stepped once: its state must survive the wrap
    assert th.distribute_in_place(opt, compression="fp16", _hvd=fake) is opt
    assert th.is_distributed_optimizer(opt) and isinstance(opt, keras.optimizers.SGD) and type(opt).__name__ == "SGD"
    assert opt._learning_rate is schedule and opt.clipvalue == 10.0 and int(opt.iterations.numpy()) == 1
    assert th.distribute_in_place(opt, _hvd=fake) is opt  # twice: the same object, wrapped once
    opt.apply([tf.ones((2,)) * 4], [a])
    # step 2 at rate 1.0 * 0.5**1 with the "all-reduced" gradient (x0.5 = 2): 0 - 0.5 * 2 after 1 - 1 * 1
    np.testing.assert_allclose(a.numpy(), [-1.0, -1.0])
    assert fake.calls == [("grouped_allreduce", 1, "Average", "compression.fp16")]


def test_in_place_wrapping_checks_the_optimizer_first() -> None:
    with pytest.raises(ConfigError, match=r"optimizer: received builtins.object, which is not a Keras 3 optimizer"):
        th.distribute_in_place(object(), _hvd=FakeHvd())


def test_global_metrics_sum_the_metric_states_of_the_ranks() -> None:
    """Two "ranks" whose states the fake all-reduce doubles: a mean stays the mean, AUC is read from summed
    confusion counts, and the train logs are taken before evaluate resets the metrics."""
    fake = FakeHvd(scale=2.0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")[:, None]
    cb = th.GlobalMetricsCallback(_hvd=fake)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, validation_data=(x, y), callbacks=[cb])
    plain = keras.models.clone_model(model)
    plain.compile(loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    plain.set_weights(model.get_weights())
    expected_val = plain.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    assert history.history["val_auc"] == [pytest.approx(expected_val["auc"])]  # doubled counts: same AUC
    assert history.history["val_loss"] == [pytest.approx(expected_val["loss"], rel=1e-6)]  # total/count: same
    assert [c[0] for c in fake.calls] == ["grouped_allreduce", "grouped_allreduce"]  # train state, val state
    assert all(c[2] == "Sum" for c in fake.calls)


def test_tf_variable_error_names_the_variable() -> None:
    class Unbuilt:
        path = "dense/kernel"
        value = tf.constant(1.0)

    with pytest.raises(Exception) as info:
        th_callbacks._tf_variable(Unbuilt())
    assert "cannot broadcast variable 'dense/kernel'" in str(info.value) and "build the model" in str(info.value)


# --------------------------------------------------------------------------------------------- GPU pinning

class FakeDevices:
    def __init__(self, gpus: int, *, initialized: bool = False, visible: Any = None) -> None:
        self.gpus = [f"GPU:{i}" for i in range(gpus)]
        self.initialized = initialized
        self.visible = list(self.gpus) if visible is None else visible
        self.growth: List[Any] = []

    def list_physical_devices(self, kind: str) -> List[Any]:
        return list(self.gpus) if kind == "GPU" else ["CPU:0"]

    def is_initialized(self) -> bool:
        return self.initialized

    def get_visible_devices(self, kind: str) -> List[Any]:
        return list(self.visible)

    def set_visible_devices(self, devices: List[Any], kind: str) -> None:
        self.visible = list(devices)

    def set_memory_growth(self, device: Any, enable: bool) -> None:
        self.growth.append((device, enable))


def test_pin_gpu_to_local_rank() -> None:
    devices = FakeDevices(4)
    assert th.pin_gpu_to_local_rank(2, _backend_override=devices) == 2
    assert devices.visible == ["GPU:2"] and devices.growth == [("GPU:2", True)]


def test_pin_gpu_without_gpus_does_nothing() -> None:
    devices = FakeDevices(0)
    assert th.pin_gpu_to_local_rank(1, _backend_override=devices) is None
    assert devices.visible == []


def test_more_ranks_than_gpus_share_with_a_warning(log_records) -> None:
    devices = FakeDevices(2)
    assert th.pin_gpu_to_local_rank(3, _backend_override=devices) == 1
    assert "local rank 3 shares GPU 1: only 2 GPU(s) on this host" in log_records.text(logging.WARNING)


def test_pin_gpu_after_tensorflow_initialised() -> None:
    assert th.pin_gpu_to_local_rank(1, _backend_override=FakeDevices(2, initialized=True, visible=["GPU:1"])) == 1
    with pytest.raises(DeviceError) as info:
        th.pin_gpu_to_local_rank(1, _backend_override=FakeDevices(2, initialized=True))
    assert "cannot pin local rank 1 to GPU 1: TensorFlow already initialised its devices with 2 visible" \
        in str(info.value)
    assert "before any TensorFlow op runs" in str(info.value)


# ------------------------------------------------------------------------------------------------ backend

def test_make_backend_describes_horovod(monkeypatch) -> None:
    monkeypatch.setenv("HOROVOD_RANK", "1")
    fake = FakeHvd(size=2, rank=1, local_rank=1)
    devices = FakeDevices(2)
    backend = th.make_backend(devices=None, task=None, compression="fp16", _hvd=fake, _device_backend=devices)
    assert fake.initialized and devices.visible == ["GPU:1"]
    assert (backend.name, backend.num_replicas_in_sync, backend.num_workers, backend.worker_index) == \
        ("horovod", 2, 2, 1)
    assert backend.is_chief is False and backend.uses_keras_fit and backend.input_shard == (2, 1)
    assert backend.strategy is tf.distribute.get_strategy()
    assert backend.supports_jit is False and "not XLA ops" in backend.jit_note
    given = keras.optimizers.Adam()
    assert backend.wrap_optimizer(given) is given and th.is_distributed_optimizer(given)  # wrapped in place
    cbs = backend.extra_callbacks()
    assert [type(c).__name__ for c in cbs] == ["BroadcastVariablesCallback", "GlobalMetricsCallback"]
    rank0 = th.make_backend(devices=None, task=None, pin_gpu=False, _hvd=FakeHvd(size=3, rank=0))
    assert rank0.is_chief and rank0.num_replicas_in_sync == 3


def test_make_backend_unknown_option_and_compression() -> None:
    with pytest.raises(ConfigError) as info:
        th.make_backend(devices=None, task=None, fusion_mb=64, _hvd=FakeHvd())
    assert "strategy 'horovod': unknown option(s) ['fusion_mb']; valid options are: compression, pin_gpu" \
        in str(info.value)
    with pytest.raises(ConfigError, match="compression: unknown value 'bf16'"):
        th.make_backend(devices=None, task=None, compression="bf16", _hvd=FakeHvd())


def test_make_backend_warns_outside_horovodrun_and_about_a_cluster_task(monkeypatch, clean_tf_config,
                                                                       log_records) -> None:
    class Task:
        num_tasks, source, name = 2, "TF_CONFIG", "worker:0"

    th.make_backend(devices=None, task=Task(), pin_gpu=False, _hvd=FakeHvd())
    text = log_records.text(logging.WARNING)
    assert "not started by horovodrun; it runs as a single rank" in text
    assert "tfaccel launch --backend horovod -np N" in text
    assert "ignoring the TF_CONFIG cluster description (task worker:0)" in text


def test_launched_by_horovod() -> None:
    assert th.launched_by_horovod({"HOROVOD_RANK": "0"})
    assert th.launched_by_horovod({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"})
    assert not th.launched_by_horovod({"OMPI_COMM_WORLD_RANK": "0"})


def test_import_horovod_not_installed_points_to_the_install_script(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)  # makes `import horovod.tensorflow` fail
    with pytest.raises(BackendUnavailableError) as info:
        th.import_horovod()
    assert "strategy 'horovod': cannot import horovod.tensorflow" in str(info.value)
    assert "bash scripts/install_horovod.sh .venv" in str(info.value)


def test_import_horovod_that_does_not_load_or_lacks_gloo(monkeypatch) -> None:
    import types

    broken = types.ModuleType("horovod.tensorflow")

    def __getattr__(name: str) -> Any:
        raise OSError("undefined symbol: _ZN10tensorflow8OpKernel")

    broken.__getattr__ = __getattr__
    parent = types.ModuleType("horovod")
    monkeypatch.setitem(sys.modules, "horovod", parent)
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", broken)
    parent.tensorflow = broken
    with pytest.raises(BackendUnavailableError) as info:
        th.import_horovod()
    assert "installed but does not load (OSError: undefined symbol" in str(info.value)
    assert "add --force" in str(info.value)
    no_gloo = types.ModuleType("horovod.tensorflow")
    no_gloo.gloo_built = lambda: False
    parent.tensorflow = no_gloo
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", no_gloo)
    with pytest.raises(BackendUnavailableError, match="built without Gloo"):
        th.import_horovod()


@pytest.mark.horovod
def test_horovod_is_built_here() -> None:
    """CI builds Horovod (scripts/install_horovod.sh); this fails loudly when that did not work."""
    hvd = require_horovod()
    assert hvd.gloo_built()
    import horovod

    assert horovod.__version__ == "0.28.1"


def test_stop_together_stops_every_rank_when_one_asks() -> None:
    """A rank whose TerminateOnNaN fired (its local loss) stops the others at the same step: the fake all-reduce
    adds 1, as if the other rank had set stop_training; without it this rank would go on into the next
    all-reduce alone and the job would hang."""
    fake = FakeHvd()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    seen = []
    after = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[th.StopTogetherCallback(_hvd=fake), after])
    assert seen == [0] and model.stop_training  # stopped after the first step, in the first epoch
    assert fake.calls == [("allreduce", "Sum", "tfaccel_stop_training")]
