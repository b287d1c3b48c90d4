"""Keras parity: every case trained by plain ``model.fit`` and by ``tfaccel.fit`` on each path, compared.

Each path runs all cases (parity_program.py) once per session: the single-process paths in two processes side by
side (plain Keras and tfaccel on one device, the compiled loop and Keras fit; plain Keras and tfaccel mirrored over 2
virtual CPUs), the others in their own processes: multi_worker with 2 real worker processes on
loopback (both tf.distribute paths train array cases with tfaccel's multi-step loop, several steps of
``train_step`` per call, and the others with Keras fit), horovod with 2 real ranks over Gloo, parameter_server with
a real chief + worker + ps. The reference is plain Keras: one device, or the same
number of replicas where per-replica semantics (BatchNorm statistics, Dropout streams) are Keras' own; the
clipping cases compare tf.distribute paths with one device, since Keras 3.15's per-replica clipping is
the bug tfaccel fixes there; Horovod ranks (one replica each, gradients averaged, metric states summed) are
compared with one device, or with Keras' MirroredStrategy where BatchNormalization normalises per replica. A path either matches (history keys and per-epoch values rel 1e-5, final
weights abs 1e-5) or refuses the case with a ConfigError that says why; nothing runs differently. One-device
paths are compared with Keras at the XLA setting tfaccel's plan chose (announced in the plan): XLA draws
Dropout masks from another RNG kernel than TF's CPU kernels, in Keras' own fit as well.
``TFACCEL_PARITY_JSON=path`` also writes the outcome table (scripts/parity_table.py renders it for docs/guides/keras-parity.md).
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import parity_cases  # noqa: E402
import parity_compare as pc  # noqa: E402

PROGRAM = Path(__file__).resolve().parent / "parity_program.py"
CASES = list(parity_cases.CASES)
# Cases a path may refuse (with a ConfigError naming the reason) instead of training them.
MAY_REFUSE = {
    "tfaccel:default:compiled": {"sample_weight (dataset)", "TerminateOnNaN", "LambdaCallback batch hooks"},
    # Keras 3 has no ParameterServerStrategy support (keras-team/keras#18624); the coordinator loop computes the
    # step itself, runs batches in closures on the workers and adds up per-batch metric totals.
    "tfaccel:parameter_server:auto": {"custom train_step", "sample_weight (dataset)", "stateful metrics AUC, F1Score",
                                      "TerminateOnNaN", "LambdaCallback batch hooks"},
}
OUTCOMES: dict = {}


@pytest.fixture(scope="session")
def parity_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("TFACCEL_PARITY_DIR")  # keep the per-case results of a run for inspection
    return Path(kept) if kept else tmp_path_factory.mktemp("parity")


def _same_weights_everywhere(a: dict, b: dict) -> None:
    """Two processes of one job end with the same weights, BatchNormalization's moving statistics aside: with
    Keras' default synchronized=False each replica keeps its own (ON_READ variables read locally), as in Keras'
    own fit; the chief's are the model's, and they equal the reference (checked by _check)."""
    for path, wa, wb in zip(a["weight_paths"], a["weights"], b["weights"]):
        if "moving_" not in path:
            assert wa == wb, f"the two processes ended with different values of {path}"


# The single-process paths in two processes side by side (one TensorFlow start-up each, not one per path), the
# plain-Keras references first in each (see parity_program): one device, and 2 virtual CPUs. Plain Keras with XLA
# (keras_one_xla) is trained only for the cases a path ran with XLA (_xla_reference).
SINGLE_PROCESS = {"one_device": ["keras_one", "tfaccel:default:compiled", "tfaccel:default:keras"],
                  "two_replicas": ["keras_mirrored", "tfaccel:mirrored:auto"]}


@pytest.fixture(scope="session")
def single_process_dirs(parity_dir: Path) -> dict:
    """Every single-process path's output directory, all run once per session."""
    groups = list(SINGLE_PROCESS.values())
    envs = {f"paths:{i}": {"PARITY_PATHS": ",".join(paths), "PARITY_OUT": str(parity_dir)}
            for i, paths in enumerate(groups)}
    harness.assert_all_ok(harness.run_tasks(PROGRAM, tasks=[("paths", i, None) for i in range(len(groups))],
                                            per_task_env=envs, timeout=900))
    return {path: parity_dir / path.replace(":", "_") for paths in groups for path in paths}


@pytest.fixture(scope="session")
def reference(single_process_dirs: dict, parity_dir: Path) -> dict:
    return {"keras_one": single_process_dirs["keras_one"], "keras_mirrored": single_process_dirs["keras_mirrored"],
            "keras_one_xla": parity_dir / "keras_one_xla"}


def _xla_reference(out: Path, task: str, xla_dir: Path) -> None:
    """Plain Keras with ``jit_compile=True`` for every case the path in ``out`` ran with XLA and that has no such
    reference yet, in one process. tfaccel's "auto" leaves XLA off for these short jobs unless cached figures say
    it pays, so this usually trains nothing, where an XLA reference of every case would be compiled and unused."""
    with_xla = [case for case in CASES if pc.load(str(out), task, case).get("jit")]
    missing = [case for case in with_xla if not (xla_dir / "main" / f"{pc.safe(case)}.json").exists()]
    if missing:
        harness.assert_all_ok(harness.run_tasks(PROGRAM, tasks=[("worker", 0, None)],
                                                args=["keras_one_xla", str(xla_dir), *missing], timeout=600))


