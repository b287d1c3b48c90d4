"""Step accounting after a lost worker: chief + 2 workers + 1 ps as real processes; worker:1 is SIGKILLed while
closures are in flight. ClusterCoordinator re-runs its closure on worker:0 (at-least-once) and the job completes;
``details["ps_accounting"]`` must say what happened: the updates applied (the optimizer's own ``iterations``), the
updates counted per worker (all of them but at most the one the lost worker applied and had no time to count), the
examples each worker's counted updates used, and how many closures ran again.
"""

import json
import os
import re
import sys
import threading
import time
from pathlib import Path


from tfaccel.launch.procs import LOOPBACK, free_ports, start_process, terminate

from test_ps_recommender import BATCH, JOB, write_shards

REPO = Path(__file__).resolve().parents[2]
STEPS, EPOCHS = 32, 3


class Task:
    """One process of the cluster, its output lines collected by a thread."""

    def __init__(self, name: str, cluster: dict, env: dict) -> None:
        role, index = name.split(":")
        child = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFACCEL_")}
        child.update(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": int(index)}}),
                     PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
        cmd = [sys.executable, str(JOB)] if role == "chief" else [sys.executable, "-m", "tfaccel.launch.server"]
        self.proc = start_process(cmd, env=child, cwd=str(REPO), die_with_parent=True)
        self.text = ""
        self.readers = [threading.Thread(target=self._read, args=(s,), daemon=True)
                        for s in (self.proc.stdout, self.proc.stderr)]
        for reader in self.readers:
            reader.start()

    def _read(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.text += raw.decode("utf-8", "replace")
        stream.close()


def test_lost_worker_is_accounted_exactly(tmp_path):
    ports = iter(free_ports(4))
    cluster = {"chief": [f"{LOOPBACK}:{next(ports)}"], "worker": [f"{LOOPBACK}:{next(ports)}" for _ in range(2)],
               "ps": [f"{LOOPBACK}:{next(ports)}"]}
    env = {"REC_FILES": write_shards(tmp_path / "data", 4096), "REC_STEPS": str(STEPS), "REC_EPOCHS": str(EPOCHS),
           "REC_VERBOSE": "1", "REC_PARTITIONS": "1"}
    tasks = {name: Task(name, cluster, env) for name in ("ps:0", "worker:0", "worker:1", "chief:0")}
    chief, killed = tasks["chief:0"], False
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and chief.proc.poll() is None:
            if not killed and re.search(r"epoch 1/\d+", chief.text):
                time.sleep(0.5)  # into epoch 2: both workers busy with closures
                tasks["worker:1"].proc.kill()
                killed = True
            time.sleep(0.1)
        assert chief.proc.poll() is not None, f"the chief still ran after 240 s:\n{chief.text[-3000:]}"
    finally:
        terminate([t.proc for t in tasks.values()], grace=2)
        for task in tasks.values():
            for reader in task.readers:
                reader.join(timeout=5)
    assert killed and chief.proc.returncode == 0, chief.text[-5000:]
    out = json.loads([line for line in chief.text.splitlines() if line.startswith("{")][-1])
    accounting = out["accounting"]
    print("measured:", json.dumps(accounting), "optimizer iterations", out["optimizer_iterations"])
    scheduled = STEPS * EPOCHS
    assert accounting["updates_scheduled"] == scheduled and accounting["closures_scheduled"] == scheduled // 8
    per_worker = accounting["updates_counted_per_worker"]
    assert accounting["updates_applied"] == out["optimizer_iterations"] >= scheduled
    assert accounting["updates_not_counted"] == accounting["updates_applied"] - sum(per_worker.values()) in (0, 1)
    assert per_worker["worker:0"] > per_worker["worker:1"] > 0
    # 4096 examples in 4 files of 1024: whole batches of 64 only, so every update used 64 examples
    assert accounting["examples_seen"] == {k: BATCH * n for k, n in per_worker.items()}
    assert accounting["closures_started"] == accounting["closures_scheduled"] + accounting["closures_rerun"]
