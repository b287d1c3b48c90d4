"""The multi-process harness itself: real MultiWorkerMirroredStrategy start-up in 2 processes."""

import textwrap
from types import SimpleNamespace

import pytest

import harness
from tfaccel.launch.procs import pid_alive

MWMS_STARTUP = textwrap.dedent("""
    import json, tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    print(json.dumps({"replicas": strategy.num_replicas_in_sync, "sum": float(total),
                      "task": strategy.cluster_resolver.task_id}))
""")


def test_two_real_processes_start_mwms_in_sync():
    results = harness.run_tasks(MWMS_STARTUP, workers=2, timeout=180)
    harness.assert_all_ok(results)
    reports = [harness.last_json_line(r.stdout) for r in results]
    assert [r["replicas"] for r in reports] == [2, 2]
    assert [r["sum"] for r in reports] == [2.0, 2.0]  # an all-reduce across both processes
    assert sorted(r["task"] for r in reports) == [0, 1]
    assert not any(pid_alive(r.pid) for r in results)


def test_timeout_kills_every_process():
    results = harness.run_tasks("import time; time.sleep(600)", workers=2, timeout=3)
    assert all(r.timed_out and r.returncode is None for r in results)
    assert not any(pid_alive(r.pid) for r in results)


def test_failure_is_collected_and_peers_ended():
    code = "import os, sys, time, json\nt = json.loads(os.environ['TF_CONFIG'])['task']['index']\n" \
           "sys.exit(3) if t == 1 else time.sleep(600)"
    results = harness.run_tasks(code, workers=2, timeout=60, fail_fast_grace=1)
    assert results[1].returncode == 3
    assert results[0].returncode is None and not results[0].timed_out
    assert not any(pid_alive(r.pid) for r in results)




def test_the_heavy_files_come_first_in_their_order(pytestconfig):
    """tests/conftest.py puts the files of HEAVY_FIRST first, in that order (pytest-xdist's own reorder by number of
    tests then decides, HEAVY_FIRST breaking its ties)."""
    conftest = next(plugin for plugin in pytestconfig.pluginmanager.get_plugins()
                    if getattr(plugin, "__file__", None) == str(harness.REPO_ROOT / "tests" / "conftest.py"))
    assert all((harness.REPO_ROOT / name).is_file() for name in conftest.HEAVY_FIRST)
    items = [SimpleNamespace(path=harness.REPO_ROOT / name) for name in
             ("tests/test_log.py", conftest.HEAVY_FIRST[1], "tests/test_devices.py", conftest.HEAVY_FIRST[0])]
    conftest.pytest_collection_modifyitems(pytestconfig, items)
    assert [str(item.path.relative_to(harness.REPO_ROOT)) for item in items] == [
        conftest.HEAVY_FIRST[0], conftest.HEAVY_FIRST[1], "tests/test_log.py", "tests/test_devices.py"]


def test_last_json_line_takes_the_object_when_another_writer_wrote_after_it_on_its_line() -> None:
    """Ray's log monitor once wrote a worker's line between a driver's JSON result and its newline (CI run,
    2026-11-30): the result is still read; a line that is no JSON object is not."""
    text = ('{"flow": "tfaccel", "error": null}\x1b[36m(PlacementGroupCleaner pid=5003)\x1b[0m Failed to query\n'
            '\x1b[36m(RayTrainWorker pid=5008)\x1b[0m {"not": "a result"\n')
    assert harness.last_json_line(text) == {"flow": "tfaccel", "error": None}
    with pytest.raises(AssertionError, match="no JSON result line"):
        harness.last_json_line('{"unclosed": \n[1, 2]\n')
