"""The registry: names, options and their errors; default / one_device / mirrored built in this process."""

import json
import sys

import numpy as np
import pytest

import harness
import tfaccel
from tfaccel.cluster import ClusterSpec, TaskInfo
from tfaccel.devices import DeviceInfo
from tfaccel.errors import BackendUnavailableError, ConfigError
from tfaccel.strategies import STRATEGY_NAMES, Backend, get_backend, get_strategy, register_strategy, strategy_entries
from tfaccel.strategies import registry

CPU2 = DeviceInfo(num_cpu_devices=2)


def test_names_are_one_list() -> None:
    assert STRATEGY_NAMES[0] == "auto"
    assert list(strategy_entries()) == list(STRATEGY_NAMES[1:])
    assert all(entry.description for entry in strategy_entries().values())


def test_public_names_are_lazy_exports() -> None:
    assert tfaccel.get_strategy is get_strategy
    assert "get_strategy" in dir(tfaccel)


def test_unknown_name_lists_valid(clean_tf_config) -> None:
    with pytest.raises(ConfigError) as err:
        get_strategy("mirored", devices=CPU2)
    msg = str(err.value)
    assert "strategy: unknown value 'mirored'" in msg
    for name in STRATEGY_NAMES:
        assert repr(name) in msg


def test_unknown_option_lists_valid(clean_tf_config) -> None:
    with pytest.raises(ConfigError) as err:
        get_backend("mirrored", devices=CPU2, cross_device_op="nccl")
    msg = str(err.value)
    assert "unknown option(s) 'cross_device_op'" in msg and "device_names, cross_device_ops" in msg


def test_unknown_option_under_auto_says_what_auto_chose(clean_tf_config) -> None:
    with pytest.raises(ConfigError, match=r"'auto' chose 'mirrored' because no GPU; 2 virtual CPU devices"):
        get_backend("auto", devices=CPU2, implementation="ring")


def test_devices_must_be_device_info(clean_tf_config) -> None:
    with pytest.raises(ConfigError, match=r"devices must be a tfaccel.devices.DeviceInfo.*device_names=\[\.\.\.\]"):
        get_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])


def test_default_and_one_device(clean_tf_config) -> None:
    import tensorflow as tf

    backend = get_backend("default", devices=CPU2)
    assert backend.strategy is tf.distribute.get_strategy() and backend.reason == "requested explicitly"
    one = get_backend("one_device", devices=CPU2)
    assert isinstance(one.strategy, tf.distribute.OneDeviceStrategy) and one.num_replicas_in_sync == 1
    with pytest.raises(ConfigError, match=r"one_device: device must be a device name.*received 3"):
        get_backend("one_device", devices=CPU2, device=3)
    with pytest.raises(ConfigError, match=r"one_device: device: no device '/gpu:0' in this process; valid devices "
                                          r"here: \['/device:CPU:0', '/device:CPU:1'\]"):
        get_backend("one_device", devices=CPU2, device="/gpu:0")
    with pytest.raises(ConfigError, match=r"one_device: device: '/bogus:0' is not a device name"):
        get_backend("one_device", devices=CPU2, device="/bogus:0")


def test_auto_here_is_mirrored_over_virtual_cpus(clean_tf_config, cpu_replicas) -> None:
    # The decision itself: the backend's own reason is the first request's, and an earlier test in this process
    # (pytest -n runs files in another order) may have built the one mirrored backend by name.
    chosen, reason, _, _ = registry.choose("auto")
    assert chosen == "mirrored" and "2 virtual CPU devices" in reason
    backend = get_backend("auto")  # devices detected: the test process has 2 virtual CPUs
    assert backend.name == "mirrored" and backend.num_replicas_in_sync == 2
    assert not backend.supports_jit and "CPU:1 from device CPU:0" in backend.jit_note


