"""run_local / run_host / the supervisor with real (small, TensorFlow-free) processes on loopback."""

import functools
import json
import socket
import sys
import threading
import time

import pytest

from launch_util import SCRIPTS, run_tracked, track, wait_gone
from tfaccel.errors import ConfigError
from tfaccel.launch import run_host, run_local
from tfaccel.launch.procs import LOOPBACK, free_ports, pid_alive
from tfaccel.launch.outcome import LaunchTask, describe_returncode, exit_code
from tfaccel.launch.supervisor import run_job

PY = sys.executable
TASK_NAME = "import json, os; t = json.loads(os.environ['TF_CONFIG'])['task']; name = f\"{t['type']}:{t['index']}\"\n"


def _run(*args, **kwargs):
    return run_tracked(run_local, *args, **kwargs)


def test_every_worker_gets_its_own_tf_config_and_prefixed_streams(clean_tf_config, capsys):
    code = TASK_NAME + "import sys; print('out', name, os.environ['TF_CONFIG']); print('err', name, file=sys.stderr)"
    result = _run([PY, "-c", code], workers=2)
    assert result.returncode == 0 and result.reason == "ok" and result.restarts == 0
    assert [t.name for t in result.tasks] == ["worker:0", "worker:1"]
    configs = [json.loads(t.stdout.split(" ", 2)[2]) for t in result.tasks]
    assert configs[0]["cluster"] == configs[1]["cluster"]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    hosts = configs[0]["cluster"]["worker"]
    assert all(h.startswith(f"{LOOPBACK}:") for h in hosts) and len(set(hosts)) == 2
    assert [t.stderr for t in result.tasks] == ["err worker:0\n", "err worker:1\n"]
    captured = capsys.readouterr()
    assert "[worker 1] out worker:1" in captured.out and "[worker 0] out worker:0" in captured.out
    assert "[worker 1] err worker:1" in captured.err and "err worker" not in captured.out
    assert "out worker" not in captured.err


def test_mwms_cluster_with_chief_and_evaluator_runs_the_command_everywhere(clean_tf_config):
    result = _run([PY, "-c", TASK_NAME + "print(name)"], workers=1, chief=True, evaluator=True, echo=False)
    assert result.ok
    assert {t.name: t.stdout.strip() for t in result.tasks} == {
        "chief:0": "chief:0", "worker:0": "worker:0", "evaluator:0": "evaluator:0"}


def test_fail_fast_names_the_failing_task_and_stops_the_rest(clean_tf_config, launch_log):
    code = TASK_NAME + ("import sys, time\nif name == 'worker:1':\n    print('bad thing happened', file=sys.stderr)\n"
                        "    time.sleep(0.5); sys.exit(3)\ntime.sleep(600)")
    started = time.monotonic()
    result = _run([PY, "-c", code], workers=3, grace=2)
    assert time.monotonic() - started < 15
    assert result.returncode == 3 and result.reason == "failed" and result.failed_task == "worker:1"
    assert result.task("worker:1").returncode == 3 and not result.task("worker:1").stopped
    assert result.task("worker:0").stopped and result.task("worker:2").stopped
    assert "worker:1" in result.message and "exit code 3" in result.message
    failure = next(m for m in launch_log if "failed" in m and "Last lines" in m)
    assert "worker:1" in failure and "bad thing happened" in failure
    assert any(m.startswith("launch: job failed (exit 3)") for m in launch_log)


def test_timeout_stops_everything_with_exit_124(clean_tf_config, launch_log):
    started = time.monotonic()
    result = _run([PY, "-c", "import time; time.sleep(600)"], workers=2, timeout=2, grace=1)
    assert time.monotonic() - started < 10
    assert result.returncode == 124 and result.reason == "timeout"
    assert all(t.stopped for t in result.tasks)
    assert "timed out after 2 s" in result.message and "worker:0, worker:1" in result.message
    assert any("job timed out (exit 124)" in m for m in launch_log)


