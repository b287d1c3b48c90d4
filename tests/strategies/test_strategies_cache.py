"""One backend per request per process (issue 13, point 2).

In this process (2 virtual CPUs): the same request gives the same object, however it is spelt ("auto" and the
name it picks included); a second, different collective request is refused before anything is built; default /
one_device and the one mirrored strategy train side by side; reset_backends forgets only non-collective ones.
In real processes: a 2-worker cluster holds one MultiWorkerMirroredStrategy whatever asks for it; the
tutorial's order (strategy, dataset, compile_and_fit(strategy="auto")) completes under `tfaccel launch`;
"auto" under Horovod's launch environment is a clear error for get_strategy and the horovod backend for
get_backend.
"""

import os
from pathlib import Path
from typing import Any, List, Tuple

import numpy as np
import pytest

import harness
import strategies_two_runs
import tfaccel
from tfaccel.devices import DeviceInfo
from tfaccel.errors import ConfigError
from tfaccel.plan import resolve_plan
from tfaccel.strategies import get_backend, get_strategy
from tfaccel.strategies.auto import horovod_auto_strategy_error
from tfaccel.strategies.registry import BackendRequest, reset_backends

CPU2 = DeviceInfo(num_cpu_devices=2)
HERE = Path(__file__).resolve().parent
MIRRORED_HERE = ("mirrored(cross_device_ops='reduce_to_one_device', device_names=('/device:CPU:0', "
                 "'/device:CPU:1'))")
FIX = ("Fix: ask for the same strategy and options as the first request (tfaccel's scope(), fit() and "
       "get_strategy()/get_backend() then hand back that one), or restart the process (in a notebook: restart the "
       "kernel) to use other options")
WHY = ("TensorFlow numbers the collectives of every MirroredStrategy / MultiWorkerMirroredStrategy in a process "
       "from the same keys, so a second one collides with the first (a hang in the first variable's broadcast, or "
       "'group is already full' / 'expected shape' errors). ")


def _tiny_fit(backend: Any, seed: int = 0) -> Tuple[Any, List[float]]:
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    keras.utils.set_random_seed(seed)
    with backend.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=8, verbose=0)
    return model, history.history["loss"]


def test_same_request_same_backend(clean_tf_config, cpu_replicas) -> None:
    import tensorflow as tf

    mirrored = get_backend("auto")  # this process: 2 virtual CPUs -> mirrored
    assert mirrored.name == "mirrored"
    assert get_backend("auto") is mirrored
    assert get_backend("mirrored") is mirrored and get_backend("mirrored", devices=CPU2) is mirrored
    assert get_strategy("auto") is mirrored.strategy and tfaccel.get_strategy("mirrored") is mirrored.strategy
    assert resolve_plan(strategy="auto")[1] is mirrored and resolve_plan(strategy="mirrored")[1] is mirrored
    # the same options spelt out, another spelling of the devices, a tuple instead of a list:
    assert get_backend("mirrored", cross_device_ops="reduce_to_one_device") is mirrored
    assert get_backend("mirrored", device_names=list(cpu_replicas)) is mirrored
    assert get_backend("mirrored", device_names=("/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1")) is mirrored
    default = get_backend("default")
    assert default.strategy is tf.distribute.get_strategy()
    assert get_backend("default", devices=CPU2) is default and get_strategy("default") is default.strategy
    one = get_backend("one_device")
    assert get_backend("one_device", device="/cpu:0") is one
    assert get_backend("one_device", device="/device:CPU:0") is one
    other = get_backend("one_device", device="/cpu:1")  # another device: another request, another object
    assert other is not one
    assert other.strategy.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:1",)


def test_second_mirrored_with_other_options_is_refused(clean_tf_config, cpu_replicas) -> None:
    import tensorflow as tf

    mirrored = get_backend("mirrored", devices=CPU2)
    with pytest.raises(ConfigError) as err:
        get_backend("mirrored", devices=CPU2, cross_device_ops="hierarchical_copy")
    assert str(err.value) == (
        f"strategy 'mirrored': this process already built {MIRRORED_HERE}, and the request mirrored("
        "cross_device_ops='hierarchical_copy', device_names=('/device:CPU:0', '/device:CPU:1')) would build a second "
        "collective strategy; they differ in cross_device_ops ('hierarchical_copy' here, 'reduce_to_one_device' "
        f"before). {WHY}{FIX}")
    with pytest.raises(ConfigError, match=r"the request mirrored\(cross_device_ops='reduce_to_one_device', "
                                          r"device_names=\('/device:CPU:0',\)\) would build a second collective "
                                          r"strategy; they differ in device_names \(\('/device:CPU:0',\) here"):
        get_strategy("mirrored", device_names=[cpu_replicas[0]])  # other devices collide too (same group keys)
    ops = tf.distribute.ReductionToOneDevice()
    with pytest.raises(ConfigError, match=r"they differ in cross_device_ops \(<tensorflow.*ReductionToOneDevice"):
        get_backend("mirrored", cross_device_ops=ops)  # an instance is its own request
    assert get_backend("auto") is mirrored  # the refusals changed nothing


