"""Keras' own tests through ``tfaccel.fit``: every test plain Keras passes on the TensorFlow backend passes through
tfaccel, on one device (``default``) and under ``mirrored`` over 2 virtual CPUs.

Keras' tests (keras_tests/, copied unmodified from the Keras 3.15.1 source distribution; see keras_tests/NOTICE) run
in pytest processes per tool (keras_mode_plugin.py; two parts side by side, PARTS): plain Keras, and the README's
3-line change applied mechanically (each test body inside ``tfaccel.scope(strategy=...)``, every ``fit`` through ``tfaccel.fit``).

Which tests run on which path:

- ``default``: every test of TEST_PATHS (370 with Keras 3.15.1).
- ``mirrored``: in the same process, right after its part's default run (one TensorFlow start, one collection, 2
  virtual CPUs from the start), each test of the vendored modules that train (keras_mode_plugin.RERUN_MODULES: the trainer
  and data-adapter tests, the callbacks', the model's) that called ``fit`` / ``evaluate`` / ``predict`` /
  ``train_on_batch`` / ``test_on_batch`` / ``predict_on_batch`` on a model in Keras' compiled-graph execution
  (``run_eagerly`` and ``jit_compile`` off at the call), once per test function (its first such parametrization;
  119 tests with Keras 3.15.1: 47 trainer tests, 48 callback tests, 24 model tests; the data-adapter tests call no
  model's entry point); plain Keras runs it inside one ``tf.distribute.MirroredStrategy`` scope, tfaccel inside
  ``tfaccel.scope(strategy="mirrored")``. Why that set: what a strategy changes is the trainer's loops (data split
  over replicas, losses and metrics reduced across them, steps per execution, predict's outputs gathered, the
  callbacks' view of the model's state), which those tests exercise; a test that never calls a trainer entry point
  runs the same code on both paths; Keras' "auto" itself runs graph without XLA on CPUs and under a several-device
  MirroredStrategy, and the other parametrizations vary what the default path already covers. The TF backend's
  distribute tests are not rerun: they train under a MirroredStrategy of their own on the default path already.

The plain-Keras outcomes are recorded in docs/data/keras_conformance.json (they depend only on the pinned Keras and
TensorFlow, checked here); this test runs tfaccel and compares. A test plain Keras passes must pass through tfaccel
on the same path, or be an intended refusal listed in INTENDED_REFUSALS (a tfaccel ConfigError that says why,
checked, never a traceback) or an open difference in OPEN_DIFFERENCES (failing with its cause, checked).

``TFACCEL_CONFORMANCE_RECORD=1`` runs plain Keras too and rewrites the JSON (scripts/keras_conformance_table.py
does that and prints the table docs/guides/keras-parity.md shows).
"""

import json
import os
import sys
import types
from pathlib import Path
from typing import Dict, List, Mapping, Optional

import keras
import pytest
import tensorflow as tf

import harness
import keras_mode_plugin

HERE = Path(__file__).resolve().parent
KERAS_TESTS = HERE / "keras_tests"
# jax for Keras' tests, apart from the venv (scripts/install_keras_tests.sh); keras_mode_plugin appends it to sys.path
KERAS_TESTS_SITE = Path(sys.prefix) / "keras-tests-site"
RECORDED = harness.REPO_ROOT / "docs" / "data" / "keras_conformance.json"
# In this order: Keras' backend/tensorflow distribute tests reset TensorFlow's context in their setUp, so they run last.
TEST_PATHS = ("keras/src/trainers", "keras/src/callbacks", "keras/src/models", "keras/src/backend/tensorflow")
# TEST_PATHS in two processes of about the same length: the trainers' tests; the callbacks', the model's and the TF
# backend's (its distribute tests last).
PARTS = (TEST_PATHS[:1], TEST_PATHS[1:])
PATHS = ("default", "mirrored")  # mirrored: the tests the module's docstring names, after their default run
# {mode: {test id: the reason tfaccel's ConfigError gives}}: tests plain Keras passes that tfaccel refuses on purpose.
# Keras' distribute tests build a model under a MirroredStrategy of their own and fit it: tfaccel trains with the
# strategy its plan made (one per process), so it names the foreign one instead of training under it.
_FOREIGN = "that tfaccel did not make"
INTENDED_REFUSALS: Dict[str, Dict[str, str]] = {
    "tfaccel:default": {
        "keras/src/backend/tensorflow/distribute_test.py::DistributeTest::test_correctness_with_fit_and_regularizer":
            _FOREIGN,
        "keras/src/callbacks/swap_ema_weights_test.py::SwapEMAWeightsTest::test_swap_ema_weights_with_tf_distribute":
            _FOREIGN},
    "tfaccel:mirrored": {}}