def test_sigkill_after_grace_and_no_orphaned_grandchildren(clean_tf_config):
    """Tasks that ignore SIGTERM are SIGKILLed after the grace period, with the children they started."""
    result = _run([PY, str(SCRIPTS / "sleeper.py"), "--ignore-term"], workers=2, timeout=3, grace=1, echo=False)
    assert result.reason == "timeout"
    assert [t.returncode for t in result.tasks] == [-9, -9]
    children = [int(t.stdout.split("child=")[1].split()[0]) for t in result.tasks]
    track(children)
    assert not wait_gone(children, timeout=5)


def test_max_restarts_runs_the_job_again_with_fresh_ports(clean_tf_config, tmp_path, launch_log):
    marker = tmp_path / "crashed-once"
    printed = tmp_path / "worker0-printed"  # worker:1 fails only once worker:0 has printed (a loaded machine is slow)
    code = TASK_NAME + (f"import sys, time, pathlib\nm = pathlib.Path({str(marker)!r})\n"
                        f"p = pathlib.Path({str(printed)!r})\nprint(os.environ['TF_CONFIG'])\n"
                        "print('restart', os.environ['TFACCEL_RESTART_COUNT'], flush=True)\n"
                        "if name == 'worker:0': p.write_text('x')\n"
                        "if name == 'worker:1' and not m.exists():\n"
                        "    end = time.time() + 60\n"
                        "    while not p.exists() and time.time() < end: time.sleep(0.05)\n"
                        "    m.write_text('x'); sys.exit(7)")
    result = _run([PY, "-c", code], workers=2, max_restarts=1, echo=False)
    assert result.returncode == 0 and result.restarts == 1 and len(result.attempts) == 2
    assert result.attempts[0][1].returncode == 7
    first, second = (json.loads(a[0].stdout.splitlines()[0])["cluster"] for a in result.attempts)
    assert first != second  # fresh OS-chosen ports
    assert [a[0].stdout.splitlines()[1] for a in result.attempts] == ["restart 0", "restart 1"]
    restart = "restarting the whole job (restart 1 (a failure, counted: 1 of 1 restarts used)"
    assert any(restart in m and "worker:1" in m for m in launch_log)


def test_restarts_give_up_after_max_restarts(clean_tf_config):
    result = _run([PY, "-c", "import sys; sys.exit(5)"], workers=1, max_restarts=2, echo=False)
    assert result.returncode == 5 and result.restarts == 2 and len(result.pids) == 3


def test_killed_task_exit_code_is_128_plus_signal():
    assert exit_code(-9) == 137 and exit_code(3) == 3
    assert describe_returncode(-9) == "killed by SIGKILL (exit code 137)"
    assert describe_returncode(2) == "exit code 2"


def _double(x: int) -> dict:
    import os

    return {"value": 2 * x, "task": json.loads(os.environ["TF_CONFIG"])["task"]["index"]}


def _boom() -> None:
    raise RuntimeError("boom from a task")


def test_callable_runs_in_every_task_and_returns_values(clean_tf_config):
    result = _run(_double, workers=2, args=(21,), echo=False)
    assert result.ok
    assert [t.value for t in result.tasks] == [{"value": 42, "task": 0}, {"value": 42, "task": 1}]


def test_callable_raising_fails_the_job_with_its_traceback(clean_tf_config):
    result = _run(_boom, workers=1, echo=False)
    assert result.returncode == 1 and result.failed_task == "worker:0"
    assert "RuntimeError: boom from a task" in result.tasks[0].stderr


def test_unpicklable_callable_is_a_config_error():
    with pytest.raises(ConfigError, match=r"cmd_or_callable: .* cannot be sent to the task processes"):
        run_local(functools.partial(_double, threading.Lock()), workers=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": 0}, r"workers: must be an integer >= 1; received 0"),
    ({"ps": -1}, r"ps: must be an integer >= 0; received -1"),
    ({"max_restarts": -1}, r"max_restarts: must be an integer >= 0; received -1"),
    ({"timeout": 0}, r"timeout: must be a positive number of seconds or None; received 0"),
    ({"cluster": {"worker": ["127.0.0.1:1"]}, "ps": 1}, r"cluster: given together with workers/ps/chief/evaluator"),
    ({"env": {"TF_CONFIG": "{}"}}, r"env: TF_CONFIG cannot be set through env"),
    ({"args": (1,)}, r"args/kwargs: only for a callable"),
])
def test_bad_options_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        run_local(["true"], **kwargs)


