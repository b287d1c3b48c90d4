"""A pytest plugin that runs Keras' own tests (tests/conformance/keras_tests, unmodified) in one of four modes.

Loaded with ``-p keras_mode_plugin`` by tests/conformance/test_keras_conformance.py, one pytest process per tool
(virtual CPUs must be set before TensorFlow starts). ``TFACCEL_CONFORMANCE_MODE`` names the mode:

- ``keras:default``: plain Keras, one CPU device (the reference).
- ``keras:mirrored``: plain Keras, every test body inside one ``tf.distribute.MirroredStrategy`` scope over 2
  virtual CPUs (the reference of the mirrored path).
- ``tfaccel:default`` / ``tfaccel:mirrored``: the README's 3-line change applied mechanically: every test body runs
  inside ``tfaccel.scope(strategy=...)`` and every ``fit`` call of a Keras model goes to ``tfaccel.fit``, whose
  history comes back as ``model.fit``'s does (the model's ``History`` callback, holding ``FitResult.history``).

``TFACCEL_CONFORMANCE_RERUN=mirrored`` beside a ``*:default`` mode runs the mirrored path in the same process (one
TensorFlow start, one collection): right after its default run, a test runs again in the tool's mirrored mode (its
report named ``<test id>@mirrored``) when ``rerun_wanted`` says so: a test of ``RERUN_MODULES`` (the vendored modules
that train: trainer and data-adapter tests, callbacks, models) that called one of Keras' trainer entry points
(``TRAINER_ENTRY_POINTS``) on a model in Keras' compiled-graph execution (``run_eagerly`` and ``jit_compile`` off at
the call, what Keras' own "auto" runs on CPUs and under a several-device MirroredStrategy), the first such
parametrization of each test function.

``TFACCEL_CONFORMANCE_OUT`` names the JSON file the outcomes go to: ``{mode: {test id: outcome}}``, the outcome
``"passed"``, ``"skipped: <reason>"``, ``"failed: <exception type>: <message>"`` (a failure in setup or teardown:
``"error: ..."``), and ``{module: "error: ..."}`` for a module that could not be imported.

"""

import collections
import contextlib
import functools
import json
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import pytest
from _pytest.runner import runtestprotocol  # one item's setup, call, teardown; pytest has no public name for it

MODES = ("keras:default", "keras:mirrored", "tfaccel:default", "tfaccel:mirrored")
RERUN_PATHS = ("mirrored",)
RERUN_MARK = "@"
TRAINER_ENTRY_POINTS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")
# The vendored test modules that train (the trainer's and data adapters' tests, the callbacks', the model's): path
# prefixes of test ids. Not the TF backend's distribute tests: they already run under a MirroredStrategy over 2 CPUs
# of their own on the default path (their setUp resets TensorFlow's context to make the devices); inside a second
# strategy's scope they cannot run in plain Keras ("Mixing different tf.distribute.Strategy objects"), and the
# collective ops of two strategies over the same devices left the next distribute test hanging (seen 2026-11-28 in
# both tools: optimizer_distribute_test's test_weight_decay waited until pytest-timeout's 300 s).
RERUN_MODULES = ("keras/src/trainers/", "keras/src/callbacks/", "keras/src/models/")
VIRTUAL_CPUS = 2
MESSAGE_CHARS = 300
_OUTCOMES: Dict[str, Dict[str, str]] = collections.defaultdict(dict)
_ROUTING = threading.local()  # set while tfaccel.fit runs: its own Keras-fit loop calls the original fit
RUN_STATE = threading.local()  # the mode the running test is in; whether it called a trainer entry point (in graph)
RERUN_FUNCTIONS: Set[Tuple[str, str]] = set()  # (class node id, test function): the functions rerun so far


def _mode() -> str:
    mode = os.environ.get("TFACCEL_CONFORMANCE_MODE", "")
    if mode not in MODES:
        raise pytest.UsageError(f"TFACCEL_CONFORMANCE_MODE must be one of {', '.join(MODES)}; received {mode!r}")
    return mode


def rerun_path() -> Optional[str]:
    """The path each chosen test runs on after its default run (``TFACCEL_CONFORMANCE_RERUN``), or None."""
    path = os.environ.get("TFACCEL_CONFORMANCE_RERUN") or None
    if path is not None and (path not in RERUN_PATHS or not _mode().endswith(":default")):
        raise pytest.UsageError(f"TFACCEL_CONFORMANCE_RERUN must be one of {', '.join(RERUN_PATHS)} beside a "
                                f"*:default mode; received {path!r} with mode {_mode()!r}")
    return path


def _owner(name: str) -> type:
    """The class whose method ``name`` every Keras model (and every bare Trainer subclass in Keras' tests) runs."""
    import keras

    return next(cls for cls in keras.Model.__mro__ if name in vars(cls))


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