# {mode: {test id: cause}}: differences not fixed yet, each checked to still fail with its cause (a test that starts
# passing must leave this list). The target is an empty list.
OPEN_DIFFERENCES: Dict[str, Dict[str, str]] = {
    "tfaccel:default": {},
    "tfaccel:mirrored": {}}
# Each process gets its part's test paths from the environment (a part is one process: the two run side by side, so
# the longest of them, not their sum, is the file's wall time on 2 cores).
PART_PROGRAM = ("import os, sys, pytest; "
                "sys.exit(pytest.main(sys.argv[1:] + os.environ['TFACCEL_CONFORMANCE_TESTS'].splitlines()))")
# A bound on a hang, not a speed target: the run takes 11-12 minutes of wall time in a full suite here (658 s and
# 706 s, session 19, beside the corpus's four processes on 2 cores); CI's machine took over 900 s once.
RUN_SECONDS = 1800


def run_tools(tools: List[str], out_dir: Path, *, test_ids: Optional[List[str]] = None) -> Dict[str, dict]:
    """Runs Keras' tests for each tool (``keras``, ``tfaccel``) in pytest processes that run all at once, one per
    tool and part (PARTS; one per tool for ``test_ids``), each on PATHS (the default run, then each test that called a
    trainer entry point again on mirrored); returns ``{mode: {test: outcome}}``.

    Args:
        test_ids: only these tests (default: all of TEST_PATHS).
    """
    parts = [list(test_ids)] if test_ids else [list(part) for part in PARTS]
    tasks, per_task, outputs = [], {}, []
    for tool in tools:
        for number, part in enumerate(parts):
            index = len(tasks)
            out = out_dir / f"{tool}-{number}.json"
            tasks.append(("worker", index, None))
            outputs.append((tool, out))
            per_task[f"worker:{index}"] = {
                "TFACCEL_CONFORMANCE_MODE": f"{tool}:default",
                "TFACCEL_CONFORMANCE_RERUN": "mirrored" if "mirrored" in PATHS else "",
                "TFACCEL_CONFORMANCE_OUT": str(out), "TFACCEL_CACHE_DIR": str(out_dir / f"cache_{index}"),
                "TFACCEL_CONFORMANCE_TESTS": "\n".join(str(KERAS_TESTS / t) for t in part)}
    env = {"PYTHONPATH": os.pathsep.join([str(harness.REPO_ROOT), str(HERE)]), "PYTHONDONTWRITEBYTECODE": "1",
           "TFACCEL_KERAS_TESTS_SITE": str(KERAS_TESTS_SITE)}
    # --tb=native: pytest's own traceback formatting parses source with `ast`, which on CPython 3.11 can raise a
    # spurious SystemError ("AST constructor recursion depth mismatch", python/cpython#106905, seen here on 3.11.7
    # in the mirrored runs) and end the whole pytest run with INTERNALERROR; Python's traceback module parses nothing.
    args = ["-q", "--tb=native", "-p", "no:cacheprovider", "-p", "keras_mode_plugin", "-c",
            str(KERAS_TESTS / "pytest.ini"), "--rootdir", str(KERAS_TESTS), "--confcutdir", str(KERAS_TESTS),
            "--continue-on-collection-errors"]
    results = harness.run_tasks(PART_PROGRAM, tasks=tasks, per_task_env=per_task, env=env, args=args,
                                timeout=RUN_SECONDS, fail_fast_grace=RUN_SECONDS)
    outcomes: Dict[str, dict] = {}
    for (tool, path), result in zip(outputs, results):
        assert result.returncode in (0, 1) and path.exists(), f"{tool}: pytest did not finish\n{result.describe()}"
        for mode, tests in json.loads(path.read_text()).items():
            outcomes.setdefault(mode, {}).update(tests)
    return outcomes


