"""`python -m tfaccel.launch.server` refusals, and what run_local does with a callable's unpicklable result."""

import json
import sys
import threading

import pytest

from launch_util import launcher_env, track, wait_gone
from tfaccel.launch import run_local
from tfaccel.launch.procs import start_process, terminate
from tfaccel.launch.server import server_threads


def _server(tf_config=None):
    env = launcher_env()
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    proc = start_process([sys.executable, "-m", "tfaccel.launch.server"], env=env)
    track([proc.pid])
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        terminate([proc], grace=1)
    assert not wait_gone([proc.pid])
    return proc.returncode, err.decode()


@pytest.mark.parametrize("tf_config, message", [
    (None, "TF_CONFIG must name a ps or worker task; received no TF_CONFIG"),
    (json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                 "task": {"type": "chief", "index": 0}}),
     "TF_CONFIG must name a ps or worker task; received task chief:0"),
    ('{"cluster": ', "TF_CONFIG: not valid JSON"),
])
def test_server_refuses_a_task_it_cannot_serve(clean_tf_config, tf_config, message):
    rc, err = _server(tf_config)
    assert rc == 2
    assert err.startswith("tfaccel server: error: ") and message in err


def test_server_threads_avoid_the_two_core_deadlock():
    assert server_threads(2) == 3 and server_threads(1) == 2


def _lock() -> object:
    return threading.Lock()


def test_unpicklable_return_value_becomes_none_with_a_message(clean_tf_config):
    result = run_local(_lock, workers=1, timeout=60, grace=1, echo=False)
    track(result.pids)
    assert result.ok and result.tasks[0].value is None
    assert "cannot be pickled" in result.tasks[0].stderr and "returning None" in result.tasks[0].stderr
    assert not wait_gone(result.pids)
