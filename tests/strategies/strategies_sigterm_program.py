"""Child program for the SIGTERM tests (tfaccel.compat.tf_sigterm): a MultiWorkerMirrored worker that trains one
tiny epoch, says so, and then blocks inside a collective.

Prints JSON lines: {"phase": "strategy", ...} after the strategy exists (who handles SIGTERM, the plan notes),
{"phase": "ready", "pid": ...} after one fit epoch, then blocks. How it blocks (argv):

* default: worker 0 sleeps in Python while the others enter an all-reduce that waits for worker 0, so a worker
  other than 0 is inside a C++ collective when the test sends SIGTERM;
* ``--python-handler``: the program installs a Python SIGTERM handler (exit 7) after the strategy, before blocking;
* ``--kill-self WORKER``: that worker SIGKILLs itself after the fit epoch while the others wait in the all-reduce
  (for ``tfaccel launch``'s fail-fast path);
* ``--pch DIR``: creates ``PreemptionCheckpointHandler`` after the strategy and reports who handles SIGTERM then.
"""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python-handler", action="store_true")
    parser.add_argument("--kill-self", type=int, default=None)
    parser.add_argument("--pch", default=None)
    args = parser.parse_args()

    from tfaccel.strategies import get_backend

    backend = get_backend("multi_worker")
    import keras
    import tensorflow as tf

    from tfaccel.compat import tf_sigterm

    strategy = backend.strategy
    say(phase="strategy", owner=tf_sigterm.handler_owner(), applied=tf_sigterm.is_applied(), notes=list(backend.notes),
        worker=backend.worker_index)
    if args.pch:
        with strategy.scope():
            step = tf.Variable(0, dtype=tf.int64)
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            tf.distribute.cluster_resolver.TFConfigClusterResolver(), tf.train.Checkpoint(step=step), args.pch)
        python_handler = signal.getsignal(signal.SIGTERM)
        say(phase="pch", owner=tf_sigterm.handler_owner(), python_handler=getattr(python_handler, "__qualname__",
                                                                                   str(python_handler)),
            bound_to_handler=getattr(python_handler, "__self__", None) is handler)
        return 0

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16, drop_remainder=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(data, epochs=1, verbose=0)  # collectives have run

    @tf.function
    def all_reduce():
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    if args.python_handler:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(7))
    say(phase="ready", pid=os.getpid(), worker=backend.worker_index, owner=tf_sigterm.handler_owner())
    if args.kill_self == backend.worker_index:
        time.sleep(1.0)  # the others are inside the all-reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    if backend.worker_index == 0 and args.kill_self is None:
        time.sleep(120)  # the others wait for worker 0 inside the all-reduce
    all_reduce()
    say(phase="returned")  # not reached in the tests: they end the process first
    return 0


if __name__ == "__main__":
    sys.exit(main())