def differences(plain: Mapping[str, str], routed: Mapping[str, str], refusals: Mapping[str, str],
                open_ones: Mapping[str, str]) -> List[str]:
    """Every test plain Keras passes that does not pass through tfaccel, unless it is refused as intended (a
    ConfigError with its reason) or an open difference failing with its cause; and every open difference that passes
    now or fails otherwise."""
    problems = []
    for test, outcome in sorted(plain.items()):
        if outcome != "passed":
            continue
        got = routed.get(test, "not run")
        reason, cause = refusals.get(test), open_ones.get(test)
        if reason and got.startswith("failed: tfaccel.errors.ConfigError:") and reason in got:
            continue
        if cause:
            if got == "passed" or cause not in got:
                problems.append(f"{test}: listed in OPEN_DIFFERENCES ({cause!r}) but {got}")
            continue
        if got != "passed":
            problems.append(f"{test}: {got}")
    return problems


@pytest.fixture(scope="module")
def recorded() -> dict:
    data = json.loads(RECORDED.read_text())
    assert (data["keras"], data["tensorflow"]) == (keras.__version__, tf.__version__), \
        "the recorded plain-Keras outcomes are of another Keras or TensorFlow: rerun scripts/keras_conformance_table.py"
    return data


@pytest.fixture(scope="module")
def routed(recorded: dict, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, dict]:
    out = tmp_path_factory.mktemp("conformance")
    if os.environ.get("TFACCEL_CONFORMANCE_RECORD") == "1":
        outcomes = run_tools(["keras", "tfaccel"], out)
        record(outcomes)
        return outcomes
    return run_tools(["tfaccel"], out)


def record(outcomes: Dict[str, dict]) -> None:
    """Writes the outcomes of a full run with the versions and the intended refusals (the docs' table)."""
    data = {"keras": keras.__version__, "tensorflow": tf.__version__, "python": sys.version.split()[0],
            "intended_refusals": INTENDED_REFUSALS, "open_differences": OPEN_DIFFERENCES, "modes": outcomes}
    RECORDED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _module(test: str) -> str:
    return test.split("::")[0]


def _recorded_modules() -> List[tuple]:
    """(path, Keras test module) for every module the recorded plain-Keras run ran on that path: one test item each,
    so that a difference names its module, and so that pytest-xdist (which hands out the files with the most tests
    first) starts this file early instead of leaving its long run for the end of the suite."""
    modes = json.loads(RECORDED.read_text())["modes"]
    return [(path, module) for path in PATHS for module in sorted({_module(t) for t in modes[f"keras:{path}"]})]


@pytest.mark.timeout(RUN_SECONDS + 120)
@pytest.mark.parametrize("path, module", [pytest.param(p, m, id=f"{p}:{m.removeprefix('keras/src/')}")
                                          for p, m in _recorded_modules()])
def test_what_plain_keras_passes_passes_through_tfaccel(path: str, module: str, recorded: dict,
                                                        routed: Dict[str, dict]) -> None:
    plain = {t: o for t, o in recorded["modes"][f"keras:{path}"].items() if _module(t) == module}
    got = {t: o for t, o in routed[f"tfaccel:{path}"].items() if _module(t) == module}
    assert set(got) == set(plain), f"other tests ran than plain Keras ran: {sorted(set(got) ^ set(plain))[:10]}"
    problems = differences(plain, got, INTENDED_REFUSALS[f"tfaccel:{path}"], OPEN_DIFFERENCES[f"tfaccel:{path}"])
    assert not problems, f"{len(problems)} tests plain Keras passes fail through tfaccel ({path}):\n" + \
        "\n".join(problems)


