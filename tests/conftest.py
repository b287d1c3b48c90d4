"""Shared fixtures.

The test process gets 2 virtual CPU devices at start-up (before TensorFlow initialises), so
multi-replica code (MirroredStrategy) runs here without a GPU. Tests that need a single-device process
run a subprocess through the harness.
"""

import faulthandler
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import harness`

import gc_watch  # noqa: E402
import harness  # noqa: E402

from tfaccel.launch.procs import pid_alive  # noqa: E402

NUM_VIRTUAL_CPUS = 2

# The files that take longest (seconds of test time in a clean-clone run of the README's command, 2026-11-28,
# 2-core VM), collected first: with `-n 2 --dist loadfile` a file is one unit of work, and a long file handed out last
# leaves the other worker idle at the end. pytest-xdist (3.x) then reorders the files by their number of tests (`--loadscope-reorder`, on by default), so this
# order only breaks its ties. Turning that reorder off (strict longest-first) was measured worse on 2 cores
# (2026-11-28, clean clone: tests 2,471 s against 1,951 s the session before): the heavy multi-process files then ran
# against each other (Keras' conformance 890 s instead of 411, the corpus 519 instead of 311), where xdist's order
# pairs them with files of many short tests.
HEAVY_FIRST = (
    "tests/corpus/test_corpus.py",  # 533
    "tests/ray/test_ray_cluster.py",  # 468
    "tests/parity/test_parity.py",  # 440
    "tests/conformance/test_keras_conformance.py",  # 674 in one process; two processes side by side since (46 items)
    "tests/reliability/test_reliability_processes.py",  # 333
    "tests/real/test_real_parity.py",  # 270
    "tests/reliability/test_reliability_elastic.py",  # 247
    "tests/training/test_ps_backup.py",  # 156
    "tests/training/test_train_coordinator.py",  # 147
    "tests/reliability/test_reliability_keras_callbacks.py",  # 145
    "tests/memory/test_memory_cli.py",  # 143
    "tests/training/test_training_fit.py",  # 135
    "tests/doctor/test_doctor_cli.py",  # 123 (then about as long after issue 37's second part: estimated)
    "tests/doctor/test_doctor_workers.py",
    "tests/training/test_zero.py",  # about 200 under load (issue 35's parity processes, estimated from a local run)
    "tests/horovod/test_horovod_zero.py",  # about 95 (2 and 4 Gloo ranks, a loaded local run)
    "tests/training/test_zero_workers.py",  # about 56 (2 and 4 worker processes, a loaded local run)
)


def pytest_configure(config: pytest.Config) -> None:
    import tfaccel

    tfaccel.configure_devices(virtual_cpus=NUM_VIRTUAL_CPUS)
    # The processes tests start get harness.LEAN_SITE; this one read its PYTHONPATH at start-up and keeps pandas and
    # matplotlib. Not in pytest-xdist's controller, whose environment its workers inherit.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        os.environ["PYTHONPATH"] = harness.lean_pythonpath(os.environ.get("PYTHONPATH"))


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """The files of HEAVY_FIRST first (in that order), every other file after them as collected; a file's own tests
    keep their order."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    root = Path(str(config.rootpath))

    def key(item: pytest.Item) -> int:
        path = Path(str(item.path))
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
        return rank.get(name, len(rank))

    items.sort(key=key)  # stable: the collection order stays within each rank


def _cpu_seconds() -> float:
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


# Garbage collections, timed while TFACCEL_TEST_CPU_LOG is set: tests here have waited minutes with no CPU (the
# suite's clean clones, sessions 21-24), twice caught in a collection that tore down an earlier test's tf.data
# iterator. A collection of generation 1 or 2 still running after GC_STACKS_AFTER_S seconds has every thread's Python
# stack written to <log>.gc-stacks.<xdist worker> (faulthandler), which names what the iterator's threads were
# running (generation 0 collections are too frequent to arm a watchdog for; the log's gc_gen says which generation
# the longest collection was: session 26's clean clone waited 96.8 s in one that armed none). The wait is in native
# code, so gc_watch appends py-spy's native stacks of the process as well: they showed the iterator's destructor
# waiting for its tf.data autotuning thread (docs/testing.md, session 29).
GC_STACKS_AFTER_S = 20.0
_gc_times = {"start": 0.0, "longest": 0.0, "total": 0.0, "stacks": None, "generation": -1}


def _time_collection(phase: str, info: dict) -> None:
    armed = info["generation"] >= 1 and _gc_times["stacks"] is not None
    if phase == "start":
        _gc_times["start"] = time.monotonic()
        if armed:
            faulthandler.dump_traceback_later(GC_STACKS_AFTER_S, file=_gc_times["stacks"])
            gc_watch.begin()
        return
    if armed:
        faulthandler.cancel_dump_traceback_later()
        gc_watch.end()
    took = time.monotonic() - _gc_times["start"]
    if took > _gc_times["longest"]:
        _gc_times["longest"], _gc_times["generation"] = took, info["generation"]
    _gc_times["total"] += took


if os.environ.get("TFACCEL_TEST_CPU_LOG"):
    _gc_times["stacks"] = open(  # noqa: SIM115 (open for the process's life)
        f"{os.environ['TFACCEL_TEST_CPU_LOG']}.gc-stacks.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a")
    gc.callbacks.append(_time_collection)
    gc_watch.start(_gc_times["stacks"].name, after_s=GC_STACKS_AFTER_S)  # the native stacks too (py-spy)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """``TFACCEL_TEST_CPU_LOG=path``: one JSON line per test with its wall and CPU seconds (this process and the
    children it waited for, setup included), so the suite's time on 2 cores can be planned by CPU, not only by wall
    (a file that runs 4 processes at once costs more than its wall time), and the seconds its garbage collections
    took (``gc_s``, the longest ``gc_max`` and its generation ``gc_gen``)."""
    log = os.environ.get("TFACCEL_TEST_CPU_LOG")
    if not log:
        yield
        return
    cpu, wall = _cpu_seconds(), time.monotonic()
    _gc_times["longest"] = _gc_times["total"] = 0.0
    _gc_times["generation"] = -1
    if _gc_times["stacks"] is not None:
        _gc_times["stacks"].write(f"--- {item.nodeid}\n")
        _gc_times["stacks"].flush()
    yield
    line = {"test": item.nodeid, "wall": round(time.monotonic() - wall, 2), "cpu": round(_cpu_seconds() - cpu, 2),
            "gc_s": round(_gc_times["total"], 2), "gc_max": round(_gc_times["longest"], 2),
            "gc_gen": _gc_times["generation"],
            "end": round(time.time(), 1), "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    with open(log, "a") as fh:
        fh.write(json.dumps(line) + "\n")


@pytest.fixture(scope="session", autouse=True)
def private_decision_cache(tmp_path_factory: pytest.TempPathFactory):
    """tfaccel's XLA decision cache in a directory of this test session, not the user's ~/.cache: a decision one
    test measured must not change what "auto" does in another (tests that check the cache set their own)."""
    previous = os.environ.get("TFACCEL_CACHE_DIR")
    os.environ["TFACCEL_CACHE_DIR"] = str(tmp_path_factory.mktemp("tfaccel-cache"))
    yield
    if previous is None:
        os.environ.pop("TFACCEL_CACHE_DIR", None)
    else:
        os.environ["TFACCEL_CACHE_DIR"] = previous


@pytest.fixture
def cpu_replicas() -> list:
    """Names of the logical CPU devices of this test process (2 virtual CPUs)."""
    import tensorflow as tf

    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert len(devices) == NUM_VIRTUAL_CPUS, devices
    return devices


@pytest.fixture(autouse=True)
def restore_environment():
    """A test that writes os.environ (ClusterSpec.export, a job that exports its TF_CONFIG) must not leak it
    into later tests: "auto" would pick another strategy there."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every process a test started through the harness must be gone when the test ends."""
    before = len(harness.STARTED_PIDS)
    yield
    started = harness.STARTED_PIDS[before:]
    alive = [pid for pid in started if pid_alive(pid)]
    assert not alive, f"processes left alive by the test: {alive}"


@pytest.fixture
def clean_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TF_CONFIG / SLURM / Horovod variables leak into the test."""
    for name in list(os.environ):
        if name == "TF_CONFIG" or name.startswith(("SLURM_", "HOROVOD_", "OMPI_COMM_WORLD", "PMI_")) \
                or name in ("COLAB_TPU_ADDR", "TPU_NAME"):
            monkeypatch.delenv(name, raising=False)
