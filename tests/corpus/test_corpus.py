"""The keras-io corpus: each case (corpus_cases) trained with the README's 3-line change on default, mirrored (2
virtual CPUs) and multi_worker (2 worker processes started by tfaccel.launch.run_local on loopback), compared with
the plain Keras script under the same strategy: one device, or 2 replicas of Keras' MirroredStrategy for the
mirrored and multi_worker paths (Keras' own fit cannot run under MultiWorkerMirroredStrategy, keras-team/keras#20585),
or one device where plain Keras fails under MirroredStrategy or a case asks for it. The rule is tests/parity's
(parity_compare.differences: history keys and per-epoch values rel 1e-5, final weights abs 1e-5), plus the files a
case's callbacks wrote, what its callbacks logged and the model's dtype policy and optimizer class.

Every path runs all cases in one process (one pair of processes for multi_worker), the three paths at once, once
per module. Cases in corpus_cases.OPEN are differences found here and not fixed yet: they are expected to differ
(strict: the test fails once they pass, so the mark goes with the fix). ``TFACCEL_CORPUS_JSON=path`` also writes the outcome table (docs/data/corpus.json,
rendered by scripts/corpus_table.py in docs/guides/keras-parity.md).
"""

import concurrent.futures
import os
import sys
from pathlib import Path
from typing import Dict, List

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "parity")]

import corpus_cases  # noqa: E402
import harness  # noqa: E402
import parity_compare as pc  # noqa: E402
from tfaccel.launch import run_local  # noqa: E402
from tfaccel.resilience.atomic_io import atomic_write_json  # noqa: E402

PROGRAM = HERE / "corpus_program.py"
CASES = list(corpus_cases.CASES)
OUTCOMES: Dict[str, Dict[str, str]] = {}
TIMEOUT = 1800  # a bound on a path's process(es); about 2 minutes on an idle 2-core machine


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("TFACCEL_CORPUS_DIR")  # keep a run's records for inspection (and reuse: see runs)
    return Path(kept) if kept else tmp_path_factory.mktemp("corpus")


def _one_process(path: str, out: Path) -> None:
    results = harness.run_tasks(PROGRAM, tasks=[("worker", 0, None)], args=[path, str(out)], timeout=TIMEOUT)
    harness.assert_all_ok(results)


def _two_workers(out: Path) -> None:
    env = {**harness.CHILD_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(harness.REPO_ROOT),
                                                                           os.environ.get("PYTHONPATH")]))}
    result = run_local([sys.executable, str(PROGRAM), "multi_worker", str(out)], workers=2, timeout=TIMEOUT,
                       env=env, echo=False, capture_lines=400)
    harness.STARTED_PIDS.extend(result.pids)
    assert result.ok, result.message + "\n" + "\n".join(t.stderr[-3000:] for t in result.tasks)


@pytest.fixture(scope="module")
def runs(corpus_dir: Path) -> Dict[str, Path]:
    """The three paths' processes, started together (the corpus's wall time is its slowest path's). In a kept
    directory (``TFACCEL_CORPUS_DIR``) a path whose run completed there (its ``complete`` file) is not run again."""
    jobs = {"default": lambda: _one_process("default", corpus_dir / "default"),
            "mirrored": lambda: _one_process("mirrored", corpus_dir / "mirrored"),
            "multi_worker": lambda: _two_workers(corpus_dir / "multi_worker")}
    todo = {path: job for path, job in jobs.items() if not (corpus_dir / path / "complete").exists()}
    with concurrent.futures.ThreadPoolExecutor(max(1, len(todo))) as pool:
        for path, future in [(path, pool.submit(job)) for path, job in todo.items()]:
            future.result()
            (corpus_dir / path / "complete").touch()
    return {path: corpus_dir / path for path in jobs}


def _reference(case: str, path: str, runs: Dict[str, Path]) -> dict:
    """Plain Keras: one device for default (and for a case whose reference is one device, or where plain Keras
    failed under MirroredStrategy), else Keras' MirroredStrategy over 2 virtual CPUs."""
    one = pc.load(str(runs["default"] / "keras"), "main", case)
    if path == "default" or corpus_cases.CASES[case].reference == "one_device":
        return one
    mirrored = pc.load(str(runs["mirrored"] / "keras"), "main", case)
    return mirrored if mirrored["status"] == "ok" else one


