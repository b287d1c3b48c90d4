"""Child program: one MultiWorkerMirroredStrategy per process, whatever asks for it (issue 13, point 2).

Run on each worker of a real 2-worker cluster (TF_CONFIG on loopback). Asks for the multi_worker backend
several ways, then for a second, different collective strategy (other options; mirrored), then trains a tiny
model in lock-step with the one strategy. Prints one JSON line.
"""

import hashlib
import json
import sys
from typing import Any, Callable, Dict

import numpy as np


def _refusal(ask: Callable[[], Any]) -> Dict[str, str]:
    try:
        ask()
    except Exception as exc:  # noqa: BLE001 - the test asserts on the type and message
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": "none", "message": ""}


def main() -> int:
    import tfaccel
    from tfaccel.plan import resolve_plan
    from tfaccel.strategies.peer_health import DEFAULT_STARTUP_TIMEOUT_S

    backend = tfaccel.get_backend("multi_worker")  # first thing: MWMS before TensorFlow's runtime starts
    same = {
        "auto": tfaccel.get_backend("auto") is backend,
        "get_strategy_auto": tfaccel.get_strategy("auto") is backend.strategy,
        "get_strategy_named": tfaccel.get_strategy("multi_worker") is backend.strategy,
        "defaults_spelt_out": tfaccel.get_backend("multi_worker", implementation="auto", apply_compat=True,
                                                  startup_timeout_seconds=DEFAULT_STARTUP_TIMEOUT_S) is backend,
        "plan": resolve_plan(strategy="auto")[1] is backend,
    }
    other_options = _refusal(lambda: tfaccel.get_backend("multi_worker", implementation="ring"))
    mirrored = _refusal(lambda: tfaccel.get_backend("mirrored"))
    default = tfaccel.get_backend("default")  # not collective: side by side with the multi_worker strategy
    import keras
    import tensorflow as tf

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    keras.utils.set_random_seed(100 + backend.worker_index)  # different initial weights: the broadcast fixes them
    with backend.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()]).astype("float32")
    print(json.dumps({"same": same, "other_options": other_options, "mirrored": mirrored,
                      "default_is_tf_default": default.strategy is tf.distribute.get_strategy(),
                      "backend_still_same": tfaccel.get_backend("auto") is backend,
                      "replicas": backend.num_replicas_in_sync, "worker_index": backend.worker_index,
                      "loss": history.history["loss"],
                      "weights_sha": hashlib.sha256(weights.tobytes()).hexdigest()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