def _noted(original: Callable[..., Any]) -> Callable[..., Any]:
    """A trainer entry point that notes it was called by the running test (which then runs on the rerun path)."""

    @functools.wraps(original)
    def entry_point(self: Any, *args: Any, **kwargs: Any) -> Any:
        RUN_STATE.trained = True
        RUN_STATE.in_graph = RUN_STATE.in_graph or not (getattr(self, "run_eagerly", False) or
                                                  getattr(self, "jit_compile", False))
        return original(self, *args, **kwargs)

    return entry_point


def add_keras_tests_site() -> None:
    """Puts ``TFACCEL_KERAS_TESTS_SITE`` (jax, which Keras' tests import at module level) last on ``sys.path``.

    scripts/install_keras_tests.sh installs it apart from the venv, so that the suite's other TensorFlow processes do
    not import jax (and scipy) at start-up; the venv's own packages stay first."""
    site = os.environ.get("TFACCEL_KERAS_TESTS_SITE")
    if not site:
        return
    if not os.path.isdir(site):
        raise pytest.UsageError(f"TFACCEL_KERAS_TESTS_SITE={site!r} does not exist; Keras' tests import jax from it: "
                                "run `bash scripts/install_keras_tests.sh .venv`")
    if site not in sys.path:
        sys.path.append(site)


def pytest_configure(config: pytest.Config) -> None:
    import tfaccel

    add_keras_tests_site()
    mode, rerun = _mode(), rerun_path()
    _OUTCOMES[mode] = {}
    if rerun:
        _OUTCOMES[f"{mode.split(':')[0]}:{rerun}"] = {}
    if mode.endswith(":mirrored") or rerun:
        tfaccel.configure_devices(virtual_cpus=VIRTUAL_CPUS)
    for name in TRAINER_ENTRY_POINTS:
        owner = _owner(name)
        method = vars(owner)[name]
        if name == "fit" and mode.startswith("tfaccel:"):
            method = _routed(method)
        setattr(owner, name, _noted(method))


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


def _running_mode() -> str:
    return getattr(RUN_STATE, "mode", None) or _mode()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """The test function itself runs in the mode's scope; its fixtures and ``setUp`` do not, since Keras' ``setUp``
    calls ``keras.backend.clear_session()``, which resets TensorFlow's default graph and with it any strategy scope
    entered before."""
    test = item.obj
    mode = _running_mode()

    @functools.wraps(test)
    def in_scope(*args: Any, **kwargs: Any) -> Any:
        with _mode_scope(mode):
            return test(*args, **kwargs)

    item.obj = in_scope


def _run(item: pytest.Item, nextitem: Optional[pytest.Item], mode: str) -> List[pytest.TestReport]:
    """One run of ``item`` (setup, call, teardown) in ``mode``; its reports, not yet logged."""
    RUN_STATE.mode, RUN_STATE.trained, RUN_STATE.in_graph = mode, False, False
    try:
        return runtestprotocol(item, nextitem=nextitem, log=False)
    finally:
        RUN_STATE.mode = None


def _function_of(item: pytest.Item) -> Tuple[str, str]:
    """The test function a test runs: (its class's node id, its name before parametrization)."""
    function = getattr(item, "obj", None)
    return item.parent.nodeid if item.parent else "", getattr(function, "__wrapped__", function).__name__


def rerun_wanted(item: pytest.Item, function: Tuple[str, str]) -> bool:
    """Whether the test that just ran on the default path runs on the rerun path too (see the module's docstring).

    One parametrization per test function keeps the mirrored path within CI's time: the parametrizations of Keras'
    trainer tests vary the execution mode (eager, graph, XLA) and the data's kind, which the default path covers.
    """
    if not item.nodeid.startswith(RERUN_MODULES) or not (RUN_STATE.trained and RUN_STATE.in_graph):
        return False
    if function in RERUN_FUNCTIONS:
        return False
    RERUN_FUNCTIONS.add(function)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Optional[bool]:
    """With a rerun path: the default run, then (when ``rerun_wanted`` says so) the rerun path's run."""
    path = rerun_path()
    if path is None:
        return None
    function = _function_of(item)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _run(item, nextitem, _mode()):
        item.ihook.pytest_runtest_logreport(report=report)
    if rerun_wanted(item, function):
        rerun = f"{_mode().split(':')[0]}:{path}"
        for report in _run(item, nextitem, rerun):
            report.nodeid = f"{report.nodeid}{RERUN_MARK}{path}"
            item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _failure(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    return " ".join(text.split())[:MESSAGE_CHARS]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    test, _, path = report.nodeid.partition(RERUN_MARK)
    outcomes = _OUTCOMES[f"{_mode().split(':')[0]}:{path}" if path else _mode()]
    if report.when == "call" or report.outcome != "passed":
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            outcomes.setdefault(test, f"skipped: {reason}")
        elif report.failed:
            kind = "failed" if report.when == "call" else "error"
            outcomes[test] = f"{kind}: {_failure(report)}"
        else:
            outcomes.setdefault(test, "passed")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _OUTCOMES[_mode()][report.nodeid] = f"error: {_failure(report)}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("TFACCEL_CONFORMANCE_OUT")
    if target:
        with open(target, "w", encoding="utf-8") as fh:
            json.dump(_OUTCOMES, fh, indent=0, sort_keys=True)
