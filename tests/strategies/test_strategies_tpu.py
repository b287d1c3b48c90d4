"""tpu: address resolution and every error path, with an injected TPU API (no TPU on this machine)."""

import types

import pytest

from tfaccel.devices import DeviceInfo, tpu_address_hint
from tfaccel.errors import BackendUnavailableError, ConfigError
from tfaccel.strategies import get_backend, tpu
from tfaccel.strategies.registry import reset_backends
from tfaccel.strategies.tpu import resolve_tpu_address


class FakeTpuApi:
    def __init__(self, *, fail_resolver=None, fail_init=None):
        self.calls = []
        self.fail_resolver, self.fail_init = fail_resolver, fail_init

    def resolver(self, address, zone, project):
        self.calls.append(("resolver", address, zone, project))
        if self.fail_resolver:
            raise self.fail_resolver
        return types.SimpleNamespace(address=address, master=lambda: address)

    def connect(self, resolver):
        self.calls.append(("connect", resolver.address))

    def initialize(self, resolver):
        self.calls.append(("initialize", resolver.address))
        if self.fail_init:
            raise self.fail_init

    def strategy(self, resolver):
        self.calls.append(("strategy", resolver.address))
        return types.SimpleNamespace(num_replicas_in_sync=8, extended=types.SimpleNamespace(num_hosts=1))


@pytest.fixture
def fake(monkeypatch):
    api = FakeTpuApi()
    monkeypatch.setattr(tpu, "_API", api)
    monkeypatch.setattr(tpu, "_initialised", set())
    reset_backends()  # a tpu backend cached by another test would answer without calling this fake API
    yield api
    reset_backends()


def test_environment_hints() -> None:
    assert tpu_address_hint({"COLAB_TPU_ADDR": "10.0.0.2:8470"}) == "grpc://10.0.0.2:8470"
    assert tpu_address_hint({"TPU_NAME": "my-tpu"}) == "my-tpu"
    assert tpu_address_hint({"TPU_ACCELERATOR_TYPE": "v4-8"}) == "local"
    assert tpu_address_hint({}) is None


def test_resolve_address_precedence() -> None:
    env_tpu = DeviceInfo(tpu_address="grpc://10.0.0.2:8470")
    assert resolve_tpu_address("my-tpu", env_tpu) == "my-tpu"  # the explicit option wins
    assert resolve_tpu_address(None, env_tpu) == "grpc://10.0.0.2:8470"
    with pytest.raises(BackendUnavailableError, match=r"tpu: no TPU is reachable from here: none of COLAB_TPU_ADDR "
                                                      r"\(Colab\), TPU_NAME \(Cloud TPU\).*tpu='local' on a TPU VM"):
        resolve_tpu_address(None, DeviceInfo())
    with pytest.raises(ConfigError, match=r"tpu: tpu must be 'local', a TPU name or an address.*received ''"):
        resolve_tpu_address("", DeviceInfo())


def test_auto_colab_connects_initialises_once(fake, clean_tf_config) -> None:
    devices = DeviceInfo(tpu_address="grpc://10.0.0.2:8470")
    backend = get_backend("auto", devices=devices)
    assert backend.name == "tpu" and backend.num_replicas_in_sync == 8
    assert backend.reason == "a TPU is reachable at 'grpc://10.0.0.2:8470'"
    assert backend.supports_jit and "always compiled" in backend.jit_note
    assert get_backend("tpu", devices=devices) is backend  # the same request: the same backend, nothing called
    reset_backends()
    get_backend("tpu", devices=devices)  # a second strategy: no second initialize_tpu_system (it wipes the TPU)
    assert fake.calls == [("resolver", "grpc://10.0.0.2:8470", None, None), ("connect", "grpc://10.0.0.2:8470"),
                          ("initialize", "grpc://10.0.0.2:8470"), ("strategy", "grpc://10.0.0.2:8470"),
                          ("resolver", "grpc://10.0.0.2:8470", None, None), ("connect", "grpc://10.0.0.2:8470"),
                          ("strategy", "grpc://10.0.0.2:8470")]


def test_local_tpu_vm_does_not_connect(fake, clean_tf_config) -> None:
    get_backend("tpu", devices=DeviceInfo(), tpu="local")
    assert [c[0] for c in fake.calls] == ["resolver", "initialize", "strategy"]


def test_named_tpu_with_zone_and_project(fake, clean_tf_config) -> None:
    get_backend("tpu", devices=DeviceInfo(), tpu="my-tpu", zone="us-central1-b", project="proj")
    assert fake.calls[0] == ("resolver", "my-tpu", "us-central1-b", "proj")


def test_given_resolver(fake, clean_tf_config) -> None:
    resolver = types.SimpleNamespace(address="grpc://1.2.3.4:8470", master=lambda: "grpc://1.2.3.4:8470")
    get_backend("tpu", devices=DeviceInfo(), cluster_resolver=resolver)
    assert fake.calls == [("connect", "grpc://1.2.3.4:8470"), ("initialize", "grpc://1.2.3.4:8470"),
                          ("strategy", "grpc://1.2.3.4:8470")]


def test_no_tpu_anywhere(fake, clean_tf_config) -> None:
    with pytest.raises(BackendUnavailableError, match=r"tpu: no TPU is reachable from here"):
        get_backend("tpu", devices=DeviceInfo())
    assert fake.calls == []


def test_resolver_failure(fake, clean_tf_config) -> None:
    fake.fail_resolver = ValueError("Please provide a TPU Name to connect to.")
    with pytest.raises(BackendUnavailableError, match=r"tpu: TPUClusterResolver could not find TPU 'nope' \(ValueError: "
                                                      r"Please provide a TPU Name to connect to.\)\. Check the name"):
        get_backend("tpu", devices=DeviceInfo(), tpu="nope")


def test_initialise_failure(fake, clean_tf_config) -> None:
    fake.fail_init = RuntimeError("TPU is in use by another process")
    with pytest.raises(BackendUnavailableError, match=r"tpu: connecting to / initialising TPU 'local' failed "
                                                      r"\(RuntimeError: TPU is in use by another process\)\. Is the TPU"):
        get_backend("tpu", devices=DeviceInfo(), tpu="local")
    assert "local" not in tpu._initialised  # a later attempt initialises again


def test_unknown_tpu_option(fake, clean_tf_config) -> None:
    with pytest.raises(ConfigError, match=r"strategy 'tpu': unknown option\(s\) 'address'.*valid options for 'tpu': "
                                          r"tpu, zone, project, cluster_resolver"):
        get_backend("tpu", devices=DeviceInfo(), address="x")
