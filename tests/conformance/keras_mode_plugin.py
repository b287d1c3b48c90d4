"""A pytest plugin that runs Keras' own tests (tests/conformance/keras_tests, unmodified) in one of four modes.

Loaded with ``-p keras_mode_plugin`` by tests/conformance/test_keras_conformance.py, one pytest process per mode
(virtual CPUs must be set before TensorFlow starts). ``TFACCEL_CONFORMANCE_MODE`` names the mode:

- ``keras:default``: plain Keras, one CPU device (the reference).
- ``keras:mirrored``: plain Keras, every test body inside one ``tf.distribute.MirroredStrategy`` scope over 2
  virtual CPUs (the reference of the mirrored path).
- ``tfaccel:default`` / ``tfaccel:mirrored``: the README's 3-line change applied mechanically: every test body runs
  inside ``tfaccel.scope(strategy=...)`` and every ``fit`` call of a Keras model goes to ``tfaccel.fit``, whose
  history comes back as ``model.fit``'s does (the model's ``History`` callback, holding ``FitResult.history``).

``TFACCEL_CONFORMANCE_OUT`` names the JSON file the outcomes go to: ``{test id: outcome}``, the outcome
``"passed"``, ``"skipped: <reason>"``, ``"failed: <exception type>: <message>"`` (a failure in setup or teardown:
``"error: ..."``), and ``{module: "error: ..."}`` for a module that could not be imported.

"""

import contextlib
import functools
import json
import os
import threading
from typing import Any, Callable, Dict, Iterator

import pytest

MODES = ("keras:default", "keras:mirrored", "tfaccel:default", "tfaccel:mirrored")
VIRTUAL_CPUS = 2
MESSAGE_CHARS = 300
_OUTCOMES: Dict[str, str] = {}
_ROUTING = threading.local()  # set while tfaccel.fit runs: its own Keras-fit loop calls the original fit


def _mode() -> str:
    mode = os.environ.get("TFACCEL_CONFORMANCE_MODE", "")
    if mode not in MODES:
        raise pytest.UsageError(f"TFACCEL_CONFORMANCE_MODE must be one of {', '.join(MODES)}; received {mode!r}")
    return mode


def _fit_owner() -> type:
    """The class whose ``fit`` every Keras model (and every bare Trainer subclass in Keras' tests) runs."""
    import keras

    return next(cls for cls in keras.Model.__mro__ if "fit" in vars(cls))


def _routed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``fit`` as the 3-line change makes it: ``tfaccel.fit(model, ...)``, returning Keras' History object."""
    import tfaccel

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_ROUTING, "active", False):  # tfaccel's Keras-fit loop: plain fit
            return original(self, *args, **kwargs)
        _ROUTING.active = True
        try:
            result = tfaccel.fit(self, *args, **kwargs)
        finally:
            _ROUTING.active = False
        history = self.history
        history.history = dict(result.history)
        return history

    fit.__wrapped__ = original
    return fit


def pytest_configure(config: pytest.Config) -> None:
    import tfaccel

    mode = _mode()
    if mode.endswith(":mirrored"):
        tfaccel.configure_devices(virtual_cpus=VIRTUAL_CPUS)
    if mode.startswith("tfaccel:"):
        owner = _fit_owner()
        owner.fit = _routed(vars(owner)["fit"])


@contextlib.contextmanager
def _mode_scope(mode: str) -> Iterator[None]:
    import tensorflow as tf

    import tfaccel

    strategy = mode.split(":")[1]
    if mode == "keras:mirrored":
        global _KERAS_STRATEGY
        if _KERAS_STRATEGY is None:  # one MirroredStrategy per process (two over the same devices collide)
            _KERAS_STRATEGY = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(VIRTUAL_CPUS)])
        with _KERAS_STRATEGY.scope():
            yield
    elif mode.startswith("tfaccel:"):
        with tfaccel.scope(strategy=strategy):
            yield
    else:
        yield


_KERAS_STRATEGY: Any = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """The test function itself runs in the mode's scope; its fixtures and ``setUp`` do not, since Keras' ``setUp``
    calls ``keras.backend.clear_session()``, which resets TensorFlow's default graph and with it any strategy scope
    entered before."""
    test = item.obj
    mode = _mode()

    @functools.wraps(test)
    def in_scope(*args: Any, **kwargs: Any) -> Any:
        with _mode_scope(mode):
            return test(*args, **kwargs)

    item.obj = in_scope


def _failure(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    return " ".join(text.split())[:MESSAGE_CHARS]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            _OUTCOMES.setdefault(report.nodeid, f"skipped: {reason}")
        elif report.failed:
            kind = "failed" if report.when == "call" else "error"
            _OUTCOMES[report.nodeid] = f"{kind}: {_failure(report)}"
        else:
            _OUTCOMES.setdefault(report.nodeid, "passed")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _OUTCOMES[report.nodeid] = f"error: {_failure(report)}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("TFACCEL_CONFORMANCE_OUT")
    if target:
        with open(target, "w", encoding="utf-8") as fh:
            json.dump(_OUTCOMES, fh, indent=0, sort_keys=True)
