"""MultiWorkerMirroredStrategy collective all-reduce in lock-step, for `tfaccel launch` tests.

Every step each worker contributes (task_id + 1) * (step + 1) and all-reduces it with SUM; all workers must
see the same sums. Prints `step K sum S` per step and a JSON summary line at the end.

--crash-once MARKER: worker 1 SIGKILLs itself after step 1 when MARKER does not exist (it creates it first),
so a job restarted by `--max-restarts 1` succeeds the second time.
"""

import argparse
import json
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--crash-once", default=None, metavar="MARKER")
args = parser.parse_args()

import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task_id = strategy.cluster_resolver.task_id
sums = []
for step in range(args.steps):
    per_replica = strategy.run(lambda: tf.constant(float((task_id + 1) * (step + 1))))
    total = float(strategy.reduce("SUM", per_replica, axis=None))
    sums.append(total)
    print(f"step {step} sum {total:g}", flush=True)
    if args.crash_once and task_id == 1 and step == 1 and not os.path.exists(args.crash_once):
        with open(args.crash_once, "w") as fh:
            fh.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    if args.step_sleep:
        time.sleep(args.step_sleep)
print(json.dumps({"task": task_id, "replicas": strategy.num_replicas_in_sync, "sums": sums,
                  "restart": os.environ.get("TFACCEL_RESTART_COUNT")}), flush=True)
