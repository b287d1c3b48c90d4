"""Issue 24 point 6: a real local Ray Train worker gets the job's variables, never the launcher's secrets."""

import json
import sys
import uuid

import pytest

import ray_util
from tfaccel.launch import netns

pytestmark = pytest.mark.slow

PROBE = ("import json, os, socket\n"
         "names = ('AWS_SECRET_ACCESS_KEY', 'HF_TOKEN', 'LD_PRELOAD_FAKE', 'JOB_NAMED', 'TFACCEL_RAY_TEST_MARK',\n"
         "         'PATH', 'TFACCEL_JOB_ID')\n"
         "seen = {n: os.environ.get(n) for n in names}\n"
         "seen['interfaces'] = sorted(name for _, name in socket.if_nameindex())\n"
         "print('PROBE ' + json.dumps(seen), flush=True)\n")


def test_ray_worker_gets_the_allowlist_and_named_variables_but_no_secret(tmp_path):
    mark = f"env-{uuid.uuid4().hex[:12]}"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    secrets = {"AWS_SECRET_ACCESS_KEY": "fake-aws-secret", "HF_TOKEN": "fake-hf-token", "LD_PRELOAD_FAKE": "x.so"}
    done = ray_util.run_in(None, [sys.executable, "-m", "tfaccel", "launch", "--backend", "ray", "--workers", "1",
                                  "--timeout", "150", "--env", "JOB_NAMED", "--job-id", "ray-job-7", "--",
                                  sys.executable, str(probe)],
                           mark=mark, env={**secrets, "JOB_NAMED": "named-value"}, timeout=170)
    left = ray_util.kill_marked(mark, wait=15)
    assert done.returncode == 0, done.stdout[-4000:]
    assert not left, f"processes of the run survived it: {left}"
    line = next(line for line in done.stdout.splitlines() if "PROBE " in line)
    seen = json.loads(line.split("PROBE ", 1)[1])
    assert seen["AWS_SECRET_ACCESS_KEY"] is None and seen["HF_TOKEN"] is None and seen["LD_PRELOAD_FAKE"] is None
    assert seen["JOB_NAMED"] == "named-value" and seen["TFACCEL_RAY_TEST_MARK"] == mark and seen["PATH"]
    assert seen["TFACCEL_JOB_ID"] == "ray-job-7"  # the launch's job id reaches the worker
    assert "fake-aws-secret" not in done.stdout
    if netns.isolation_available()[0]:  # --network auto: Ray and its workers run in the loopback-only namespace
        assert seen["interfaces"] == ["lo"], seen["interfaces"]
    # the launcher says, by name only, what it did not pass on
    assert "not passed on:" in done.stdout and "AWS_SECRET_ACCESS_KEY" in done.stdout