def test_empty_command_is_a_config_error():
    with pytest.raises(ConfigError, match=r"command: received an empty command; put the program after `--`"):
        run_local([], workers=1)


def test_cluster_with_remote_addresses_is_refused_in_local_mode():
    cluster = {"worker": ["127.0.0.1:2222", "192.0.2.7:2222"]}  # TEST-NET-1: never this machine
    with pytest.raises(ConfigError, match=r"not on it: worker:1 \(192.0.2.7:2222\); run `tfaccel launch --cluster "
                                          r"FILE --task NAME"):
        run_local(["true"], cluster=cluster)


def test_ps_cluster_without_chief_is_refused():
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"]}
    with pytest.raises(ConfigError, match=r"a parameter-server cluster needs a chief to run the command"):
        run_local(["true"], cluster=cluster)


def test_local_cluster_from_a_dict_keeps_its_ports(clean_tf_config):
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{ports[0]}", f"127.0.0.1:{ports[1]}"]}
    result = _run([PY, "-c", "import os; print(os.environ['TF_CONFIG'])"], cluster=cluster, echo=False)
    assert result.ok
    assert json.loads(result.tasks[1].stdout)["cluster"] == cluster


# -- server tasks (the supervisor's staged start), with tiny socket servers instead of TensorFlow ------------

LISTENER = ("import socket, sys, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('listening', flush=True)\ntime.sleep(600)")


def _tasks(server_cmd, command_code, port):
    return [LaunchTask("ps", 0, (PY, "-c", *server_cmd), {"PATH": "/usr/bin:/bin"}, server=True,
                       address=f"127.0.0.1:{port}"),
            LaunchTask("chief", 0, (PY, "-c", command_code), {}, server=False)]


def test_servers_start_first_and_are_ended_when_commands_finish(clean_tf_config):
    port = free_ports(1)[0]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).close(); print('reached')"
    result = run_job(lambda attempt: _tasks((LISTENER, str(port)), probe, port), timeout=30, grace=2, echo=False)
    track(result.pids)
    assert result.ok, result.message
    assert result.task("chief:0").stdout == "reached\n"
    assert result.task("ps:0").stopped and result.task("ps:0").returncode == -15
    assert not wait_gone(result.pids)


def test_server_exiting_early_fails_the_job(clean_tf_config):
    port = free_ports(1)[0]
    server = LISTENER.replace("time.sleep(600)", "time.sleep(1); sys.exit(0)")
    result = run_job(lambda attempt: _tasks((server, str(port)), "import time; time.sleep(600)", port), timeout=30,
                     grace=2, echo=False)
    track(result.pids)
    assert result.returncode == 1 and result.failed_task == "ps:0"
    assert "(a server task) exited before the command tasks finished" in result.message
    assert not wait_gone(result.pids)


def test_server_that_never_listens_is_unreachable(clean_tf_config):
    port = free_ports(1)[0]
    started = time.monotonic()
    result = run_job(lambda attempt: _tasks(("import time; time.sleep(600)",), "print('never runs')", port),
                     timeout=30, grace=1, connect_timeout=1.5, echo=False)
    track(result.pids)
    assert time.monotonic() - started < 10
    assert result.returncode == 1 and result.reason == "unreachable"
    assert f"ps:0 (127.0.0.1:{port})" in result.message and "within 1.5 s" in result.message
    assert [t.name for t in result.tasks] == ["ps:0"]  # the command task never started
    assert not wait_gone(result.pids)


# -- per-host mode -------------------------------------------------------------------------------------------

