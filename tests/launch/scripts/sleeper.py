"""A task that starts a child process of its own and sleeps, for signal-forwarding and orphan tests.

Prints `ready task=<name> pid=<pid> child=<child pid>` once its child runs. --ignore-term: ignore SIGTERM and
SIGINT (so only SIGKILL after the grace period ends it). --exit-after S / --code C: exit with C after S seconds.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument("--exit-after", type=float, default=None)
parser.add_argument("--code", type=int, default=0)
parser.add_argument("--only", default=None, help="apply --exit-after/--code only to this task, e.g. worker:1")
args = parser.parse_args()

task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}:{task['index']}"
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"ready task={name} pid={os.getpid()} child={child.pid}", flush=True)
if args.exit_after is not None and (args.only is None or args.only == name):
    time.sleep(args.exit_after)
    print(f"{name} exiting with {args.code}", file=sys.stderr, flush=True)
    sys.exit(args.code)
time.sleep(600)