def test_invalid_option_is_reported_before_any_conflict(clean_tf_config, cpu_replicas) -> None:
    get_backend("mirrored", devices=CPU2)
    with pytest.raises(ConfigError, match=r"mirrored: cross_device_ops: unknown value 'fast'; valid values are"):
        get_backend("mirrored", devices=CPU2, cross_device_ops="fast")
    with pytest.raises(ConfigError, match=r"multi_worker: implementation: unknown value 'gloo'"):
        get_backend("multi_worker", devices=CPU2, implementation="gloo")


def test_multi_worker_after_mirrored_is_refused_before_building(clean_tf_config, cpu_replicas) -> None:
    get_backend("mirrored", devices=CPU2)
    with pytest.raises(ConfigError) as err:
        get_strategy("multi_worker")
    assert str(err.value) == (
        f"strategy 'multi_worker': this process already built {MIRRORED_HERE}, and the request multi_worker("
        "apply_compat=True, bytes_per_pack=0, heartbeat_timeout_seconds=20.0, implementation='auto', startup_timeout_seconds=60.0, "
        "task=None, timeout_seconds=0.0) would build a second collective strategy; they differ in the strategy "
        f"('multi_worker' here, 'mirrored' before). {WHY}{FIX}")


def test_default_and_mirrored_train_side_by_side(clean_tf_config, cpu_replicas) -> None:
    """A notebook that tries one strategy, then the other, then the first again."""
    default = get_backend("default")
    _, losses = _tiny_fit(default, seed=1)
    assert losses[-1] < 0.5 * losses[0], losses
    mirrored = get_backend("auto")
    model, losses = _tiny_fit(mirrored, seed=2)
    assert mirrored.num_replicas_in_sync == 2 and losses[-1] < 0.5 * losses[0], losses
    copies = [v.numpy() for v in mirrored.strategy.experimental_local_results(model.layers[0].kernel.value)]
    assert len(copies) == 2 and np.array_equal(copies[0], copies[1])
    one = get_backend("one_device", device="/cpu:1")
    _, losses = _tiny_fit(one, seed=3)
    assert losses[-1] < 0.5 * losses[0], losses
    assert get_backend("default") is default
    _, losses = _tiny_fit(default, seed=1)
    assert losses[-1] < 0.5 * losses[0], losses


def test_reset_backends_forgets_only_non_collective_ones(clean_tf_config, cpu_replicas) -> None:
    mirrored = get_backend("mirrored", devices=CPU2)
    default = get_backend("default")
    one = get_backend("one_device")
    forgotten = reset_backends()
    assert {req.name for req in forgotten} >= {"default", "one_device"}
    assert all(not req.collective for req in forgotten) and "mirrored" not in {req.name for req in forgotten}
    assert get_backend("default") is not default and get_backend("one_device") is not one
    assert get_backend("mirrored", devices=CPU2) is mirrored
    assert reset_backends.__doc__ and "cannot be safely" in " ".join(reset_backends.__doc__.split())


def test_request_describes_itself_and_its_differences() -> None:
    first = BackendRequest("multi_worker", (("implementation", "auto"), ("task", "worker:0")), True)
    second = BackendRequest("multi_worker", (("implementation", "ring"), ("task", "worker:0")), True)
    assert second.describe() == "multi_worker(implementation='ring', task='worker:0')"
    assert second.differences(first) == ["implementation ('ring' here, 'auto' before)"]
    assert not second.same_as(first) and first.same_as(BackendRequest("multi_worker", first.options, True))
    array = BackendRequest("x", (("weights", np.zeros(2)),))  # == is ambiguous on arrays: equal only to itself
    assert array.same_as(array) and not array.same_as(BackendRequest("x", (("weights", np.zeros(2)),)))


def test_auto_under_horovod_get_strategy_says_what_to_do(clean_tf_config, monkeypatch) -> None:
    monkeypatch.setenv("HOROVOD_RANK", "0")
    monkeypatch.setenv("HOROVOD_SIZE", "4")
    with pytest.raises(ConfigError) as err:
        tfaccel.get_strategy("auto")
    assert str(err.value) == (
        "get_strategy('auto'): this process is a Horovod rank: Horovod's launch environment is present "
        "(HOROVOD_RANK is set). Horovod has no tf.distribute strategy: the one returned would be TensorFlow's "
        "default strategy, and a plain model.fit under it trains 4 independent models (one per rank) without any "
        "error. For a Keras script use `with tfaccel.scope(): <build and compile the model>` then "
        "`tfaccel.fit(model, ...)`: tfaccel wraps the optimizer, broadcasts the initial weights, shards the data "
        "and averages the metrics over the ranks. For a custom training loop use `backend = "
        "tfaccel.get_backend('horovod')` (backend.wrap_optimizer(optimizer), backend.extra_callbacks(), "
        "backend.input_shard). To train one model per process on purpose, ask for get_strategy('default')")
    assert "one independent model per rank without" in str(horovod_auto_strategy_error("x", environ={}))
    assert "one independent model per rank without" in str(horovod_auto_strategy_error("x", environ={
        "HOROVOD_SIZE": "1"}))