def test_run_host_fails_within_connect_timeout_naming_missing_peers(clean_tf_config):
    ports = free_ports(3)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    started = time.monotonic()
    result = run_host([PY, "-c", "import time; time.sleep(600)"], cluster=cluster, task="worker:0",
                      connect_timeout=2, grace=1, echo=False)
    elapsed = time.monotonic() - started
    track(result.pids)
    assert elapsed < 10
    assert result.returncode == 1 and result.reason == "unreachable"
    assert f"worker:1 (127.0.0.1:{ports[1]}), worker:2 (127.0.0.1:{ports[2]})" in result.message
    assert "never accepted connections within 2 s" in result.message
    assert result.tasks[0].stopped and not wait_gone(result.pids)


def test_run_host_runs_its_task_once_peers_accept_connections(clean_tf_config):
    ports = free_ports(2)
    peer = socket.socket()
    peer.bind(("127.0.0.1", ports[1]))
    peer.listen()
    try:
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        result = run_host([PY, "-c", "import os; print(os.environ['TF_CONFIG'])"], cluster=cluster,
                          task="worker:1", connect_timeout=5, echo=False)
    finally:
        peer.close()
    track(result.pids)
    assert result.ok
    doc = json.loads(result.tasks[0].stdout)
    assert doc["task"] == {"type": "worker", "index": 1} and result.tasks[0].name == "worker:1"
    assert not wait_gone(result.pids)


def test_run_host_rejects_a_task_not_in_the_cluster():
    with pytest.raises(ConfigError, match=r"--task .*worker:5.*valid tasks: worker:0, worker:1"):
        run_host(["true"], cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, task="worker:5")


def test_run_host_refuses_a_ps_cluster_without_chief():
    from tfaccel.launch.host import host_plan

    with pytest.raises(ConfigError, match=r"^cluster: a parameter-server cluster needs a chief"):
        host_plan(["python", "coord.py"], cluster={"worker": ["h1:1"], "ps": ["h2:1"]}, task="worker:0")


def test_run_host_ps_task_runs_the_server_command(tmp_path):
    from tfaccel.launch.host import host_plan

    cluster = {"chief": ["h0:1"], "worker": ["h1:1"], "ps": ["h2:1"]}
    # the ps host runs tfaccel's server, not the script: a script that is not on that host is no error there
    _spec, task, peers, _notes = host_plan(["python", "coord.py"], cluster=cluster, task="ps:0")
    assert task.server and task.cmd[1:] == ("-m", "tfaccel.launch.server")
    assert json.loads(task.env["TF_CONFIG"])["task"] == {"type": "ps", "index": 0}
    assert peers == [("chief:0", "h0:1"), ("worker:0", "h1:1")]
    with pytest.raises(ConfigError, match=r"^command: script 'coord.py' not found"):
        host_plan(["python", "coord.py"], cluster=cluster, task="chief:0")
    script = tmp_path / "coord.py"
    script.write_text("")
    _spec, chief, _peers, _notes = host_plan(["python", str(script)], cluster=cluster, task="chief:0")
    assert not chief.server and chief.cmd == ("python", str(script))


def test_launcher_process_environment_is_untouched(clean_tf_config):
    import os

    _run([PY, "-c", "pass"], workers=1, echo=False)
    assert "TF_CONFIG" not in os.environ
    assert pid_alive(os.getpid())


def test_launchers_own_tf_config_is_not_passed_on_and_says_so(clean_tf_config, monkeypatch, launch_log):
    theirs = json.dumps({"cluster": {"worker": ["10.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})
    monkeypatch.setenv("TF_CONFIG", theirs)
    result = _run([PY, "-c", "import os; print(os.environ['TF_CONFIG'])"], workers=1, echo=False)
    assert json.loads(result.tasks[0].stdout)["cluster"]["worker"][0].startswith("127.0.0.1:")
    assert any("TF_CONFIG is set in the launcher's environment" in m and "it is not passed on" in m
               for m in launch_log)


def test_a_task_that_cannot_be_executed_exits_127_with_a_message(clean_tf_config, tmp_path):
    from tfaccel.launch.procs import start_process

    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\necho hi\n")
    proc = start_process([str(script)], die_with_parent=True)
    track([proc.pid])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 127
    assert f"tfaccel launch: cannot run {str(script)!r}: [Errno 13] Permission denied" in err.decode()
