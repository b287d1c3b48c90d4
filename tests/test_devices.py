import subprocess
import sys
import textwrap

import pytest

import tfaccel
from tfaccel.devices import DeviceInfo, configure_devices, detect_devices, tpu_address_hint
from tfaccel.errors import ConfigError, DeviceError


class FakeDevice:
    def __init__(self, name: str, device_type: str) -> None:
        self.name, self.device_type = name, device_type


class FakeBackend:
    """Stands in for tf.config on a machine with GPUs (this one has none)."""

    def __init__(self, gpus=(), initialized=False, details=None, logical_cpus=1):
        self.gpus = [FakeDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(len(gpus))]
        self.cpus = [FakeDevice("/physical_device:CPU:0", "CPU")]
        self.details = list(gpus)
        self.initialized = initialized
        self.logical_cpus = logical_cpus
        self.calls = []
        self.visible = list(self.gpus)

    def is_initialized(self):
        return self.initialized

    def list_physical_devices(self, t):
        return self.gpus if t == "GPU" else self.cpus

    def list_logical_devices(self, t):
        return [FakeDevice(f"/device:CPU:{i}", "CPU") for i in range(self.logical_cpus)]

    def get_visible_devices(self, t):
        return self.visible if t == "GPU" else self.cpus

    def set_visible_devices(self, devices, t):
        self.calls.append(("visible", [d.name for d in devices]))
        self.visible = list(devices)

    def set_memory_growth(self, d, enable):
        self.calls.append(("growth", d.name))

    def set_memory_limit(self, d, mb):
        self.calls.append(("limit", d.name, mb))

    def set_virtual_devices(self, d, n):
        self.calls.append(("virtual", n))

    def get_device_details(self, d):
        return self.details[int(d.name.rsplit(":", 1)[1])]

    def get_memory_info_mb(self, d):
        return None


H100 = {"device_name": "NVIDIA H100", "compute_capability": (9, 0)}
V100 = {"device_name": "Tesla V100", "compute_capability": (7, 0)}


def test_virtual_cpus_in_fresh_process_gives_two_logical_devices():
    code = textwrap.dedent("""
        import tfaccel, tensorflow as tf
        out = tfaccel.configure_devices(virtual_cpus=2)
        print(out["virtual_cpus"], len(tf.config.list_logical_devices("CPU")))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]


def test_this_test_process_has_two_virtual_cpus(cpu_replicas):
    assert len(cpu_replicas) == 2


def test_too_late_raises_clear_error():
    import tensorflow as tf

    tf.constant(1)  # TF is initialised in the test process
    with pytest.raises(DeviceError, match=r"after TensorFlow initialised its devices.*Call tfaccel.configure_devices"):
        configure_devices(virtual_cpus=4)


def test_too_late_but_same_settings_is_not_an_error():
    assert configure_devices(virtual_cpus=2)["changed"] is False


def test_bad_gpu_index_lists_valid_ones():
    be = FakeBackend(gpus=[H100, H100])
    with pytest.raises(ConfigError, match=r"GPU index 2 does not exist; received \[0, 2\], valid indices: 0..1"):
        configure_devices(visible_gpus=[0, 2], _backend_override=be)
    assert be.calls == []  # nothing changed


def test_gpu_index_on_machine_without_gpus():
    with pytest.raises(ConfigError, match="no GPU is visible"):
        configure_devices(visible_gpus=[0], _backend_override=FakeBackend())


def test_repeated_gpu_index():
    with pytest.raises(ConfigError, match="repeated"):
        configure_devices(visible_gpus=[1, 1], _backend_override=FakeBackend(gpus=[H100, H100]))


def test_visible_gpus_must_be_list_of_ints():
    with pytest.raises(ConfigError, match=r"list of GPU indices; received '0,1'"):
        configure_devices(visible_gpus="0,1", _backend_override=FakeBackend(gpus=[H100, H100]))


@pytest.mark.parametrize("bad", [-1, 0, 1.5, True])
def test_memory_limit_must_be_positive_int(bad):
    with pytest.raises(ConfigError, match=rf"memory_limit_mb must be a positive whole number of MiB; received {bad!r}"):
        configure_devices(memory_limit_mb=bad, _backend_override=FakeBackend(gpus=[H100]))


@pytest.mark.parametrize("bad", [0, -2, "2"])
def test_virtual_cpus_must_be_positive(bad):
    with pytest.raises(ConfigError, match=rf"virtual_cpus must be a whole number >= 1; received {bad!r}"):
        configure_devices(virtual_cpus=bad, _backend_override=FakeBackend())


def test_gpu_configuration_calls():
    be = FakeBackend(gpus=[H100, H100, H100])
    out = configure_devices(visible_gpus=[2, 0], _backend_override=be)
    assert be.calls == [("visible", ["/physical_device:GPU:2", "/physical_device:GPU:0"]),
                        ("growth", "/physical_device:GPU:2"), ("growth", "/physical_device:GPU:0")]
    assert out == {"visible_gpus": [2, 0], "memory_growth": True, "memory_limit_mb": None, "virtual_cpus": 1,
                   "changed": True}
    be = FakeBackend(gpus=[H100])
    out = configure_devices(memory_limit_mb=2048, _backend_override=be)
    assert be.calls == [("limit", "/physical_device:GPU:0", 2048)]
    assert out["memory_growth"] is False


def test_detect_devices_with_injected_gpus():
    info = detect_devices(_backend_override=FakeBackend(gpus=[H100, V100]), environ={})
    assert info.num_gpus == 2
    assert info.gpus[0].name == "NVIDIA H100" and info.gpus[0].compute_capability == (9, 0)
    assert info.min_compute_capability == (7, 0)
    assert info.tpu_address is None


def test_detect_devices_real_cpu():
    info = detect_devices()
    assert isinstance(info, DeviceInfo) and info.num_gpus == 0 and info.num_cpu_devices == 2


@pytest.mark.parametrize("env,expected", [
    ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, "grpc://10.0.0.2:8470"),
    ({"TPU_NAME": "my-tpu"}, "my-tpu"),
    ({"TPU_ACCELERATOR_TYPE": "v4-8"}, "local"),
    ({}, None),
])
def test_tpu_hint(env, expected):
    assert tpu_address_hint(env) == expected


def test_public_names_are_exported():
    for name in tfaccel.__all__:
        assert getattr(tfaccel, name) is not None