def _check(path: str, out: Path, reference: dict, case: str, *, task: str = "main", kind: str = "one") -> None:
    got = pc.load(str(out), task, case)
    ref_path = pc.reference_for(case, kind=kind, jit=bool(got.get("jit")))
    if ref_path == "keras_one_xla":
        _xla_reference(out, task, reference[ref_path])
    if got["status"] == "refused":
        OUTCOMES.setdefault(path, {})[case] = f"refused: {got['message']}"
        assert case in MAY_REFUSE.get(path, ()), f"{path} refused {case!r}: {got['message']}"
        assert len(got["message"]) > 40  # says why
        return
    problems = pc.differences(pc.load(str(reference[ref_path]), "main", case), got, case)
    OUTCOMES.setdefault(path, {})[case] = "equal" if not problems else "DIFFERENT: " + "; ".join(problems)
    assert not problems, f"{path} vs {ref_path}, {case!r} ({got.get('loop')}):\n" + "\n".join(problems)
    steps = pc.expected_steps(case)
    if steps is not None:
        assert got["steps"] == steps, f"{case}: FitResult.steps {got['steps']}, {steps} ran"


@pytest.fixture
def one_process_path(request: pytest.FixtureRequest, single_process_dirs: dict) -> Path:
    return single_process_dirs[request.node.callspec.params["path"]]


@pytest.mark.timeout(1200)  # the first test pays for every single-process path's run
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("path", ["tfaccel:default:compiled", "tfaccel:default:keras", "tfaccel:mirrored:auto"])
def test_one_process(path: str, case: str, one_process_path: Path, reference: dict) -> None:
    _check(path, one_process_path, reference, case,
           kind="tf_distribute" if path.startswith("tfaccel:mirrored") else "one")


@pytest.fixture(scope="session")
def multi_worker_dir(parity_dir: Path) -> Path:
    out = parity_dir / "multi_worker"
    results = harness.run_tasks(PROGRAM, workers=2, args=["tfaccel:multi_worker:auto", str(out)], timeout=500)
    harness.assert_all_ok(results)
    return out


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", CASES)
def test_multi_worker_two_processes(case: str, multi_worker_dir: Path, reference: dict) -> None:
    _check("tfaccel:multi_worker:auto", multi_worker_dir, reference, case, task="worker0", kind="tf_distribute")
    _same_weights_everywhere(*(pc.load(str(multi_worker_dir), t, case) for t in ("worker0", "worker1")))
    other = pc.load(str(multi_worker_dir), "worker1", case)
    assert not other.get("checkpoint_written_here") and not other.get("csv_written_here")  # the chief's paths only


@pytest.fixture(scope="session")
def horovod_dir(parity_dir: Path) -> Path:
    out = parity_dir / "horovod"
    harness.run_under_horovod(PROGRAM, ["tfaccel:horovod:auto", str(out)], timeout=500)
    return out


@pytest.mark.horovod
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", CASES)
def test_horovod_two_ranks(case: str, horovod_dir: Path, reference: dict) -> None:
    _check("tfaccel:horovod:auto", horovod_dir, reference, case, task="rank0", kind="horovod")
    _same_weights_everywhere(*(pc.load(str(horovod_dir), t, case) for t in ("rank0", "rank1")))
    other = pc.load(str(horovod_dir), "rank1", case)
    assert not other.get("checkpoint_written_here") and not other.get("csv_written_here")  # the chief's paths only


@pytest.mark.parametrize("case", [c for c, spec in parity_cases.CASES.items() if spec.multi_replica_reference
                                  == "one_device"])
def test_keras_own_multi_replica_clipping_differs(case: str, reference: dict) -> None:
    """Why tfaccel clips after the all-reduce: plain Keras 3.15 under MirroredStrategy clips each replica's partial
    gradient, so it trains another model than one device at the same global batch. When this fails, Keras fixed
    it upstream and tfaccel.train.optim's clipping swap can go."""
    mirrored = pc.load(str(reference["keras_mirrored"]), "main", case)
    one = pc.load(str(reference["keras_one"]), "main", case)
    assert pc.differences(one, mirrored, case), "Keras' own mirrored clipping now equals one device"


@pytest.fixture(scope="session")
def parameter_server_dir(parity_dir: Path) -> Path:
    out = parity_dir / "parameter_server"
    tasks = harness.tf_configs_for(harness.loopback_cluster(1, ps=1, chief=True), roles=("ps", "worker", "chief"))
    results = harness.run_tasks(PROGRAM, tasks=tasks, args=["tfaccel:parameter_server:auto", str(out)], timeout=900,
                                env={"PS_TEST_DONE": str(parity_dir / "ps_done")})
    harness.assert_all_ok(results)
    return out


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", CASES)
def test_parameter_server_chief_worker_ps(case: str, parameter_server_dir: Path, reference: dict) -> None:
    """One worker runs the closures one after the other: the coordinator loop must then train exactly like fit."""
    _check("tfaccel:parameter_server:auto", parameter_server_dir, reference, case, task="chief0")


def teardown_module() -> None:
    harness.record_parity_outcomes(OUTCOMES)


def test_the_rule_never_takes_a_nan_weight_on_one_side_for_equal():
    """Where both runs end with NaN at the same places (TerminateOnNaN's case) they agree; a NaN on one side only,
    or a finite difference above the tolerance, is a difference."""
    record = {"status": "ok", "history": {"loss": [1.0]}, "weights": [[0.5, float("nan")]]}
    same = {**record, "weights": [[0.5 + 1e-6, float("nan")]]}
    one_nan = {**record, "weights": [[float("nan"), float("nan")]]}
    far = {**record, "weights": [[0.6, float("nan")]]}
    assert pc.differences(record, same, "x") == []
    assert pc.differences(record, one_nan, "x") == ["final weights differ by nan (> 1e-05)"]
    assert pc.differences(one_nan, record, "x") == ["final weights differ by nan (> 1e-05)"]
    assert pc.differences(record, far, "x") == ["final weights differ by 0.1 (> 1e-05)"]