HOROVOD_AUTO = """
import json
import tfaccel
from tfaccel.plan import resolve_plan
backend = tfaccel.get_backend("auto")
try:
    tfaccel.get_strategy("auto")
    refused = ""
except tfaccel.ConfigError as exc:
    refused = str(exc)
print(json.dumps({"name": backend.name, "reason": backend.reason, "same": tfaccel.get_backend("horovod") is backend,
                  "plan": resolve_plan(strategy="auto")[0].strategy, "refused": refused,
                  "default": tfaccel.get_strategy("default") is tfaccel.get_backend("default").strategy}))
"""


@pytest.mark.horovod
def test_auto_under_horovod_get_backend_is_the_horovod_backend() -> None:
    """Horovod's launch variables injected into one process (no horovodrun): a single rank."""
    if os.environ.get("TFACCEL_NO_HOROVOD") == "1":
        pytest.skip("TFACCEL_NO_HOROVOD=1: Horovod deliberately not built here")
    results = harness.run_tasks(HOROVOD_AUTO, tasks=[("rank", 0, None)], timeout=90,
                                env={"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"})
    harness.assert_all_ok(results)
    out = harness.last_json_line(results[0].stdout)
    assert out["name"] == "horovod" and out["same"] and out["plan"] == "horovod" and out["default"], out
    assert out["reason"] == "Horovod with 1 rank(s) (Gloo ring all-reduce), this is rank 0"
    assert out["refused"].startswith("get_strategy('auto'): this process is a Horovod rank: Horovod's launch "
                                     "environment is present (HOROVOD_RANK is set).")


def test_two_workers_hold_one_multi_worker_strategy() -> None:
    """Real 2-worker cluster: every way of asking gives the one strategy; other requests are refused, no hang."""
    results = harness.run_tasks(HERE / "strategies_cache_program.py", workers=2, timeout=150)
    harness.assert_all_ok(results)
    out = [harness.last_json_line(r.stdout) for r in results]
    for index, res in enumerate(out):
        assert res["same"] == {"auto": True, "get_strategy_auto": True, "get_strategy_named": True,
                               "defaults_spelt_out": True, "plan": True}, res
        task = f"task='worker:{index} of TF_CONFIG cluster (worker "
        first = ("multi_worker(apply_compat=True, bytes_per_pack=0, heartbeat_timeout_seconds=20.0, "
                 f"implementation='auto', startup_timeout_seconds=60.0, {task}")
        assert res["other_options"]["type"] == "ConfigError"
        message = res["other_options"]["message"]
        assert message.startswith(f"strategy 'multi_worker': this process already built {first}"), message
        assert ("implementation='ring', startup_timeout_seconds=60.0, " + task) in message
        assert message.endswith(f"they differ in implementation ('ring' here, 'auto' before). {WHY}{FIX}")
        assert res["mirrored"]["type"] == "ConfigError"
        assert res["mirrored"]["message"].startswith(f"strategy 'mirrored': this process already built {first}")
        assert res["mirrored"]["message"].endswith(
            f"they differ in the strategy ('mirrored' here, 'multi_worker' before). {WHY}{FIX}")
        assert res["default_is_tf_default"] and res["backend_still_same"]
        assert (res["replicas"], res["worker_index"]) == (2, index)
    # different initial weights per worker, one strategy: identical after training
    assert out[0]["weights_sha"] == out[1]["weights_sha"] and out[0]["loss"] == out[1]["loss"]


@pytest.mark.slow
@pytest.mark.parametrize("route", strategies_two_runs.ROUTES)
def test_two_strategies_order_completes_under_launch(route: str) -> None:
    """The TF tutorial's order: get_strategy("multi_worker"), a dataset, then compile_and_fit(strategy="auto")
    (or `with tfaccel.scope():` build + compile, then tfaccel.fit). scripts/two_strategies_runs.py counts 20."""
    outcome = strategies_two_runs.run_once(route=route, timeout=150, track=harness.STARTED_PIDS.extend)
    assert outcome.status == "completed", outcome.describe()
    reports = outcome.reports
    assert all(r["same_strategy"] and r["replicas"] == 2 and r["route"] == route for r in reports.values()), reports
    assert reports[0]["weights_sha"] == reports[1]["weights_sha"] and reports[0]["loss"] == reports[1]["loss"]
    assert reports[0]["loss"][-1] < reports[0]["loss"][0]