@pytest.mark.parametrize("value, message", [
    ("ring", r"unknown value 'ring'.*multi-worker collective implementation.*implementation='ring'"),
    ("fast", r"mirrored: cross_device_ops: unknown value 'fast'; valid values are: 'auto', 'nccl'"),
    ("nccl", r"cross_device_ops='nccl' needs GPUs; the devices here are \[.*CPU:0"),
])
def test_mirrored_cross_device_ops_errors(clean_tf_config, value, message) -> None:
    with pytest.raises(ConfigError, match=message):
        get_backend("mirrored", devices=CPU2, cross_device_ops=value)


MIRRORED_OPTIONS = """
import json, os
import tfaccel
tfaccel.configure_devices(virtual_cpus=2)
from tfaccel.devices import DeviceInfo
from tfaccel.strategies import get_backend
backend = get_backend("mirrored", devices=DeviceInfo(num_cpu_devices=2), **json.loads(os.environ["MIRRORED_OPTIONS"]))
print(json.dumps({"ops": type(backend.strategy.extended._cross_device_ops).__name__,
                  "replicas": backend.num_replicas_in_sync, "supports_jit": backend.supports_jit}))
"""


def test_mirrored_cross_device_ops_choices(clean_tf_config, cpu_replicas) -> None:
    import tensorflow as tf

    auto = get_backend("mirrored", devices=CPU2).strategy
    assert isinstance(auto.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    # One MirroredStrategy per process (a second collides with the first): other options in fresh processes.
    options = {"hier:0": {"cross_device_ops": "hierarchical_copy"}, "one:0": {"device_names": ["/cpu:0"]}}
    results = harness.run_tasks(MIRRORED_OPTIONS, tasks=[("hier", 0, None), ("one", 0, None)], timeout=120,
                                per_task_env={k: {"MIRRORED_OPTIONS": json.dumps(v)} for k, v in options.items()})
    harness.assert_all_ok(results)
    hier, one = (harness.last_json_line(r.stdout) for r in results)
    assert hier["ops"] == "HierarchicalCopyAllReduce" and hier["replicas"] == 2
    assert one["replicas"] == 1 and one["supports_jit"]
    with pytest.raises(ConfigError, match=r"device_names must be a non-empty list.*received '/cpu:0'"):
        get_backend("mirrored", devices=CPU2, device_names="/cpu:0")
    with pytest.raises(ConfigError, match=r"mirrored: device_names: no device '/cpu:9' in this process"):
        get_backend("mirrored", devices=CPU2, device_names=["/cpu:0", "/cpu:9"])
    with pytest.raises(ConfigError, match=r"mirrored: device_names: a device is repeated; received \['/cpu:0', '/cpu:0'\]"):
        get_backend("mirrored", devices=CPU2, device_names=["/cpu:0", "/cpu:0"])


def test_mirrored_fit_over_two_virtual_cpus(clean_tf_config, cpu_replicas) -> None:
    import keras
    import tensorflow as tf

    backend = get_backend("mirrored", devices=CPU2)
    assert backend.num_replicas_in_sync == 2
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    with backend.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    history = model.fit(data, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses
    kernel = model.layers[0].kernel.value  # a MirroredVariable: one copy per virtual CPU, kept identical
    copies = [v.numpy() for v in backend.strategy.experimental_local_results(kernel)]
    assert len(copies) == 2 and np.array_equal(copies[0], copies[1])


@pytest.mark.parametrize("options, message", [
    ({"implementation": "gloo"}, r"multi_worker: implementation: unknown value 'gloo'; valid values are: 'auto', "
                                 r"'ring', 'nccl'"),
    ({"implementation": "nccl"}, r"implementation='nccl' needs GPUs and this process sees none"),
    ({"timeout_seconds": -1}, r"timeout_seconds must be a number of seconds >= 0.*received -1"),
    ({"timeout_seconds": "10"}, r"timeout_seconds must be a number.*received '10'"),
    ({"bytes_per_pack": -1}, r"multi_worker: bytes_per_pack must be a whole number of bytes >= 0 \(0: every "
                             r"gradient in one all-reduce.*received -1. E.g. bytes_per_pack=4 \* 1024 \* 1024"),
    ({"bytes_per_pack": 1.5}, r"bytes_per_pack must be a whole number of bytes >= 0.*received 1.5"),
    ({"bytes_per_pack": True}, r"bytes_per_pack must be a whole number of bytes >= 0.*received True"),
])
def test_multi_worker_option_errors(clean_tf_config, options, message) -> None:
    with pytest.raises(ConfigError, match=message):
        get_backend("multi_worker", devices=CPU2, **options)


def _ps_task(task: str = "chief:0", ps: int = 1, workers: int = 1) -> TaskInfo:
    spec = ClusterSpec.from_hosts(workers=[f"localhost:{2000 + i}" for i in range(workers)],
                                  ps=[f"localhost:{3000 + i}" for i in range(ps)], chief="localhost:4000")
    kind, index = task.split(":")
    return TaskInfo(spec, kind, int(index))


def test_parameter_server_errors(clean_tf_config) -> None:
    with pytest.raises(ConfigError, match=r"parameter_server: no cluster is described; set TF_CONFIG"):
        get_backend("parameter_server", devices=CPU2)
    with pytest.raises(ConfigError, match=r"the cluster has no ps task\(s\); received roles \['chief', 'worker'\]"):
        get_backend("parameter_server", devices=CPU2, task=_ps_task(ps=0))
    with pytest.raises(ConfigError, match=r"this process is task worker:0; only the chief.*tfaccel.launch.server"):
        get_backend("parameter_server", devices=CPU2, task=_ps_task("worker:0"))
    with pytest.raises(ConfigError, match=r"variable_partitioner must be None, a number of shards >= 1.*received 0"):
        get_backend("parameter_server", devices=CPU2, task=_ps_task(), variable_partitioner=0)


def test_horovod_unavailable_says_how_to_install(clean_tf_config, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "horovod", None)  # import fails as if Horovod were not built
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
    with pytest.raises(BackendUnavailableError, match=r"scripts/install_horovod.sh"):
        get_backend("horovod", devices=CPU2)


def test_register_strategy(clean_tf_config) -> None:
    import tensorflow as tf

    from tfaccel.strategies import registry

    def factory(*, devices, task, flavour="plain"):
        return Backend(name="custom", strategy=tf.distribute.get_strategy(), reason=f"flavour {flavour}")

    try:
        register_strategy("custom", description="a test entry", factory=factory, options=("flavour",))
        custom = get_backend("custom", devices=CPU2, flavour="x")
        assert custom.reason == "flavour x"
        assert get_backend("custom", devices=CPU2, flavour="x") is custom  # the same request: the same backend
        plain = get_backend("custom", devices=CPU2)
        assert plain is not custom and get_backend("custom", devices=CPU2, flavour="plain") is plain  # defaults
        with pytest.raises(ConfigError, match=r"'custom' is already registered \(a test entry\); pass replace=True"):
            register_strategy("custom", description="again", factory=factory)
        register_strategy("custom", description="replaced", factory=factory, options=("flavour",), replace=True)
        assert get_backend("custom", devices=CPU2, flavour="x") is not custom  # a replaced entry starts afresh
    finally:
        registry._REGISTRY.pop("custom", None)
    with pytest.raises(ConfigError, match=r"name must be a non-empty string other than 'auto'; received 'auto'"):
        register_strategy("auto", description="no", factory=factory)
    with pytest.raises(ConfigError, match=r"factory must be callable; received 3"):
        register_strategy("x", description="no", factory=3)


def test_slurm_task_gets_a_resolver_built_from_the_task_info() -> None:
    """TF_CONFIG tasks use TF's own resolver; a SLURM TaskInfo is turned into a SimpleClusterResolver."""
    from tfaccel.strategies.builtin import _resolver_for

    spec = ClusterSpec.from_hosts(workers=["node1:2222", "node2:2222"])
    assert _resolver_for(TaskInfo(spec, "worker", 1), CPU2) is None
    resolver = _resolver_for(TaskInfo(spec, "worker", 1, source="SLURM"), CPU2)
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.cluster_spec().as_dict() == {"worker": ["node1:2222", "node2:2222"]}
