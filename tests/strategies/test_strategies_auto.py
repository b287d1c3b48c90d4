"""strategy="auto": the order of the rules, each with its reason, from injected devices, clusters and env."""

import pytest

from tfaccel.cluster import ClusterSpec, TaskInfo
from tfaccel.devices import DeviceInfo, GpuInfo
from tfaccel.strategies import registry
from tfaccel.strategies.auto import choose_strategy


def _gpus(n: int, cc=(8, 0)):
    return tuple(GpuInfo(index=i, name=f"/physical_device:GPU:{i}", compute_capability=cc) for i in range(n))


def _task(workers: int, ps: int = 0, chief: bool = False, evaluator: bool = False, task="worker:0"):
    spec = ClusterSpec.from_hosts(workers=[f"localhost:{2000 + i}" for i in range(workers)],
                                  ps=[f"localhost:{3000 + i}" for i in range(ps)],
                                  chief="localhost:4000" if chief else None,
                                  evaluator="localhost:5000" if evaluator else None)
    kind, index = task.split(":")
    return TaskInfo(spec, kind, int(index))


TPU = DeviceInfo(tpu_address="grpc://10.0.0.2:8470")
NO_HVD = {}
HVD = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}

CASES = [
    # id, devices, task, environ, expected name, words expected in the reason
    ("tpu-wins-over-everything", DeviceInfo(gpus=_gpus(8), tpu_address="local"), _task(2), HVD, "tpu", "TPU"),
    ("tpu-colab", TPU, None, NO_HVD, "tpu", "10.0.0.2:8470"),
    ("two-workers", DeviceInfo(gpus=_gpus(4)), _task(2), HVD, "multi_worker", "2 tasks"),
    ("chief-and-workers", DeviceInfo(), _task(2, chief=True, task="chief:0"), NO_HVD, "multi_worker", "3 tasks"),
    ("ps-cluster", DeviceInfo(), _task(2, ps=1, chief=True, task="chief:0"), NO_HVD, "parameter_server", "ps"),
    ("single-task-cluster-falls-through", DeviceInfo(gpus=_gpus(1)), _task(1), NO_HVD, "one_device", "one GPU"),
    ("evaluator-runs-alone", DeviceInfo(), _task(2, evaluator=True, task="evaluator:0"), NO_HVD, "default",
     "evaluator"),
    ("worker-plus-evaluator-is-one-task", DeviceInfo(), _task(1, evaluator=True), NO_HVD, "default", "single CPU"),
    ("horovod-rank", DeviceInfo(gpus=_gpus(2)), None, HVD, "horovod", "HOROVOD_RANK"),
    ("horovod-mpi", DeviceInfo(), None, {"OMPI_COMM_WORLD_SIZE": "4"}, "horovod", "OMPI_COMM_WORLD_SIZE"),
    ("four-gpus", DeviceInfo(gpus=_gpus(4)), None, NO_HVD, "mirrored", "4 GPUs"),
    ("two-old-gpus", DeviceInfo(gpus=_gpus(2, (6, 0))), None, NO_HVD, "mirrored", "2 GPUs"),
    ("one-gpu", DeviceInfo(gpus=_gpus(1, (7, 5))), None, NO_HVD, "one_device", "GPU:0"),
    ("virtual-cpus", DeviceInfo(num_cpu_devices=2), None, NO_HVD, "mirrored", "2 virtual CPU"),
    ("plain-cpu", DeviceInfo(), None, NO_HVD, "default", "single CPU"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_auto_table(case) -> None:
    _, devices, task, environ, expected, words = case
    name, reason = choose_strategy(devices=devices, task=task, environ=environ)
    assert name == expected, reason
    assert words in reason


def test_cpu_count_only_asked_when_needed() -> None:
    calls = []

    def count() -> int:
        calls.append(1)
        return 3

    assert choose_strategy(devices=DeviceInfo(gpus=_gpus(1)), task=None, environ={}, count_cpus=count)[0] == "one_device"
    assert calls == []  # counting CPUs initialises TensorFlow: not done when a GPU already decided
    name, reason = choose_strategy(devices=DeviceInfo(), task=None, environ={}, count_cpus=count)
    assert (name, calls) == ("mirrored", [1]) and "3 virtual CPU" in reason


def test_choose_reads_tf_config(clean_tf_config, monkeypatch) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"], '
                                    '"chief": ["localhost:4"]}, "task": {"type": "chief", "index": 0}}')
    name, reason, _, task = registry.choose("auto", devices=DeviceInfo())
    assert name == "parameter_server" and "4 tasks" in reason and task.name == "chief:0"


def test_explicit_name_reason(clean_tf_config) -> None:
    assert registry.choose("mirrored", devices=DeviceInfo())[:2] == ("mirrored", "requested explicitly")