def _more_differences(ref: dict, got: dict, *, chief: bool) -> List[str]:
    problems = []
    for key in ("dtype", "optimizer", "extras") + (("files",) if chief else ()):
        if ref.get(key) != got.get(key):
            problems.append(f"{key}: {got.get(key)} != Keras' {ref.get(key)}")
    return problems


def _check(path: str, case: str, got: dict, ref: dict, *, chief: bool = True) -> None:
    assert ref["status"] == "ok", f"plain Keras failed {case!r} on one device:\n{ref.get('message', '')[-3000:]}"
    phrase = corpus_cases.REFUSES.get((path, case))
    if phrase:  # an intended refusal: before training, saying why
        OUTCOMES.setdefault(path, {})[case] = f"refused: {got.get('message', got['status'])}"
        assert got["status"] == "refused" and phrase in got["message"], got.get("message", "")[-3000:]
        return
    problems = pc.differences(ref, got, case)
    if got["status"] == "ok":
        problems += _more_differences(ref, got, chief=chief)
        if got.get("plan_strategy") != path:
            problems.append(f"tfaccel.scope() planned {got.get('plan_strategy')!r}, not {path!r}")
    OUTCOMES.setdefault(path, {})[case] = "equal" if not problems else (
        ("refused: " if got["status"] == "refused" else "DIFFERENT: ") + "; ".join(problems))
    assert not problems, f"{path}, {case!r} ({got.get('loop')}):\n" + "\n".join(p[-3000:] for p in problems)


def _expected_to_differ(path: str, case: str) -> str:
    return corpus_cases.OPEN.get((path, case), "")


def _params(path: str) -> list:
    return [pytest.param(case, marks=pytest.mark.xfail(reason=_expected_to_differ(path, case), strict=True))
            if _expected_to_differ(path, case) else case for case in CASES]


@pytest.mark.timeout(2 * TIMEOUT)  # the first test pays for every path's run
@pytest.mark.parametrize("case", _params("default"))
def test_default(case: str, runs: Dict[str, Path]) -> None:
    got = pc.load(str(runs["default"] / "tfaccel"), "main", case)
    _check("default", case, got, _reference(case, "default", runs))


@pytest.mark.timeout(2 * TIMEOUT)
@pytest.mark.parametrize("case", _params("mirrored"))
def test_mirrored(case: str, runs: Dict[str, Path]) -> None:
    got = pc.load(str(runs["mirrored"] / "tfaccel"), "main", case)
    _check("mirrored", case, got, _reference(case, "mirrored", runs))


@pytest.mark.timeout(3 * TIMEOUT)
@pytest.mark.parametrize("case", _params("multi_worker"))
def test_multi_worker(case: str, runs: Dict[str, Path]) -> None:
    out = runs["multi_worker"] / "tfaccel"
    chief, other = pc.load(str(out), "worker0", case), pc.load(str(out), "worker1", case)
    _check("multi_worker", case, chief, _reference(case, "multi_worker", runs))
    assert other["status"] == chief["status"], other.get("message", "")[-3000:]
    for name, a, b in zip(chief.get("weight_paths", ()), chief.get("weights", ()), other.get("weights", ())):
        assert "moving_" in name or a == b, f"the two workers ended with different values of {name}"


def test_the_corpus_is_big_enough_and_names_its_sources() -> None:
    assert len(CASES) >= 25
    for case in corpus_cases.CASES.values():
        assert case.source.startswith(("guides/", "examples/", "templates/")), case.name
        assert len(case.adaptation) > 20 and len(case.proves) > 20, case.name


def teardown_module() -> None:
    """Writes the outcomes and every case's source and claim to ``TFACCEL_CORPUS_JSON`` (no variable: nothing)."""
    target = os.environ.get("TFACCEL_CORPUS_JSON")
    if target and OUTCOMES:
        cases = {name: {"source": c.source, "proves": c.proves} for name, c in corpus_cases.CASES.items()}
        pending: Dict[str, Dict[str, str]] = {}
        for (path, name), why in corpus_cases.OPEN.items():
            if not OUTCOMES.get(path, {}).get(name, "").startswith("equal"):
                pending.setdefault(path, {})[name] = why
        atomic_write_json(target, {"cases": cases, "outcomes": OUTCOMES, "pending": pending})