@pytest.mark.parametrize("path", PATHS)
def test_no_other_keras_tests_ran_than_plain_keras_ran(path: str, recorded: dict, routed: Dict[str, dict]) -> None:
    plain, got = recorded["modes"][f"keras:{path}"], routed[f"tfaccel:{path}"]
    assert set(got) == set(plain), f"other tests ran than plain Keras ran: {sorted(set(got) ^ set(plain))[:10]}"


def test_the_listed_refusals_and_open_differences_pass_in_plain_keras(tmp_path: Path) -> None:
    """What tfaccel refuses or still gets wrong is re-run in plain Keras here (cheap: only those tests run)."""
    listed = {path: sorted({**INTENDED_REFUSALS[f"tfaccel:{path}"], **OPEN_DIFFERENCES[f"tfaccel:{path}"]})
              for path in PATHS}
    tests = sorted({test for path in PATHS for test in listed[path]})
    if tests:
        plain = run_tools(["keras"], tmp_path, test_ids=tests)
        for path in PATHS:
            assert {t: plain[f"keras:{path}"].get(t) for t in listed[path]} == {t: "passed" for t in listed[path]}


def test_the_comparison_names_each_difference() -> None:
    plain = {"a": "passed", "b": "passed", "c": "passed", "d": "passed", "e": "failed: X"}
    routed = {"a": "passed", "b": "failed: AssertionError: 1 != 2", "c": "failed: tfaccel.errors.ConfigError: why",
              "d": "passed", "e": "passed"}
    assert differences(plain, routed, {"c": "why"}, {}) == ["b: failed: AssertionError: 1 != 2"]
    assert differences(plain, routed, {"c": "other"}, {"b": "1 != 2", "d": "x"}) == [
        "c: failed: tfaccel.errors.ConfigError: why", "d: listed in OPEN_DIFFERENCES ('x') but passed"]


def test_the_mirrored_rerun_is_one_graph_test_per_test_function_that_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFACCEL_CONFORMANCE_MODE", "tfaccel:default")
    monkeypatch.setenv("TFACCEL_CONFORMANCE_RERUN", "mirrored")
    monkeypatch.setattr(keras_mode_plugin, "RERUN_FUNCTIONS", set())
    state = keras_mode_plugin.RUN_STATE

    def wanted(nodeid: str, function: str, *, trained: bool = True, in_graph: bool = True) -> bool:
        state.trained, state.in_graph = trained, in_graph
        return keras_mode_plugin.rerun_wanted(types.SimpleNamespace(nodeid=nodeid), ("T", function))

    trainer = "keras/src/trainers/trainer_test.py"
    assert not wanted(f"{trainer}::T::test_fit_eager", "test_fit", in_graph=False)
    assert wanted(f"{trainer}::T::test_fit_graph", "test_fit")
    assert not wanted(f"{trainer}::T::test_fit_other_graph", "test_fit"), "one parametrization per function"
    assert not wanted(f"{trainer}::T::test_no_fit", "test_no_fit", trained=False, in_graph=False)
    for module in ("callbacks/early_stopping_test.py", "models/model_test.py",
                   "trainers/data_adapters/py_dataset_adapter_test.py"):
        assert wanted(f"keras/src/{module}::T::test_fit", f"test_fit_{module}"), module
    for module in ("backend/tensorflow/distribute_test.py", "layers/core/dense_test.py"):
        assert not wanted(f"keras/src/{module}::T::test_fit", f"test_fit_{module}"), module


def test_a_rerun_path_other_than_mirrored_beside_default_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFACCEL_CONFORMANCE_MODE", "keras:mirrored")
    monkeypatch.setenv("TFACCEL_CONFORMANCE_RERUN", "mirrored")
    with pytest.raises(pytest.UsageError, match="beside a \\*:default mode; received 'mirrored' with mode "
                                                "'keras:mirrored'"):
        keras_mode_plugin.rerun_path()
    monkeypatch.setenv("TFACCEL_CONFORMANCE_MODE", "keras:default")
    monkeypatch.setenv("TFACCEL_CONFORMANCE_RERUN", "multi_worker")
    with pytest.raises(pytest.UsageError, match="must be one of mirrored"):
        keras_mode_plugin.rerun_path()
