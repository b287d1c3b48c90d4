"""The Plan: resolve_plan in this process (2 virtual CPUs), validation before building, describe_auto."""

import json
import types

import pytest

import harness
import tfaccel
from tfaccel.devices import DeviceInfo
from tfaccel.errors import ConfigError
from tfaccel.plan import Plan, resolve_plan
from tfaccel.strategies import registry, tpu


def test_resolve_plan_here(clean_tf_config, cpu_replicas) -> None:
    plan, backend = tfaccel.resolve_plan()
    assert backend.name == "mirrored" and isinstance(plan, Plan)
    assert (plan.strategy, plan.num_replicas, plan.num_workers, plan.worker_index, plan.task, plan.is_chief) == \
        ("mirrored", 2, 1, 0, None, True)
    assert plan.precision == "float32" and plan.precision_reason.startswith("CPU only")
    assert plan.jit_compile is False and "several devices" in plan.jit_reason
    summary = plan.summary()
    # The backend's reason is its first request's: an earlier test in this process may have asked for "mirrored"
    # by name (pytest -n orders files differently); "auto"'s own decision is checked apart.
    chosen, reason, _, _ = registry.choose("auto")
    assert chosen == "mirrored" and reason == "no GPU; 2 virtual CPU devices are configured"
    assert plan.strategy_reason in (reason, "requested explicitly")
    assert summary.startswith(f"strategy mirrored (2 replicas; {plan.strategy_reason}) | precision float32 (CPU only")
    assert "| XLA off (jit_compile=True fails under MirroredStrategy" in summary
    assert json.loads(json.dumps(plan.to_dict()))["strategy_reason"] == plan.strategy_reason
    with pytest.raises(Exception):
        plan.strategy = "x"  # frozen


def test_explicit_choices_and_notes(clean_tf_config) -> None:
    plan, _ = resolve_plan(strategy="one_device", precision="mixed_float16", jit_compile=False,
                           devices=DeviceInfo())
    assert (plan.strategy, plan.strategy_reason, plan.jit_compile, plan.jit_reason) == \
        ("one_device", "requested explicitly", False, "requested off")
    assert plan.precision_reason == "requested explicitly (mixed_float16 on a CPU works but is slower than float32 there)"
    assert any("LossScaleOptimizer" in note for note in plan.notes)


def test_tpu_plan_notes(clean_tf_config, monkeypatch) -> None:
    class Api:
        def resolver(self, address, zone, project):
            return types.SimpleNamespace(master=lambda: address)

        def connect(self, resolver):
            pass

        def initialize(self, resolver):
            pass

        def strategy(self, resolver):
            return types.SimpleNamespace(num_replicas_in_sync=8, extended=types.SimpleNamespace(num_hosts=1))

    monkeypatch.setattr(tpu, "_API", Api())
    monkeypatch.setattr(tpu, "_initialised", set())
    plan, _ = resolve_plan(devices=DeviceInfo(tpu_address="local"))
    assert (plan.strategy, plan.num_replicas, plan.precision, plan.jit_compile) == ("tpu", 8, "mixed_bfloat16", False)
    assert "drop_remainder=True" in " ".join(plan.notes)


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "half"}, r"precision: unknown value 'half'"),
    ({"jit_compile": "on"}, r"jit_compile: unknown value 'on'; valid values are: 'auto', True, False"),
    ({"strategy_options": ["nccl"]}, r"strategy_options must be a dict of the strategy's options; received \['nccl'\]"),
    ({"strategy": "gpu"}, r"strategy: unknown value 'gpu'"),
])
def test_bad_arguments_fail_before_anything_is_built(clean_tf_config, monkeypatch, kwargs, message) -> None:
    def no_build(*args, **kw):
        raise AssertionError("a backend was built before the arguments were checked")

    for entry in list(registry.strategy_entries().values()):
        monkeypatch.setitem(registry._REGISTRY, entry.name, entry.__class__(entry.name, entry.description, no_build,
                                                                            entry.options))
    with pytest.raises(ConfigError, match=message):
        resolve_plan(devices=DeviceInfo(), **kwargs)


def test_plan_checks_its_counts() -> None:
    with pytest.raises(ConfigError, match=r"Plan: inconsistent replica counts; received num_replicas=2, num_workers=2, "
                                          r"worker_index=2"):
        Plan("multi_worker", "r", 2, 2, 2, "worker:2", False, "float32", "r", False, "r")


def test_summary_for_a_worker() -> None:
    plan = Plan("multi_worker", "TF_CONFIG describes 2 tasks", 2, 2, 1, "worker:1", False, "float32", "CPU only",
                False, "no CPU collectives", notes=("Keras 3 fit fix keras_mwms applied",))
    assert plan.summary() == ("strategy multi_worker (2 replicas, worker 1 of 2 (worker:1); TF_CONFIG describes 2 "
                              "tasks) | precision float32 (CPU only) | XLA off (no CPU collectives) | Keras 3 fit fix "
                              "keras_mwms applied")


DESCRIBE = """
import json, os
from tfaccel.plan import describe_auto
from tensorflow.python.eager import context
out = describe_auto()
out["initialised"] = bool(context.context()._initialized)
import tfaccel
out["env_auto"] = tfaccel.env_report()["auto"]["strategy"]
print(json.dumps(out))
"""


def test_describe_auto_does_not_initialise_tensorflow() -> None:
    cluster = harness.loopback_cluster(2)
    tasks = [("local", 0, None), *harness.tf_configs_for(cluster)[:1]]
    results = harness.run_tasks(DESCRIBE, tasks=tasks, timeout=120)
    harness.assert_all_ok(results)
    local, worker = (harness.last_json_line(r.stdout) for r in results)
    assert set(local) >= {"strategy", "strategy_reason", "precision", "precision_reason", "jit_compile", "jit_reason"}
    assert local["initialised"] is False  # configure_devices stays possible after `tfaccel env`
    assert local["strategy"] == "default" and "not counted before TensorFlow's runtime starts" in local["strategy_reason"]
    assert local["env_auto"] == "default"
    assert (worker["strategy"], worker["jit_compile"]) == ("multi_worker", False)
    assert "Collectives are not yet implemented for CPU devices" in worker["jit_reason"]
