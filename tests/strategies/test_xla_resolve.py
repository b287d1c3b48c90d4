"""jit_compile resolution: auto per backend with reasons, explicit True falling back with a warning, and the
two measured failures (multi-device Mirrored, MultiWorkerMirrored on CPUs) still reproduced."""

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from strategies_logs import tfaccel_records  # noqa: E402

from tfaccel.devices import DeviceInfo, GpuInfo  # noqa: E402
from tfaccel.errors import ConfigError  # noqa: E402
from tfaccel.strategies import Backend, get_backend  # noqa: E402
from tfaccel.xla import CPU_PER_JOB_NOTE, resolve_jit  # noqa: E402

PROGRAM = Path(__file__).with_name("strategies_fit_program.py")
CPU = DeviceInfo()
GPU = DeviceInfo(gpus=(GpuInfo(0, "GPU0", (8, 0)),))


def _sketch(name, replicas=1, supports=True, note=""):
    return Backend(name=name, strategy=None, num_replicas_in_sync=replicas, supports_jit=supports, jit_note=note)


@pytest.mark.parametrize("backend, devices, expected, words", [
    (_sketch("default"), CPU, False, "auto, one CPU device: decided per job by tfaccel.fit"),
    (_sketch("one_device"), GPU, True, "one GPU replica"),
    (_sketch("mirrored", 4, False, "several devices fail"), GPU, False, "several devices fail"),
    (_sketch("multi_worker", 4), GPU, False, "not measured on multi-GPU"),
    (_sketch("horovod", 2), GPU, False, "HOROVOD_ENABLE_XLA_OPS"),
    (_sketch("tpu", 8), DeviceInfo(tpu_address="local"), False, "compiled by XLA already"),
    (_sketch("custom", 2), CPU, False, "XLA not measured with it"),
])
def test_auto(backend, devices, expected, words) -> None:
    on, reason = resolve_jit("auto", backend=backend, devices=devices)
    assert on is expected and words in reason


def test_explicit_values_and_errors() -> None:
    assert resolve_jit(False, backend=_sketch("default"), devices=GPU) == (False, "requested off")
    assert resolve_jit(True, backend=_sketch("multi_worker", 4), devices=GPU) == (True, "requested on")
    with pytest.raises(ConfigError, match=r"jit_compile: unknown value 'yes'; valid values are: 'auto', True, False"):
        resolve_jit("yes", backend=_sketch("default"), devices=CPU)


def test_mirrored_over_two_cpus_turns_jit_off(clean_tf_config, cpu_replicas) -> None:
    backend = get_backend("mirrored", devices=DeviceInfo(num_cpu_devices=2))
    on, reason = resolve_jit("auto", backend=backend, devices=CPU)
    assert not on and "Trying to access resource ... located in device CPU:1 from device CPU:0" in reason
    with tfaccel_records() as records:
        on, reason = resolve_jit(True, backend=backend, devices=CPU)
    assert not on and reason.startswith("requested on, fell back to off: jit_compile=True fails under MirroredStrategy")
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        "jit_compile=True cannot work here, falling back to jit_compile=False: jit_compile=True fails under "
        "MirroredStrategy over several devices")


def test_the_mirrored_failure_is_real(clean_tf_config, cpu_replicas) -> None:
    """The reason the rule exists: XLA under MirroredStrategy over 2 devices fails (retire the rule when it passes)."""
    import keras
    import tensorflow as tf

    backend = get_backend("mirrored", devices=DeviceInfo(num_cpu_devices=2))
    x = np.ones((32, 3), "float32")
    with backend.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    with pytest.raises(Exception, match=r"Trying to access resource .* located in device .*CPU:1 from device .*CPU:0"):
        model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), epochs=1, verbose=0)


def test_one_device_cpu_fit_with_jit(clean_tf_config) -> None:
    import keras
    import tensorflow as tf

    backend = get_backend("one_device", devices=CPU)
    assert resolve_jit("auto", backend=backend, devices=CPU) == (False, CPU_PER_JOB_NOTE)  # fit decides per job
    assert resolve_jit(True, backend=backend, devices=CPU) == (True, "requested on")
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    with backend.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=True, steps_per_execution=4)
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, x.sum(1))).batch(8), epochs=2, verbose=0)
    assert history.history["loss"][1] < history.history["loss"][0]


def test_multi_worker_on_cpus_jit_falls_back() -> None:
    backend = _sketch("multi_worker", 2, supports=False,
                      note="MultiWorkerMirroredStrategy on CPUs: XLA cannot compile collectives for CPU devices")
    with tfaccel_records() as records:
        assert resolve_jit(True, backend=backend, devices=CPU)[0] is False
    assert any("falling back to jit_compile=False: MultiWorkerMirroredStrategy on CPUs" in r.getMessage()
               for r in records)


def test_multi_worker_jit_failure_is_real() -> None:
    """Two workers, compat fix on, jit_compile=True: XLA has no CPU collectives (retire the rule when this passes)."""
    results = harness.run_tasks(PROGRAM, workers=2, timeout=150, args=["--jit"], env={"TFACCEL_DISABLE_COMPAT": ""})
    for result in results:
        out = harness.last_json_line(result.stdout)
        assert not out["ok"] and out["type"] == "UnimplementedError", result.describe()
        assert "Collectives are not yet implemented for CPU devices when compiling with XLA" in out["message"]
