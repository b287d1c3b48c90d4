"""tfaccel's compiled training loop: a whole epoch in one (XLA-compiled) call.

For in-memory data on one replica, Keras' ``fit`` spends much of a small model's step outside the math
(iterator hand-off, callbacks, Python per execution): with 64 steps per execution and XLA it reached
0.60 of a hand-written whole-epoch ``tf.while_loop`` here. This loop keeps the data on the device, draws
each epoch's order from (seed, epoch), and runs every step of the epoch inside one compiled
``tf.while_loop``; metrics are exact per-example sums. compile_and_fit uses it only where it gives the
same training as ``fit`` (one replica, array data, no per-batch callbacks); ``loop="keras"`` opts out.
"""

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["compiled_loop_blockers", "fit_compiled"]

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def compiled_loop_blockers(*, backend: Any, data_kind: str, callbacks: Sequence[Any], backup_freq: Optional[int],
                           steps_per_execution: Any, steps_per_epoch_given: bool) -> List[str]:
    """Why the compiled loop cannot run this job (an empty list: it can)."""
    import keras

    blockers = []
    if backend.num_replicas_in_sync != 1 or backend.name not in ("default", "one_device"):
        blockers.append(f"strategy {backend.name} with {backend.num_replicas_in_sync} replicas (needs one replica)")
    if data_kind != "arrays":
        blockers.append(f"data is a {data_kind.replace('_', ' ')} (needs in-memory arrays)")
    for cb in callbacks:
        hooks = [h for h in _BATCH_HOOKS if getattr(type(cb), h, None) is not getattr(keras.callbacks.Callback, h)]
        if hooks:
            blockers.append(f"callback {type(cb).__name__} has per-batch hooks ({', '.join(hooks)})")
    if backup_freq:
        blockers.append("backup_freq asks for step-level backups")
    if steps_per_execution != "auto":
        blockers.append(f"steps_per_execution={steps_per_execution} was given")
    if steps_per_epoch_given:
        blockers.append("steps_per_epoch was given")
    return blockers


def _epoch_order(n: int, seed: Optional[int], epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(n, dtype=np.int32)
    rng = np.random.default_rng([0 if seed is None else int(seed), int(epoch)])
    return rng.permutation(n).astype(np.int32)


def fit_compiled(model: Any, optimizer: Any, *, loss_fn: Callable, metric_fns: Dict[str, Callable], x: Any, y: Any,
                 validation: Optional[Tuple[Any, Any]], epochs: int, start_epoch: int, batch_size: int,
                 seed: Optional[int], shuffle: bool, jit_compile: bool, callbacks: Sequence[Any], strategy: Any,
                 log_epoch: Callable[[int, int, Dict[str, float], float], None]) -> Tuple[Dict[str, List[float]],
                                                                                           List[float], int]:
    """Trains ``model`` for ``epochs - start_epoch`` epochs with the compiled loop.

    Returns:
        (history, seconds of each epoch, steps per epoch).
    """
    import keras
    import tensorflow as tf

    n = len(y)
    steps = -(-n // batch_size)
    # The last batch may be partial. Rather than a second compiled function for its shape (a second trace and
    # XLA compilation: costly for deep models), it is padded to a full batch whose padding has weight 0, so
    # the loss is the mean over the real examples exactly as Keras computes it.
    padded = steps * batch_size
    mask_all = tf.constant(np.concatenate([np.ones(n, np.float32), np.zeros(padded - n, np.float32)]))
    x_all = tf.constant(x)
    y_all = tf.constant(y)
    variables = model.trainable_variables
    names = ["loss"] + list(metric_fns)
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def train_step(xb: Any, yb: Any, mask: Any) -> List[Any]:
        with tf.GradientTape() as tape:
            pred = model(xb, training=True)
            per_ex = tf.cast(loss_fn(yb, pred), tf.float32) * mask
            loss = tf.reduce_sum(per_ex) / tf.reduce_sum(mask)
            if model.losses:
                loss += tf.add_n([tf.cast(l, tf.float32) for l in model.losses])
            target = optimizer.scale_loss(loss) if scaled else loss
        grads = tape.gradient(target, variables)
        optimizer.apply(grads, variables)
        return [tf.reduce_sum(per_ex)] + [tf.reduce_sum(tf.cast(fn(yb, pred), tf.float32) * mask)
                                          for fn in metric_fns.values()]

    zeros = [tf.constant(0.0) for _ in names]

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def run_epoch(order: Any) -> List[Any]:
        def body(i: Any, *sums: Any) -> Any:
            pos = tf.slice(tf.range(padded), [i * batch_size], [batch_size])
            idx = tf.gather(order, pos)
            mask = tf.gather(mask_all, pos)
            out = strategy.run(train_step, args=(tf.gather(x_all, idx), tf.gather(y_all, idx), mask))
            return (i + 1, *[s + o for s, o in zip(sums, out)])

        result = tf.while_loop(lambda i, *_: i < steps, body, (tf.constant(0), *zeros), parallel_iterations=1)
        return list(result[1:])

    evaluate = _make_evaluate(model, loss_fn, metric_fns, validation, batch_size, jit_compile, strategy) \
        if validation else None
    cb_list = keras.callbacks.CallbackList(list(callbacks), model=model, add_history=False, add_progbar=False,
                                           epochs=epochs, steps=steps, verbose=0)
    history: Dict[str, List[float]] = {}
    seconds: List[float] = []
    model.stop_training = False
    cb_list.on_train_begin()
    for epoch in range(start_epoch, epochs):
        cb_list.on_epoch_begin(epoch)
        t0 = time.perf_counter()
        order = _epoch_order(n, seed, epoch, shuffle)
        order = np.concatenate([order, np.zeros(padded - n, np.int32)])  # padding rows are masked out
        sums = [float(v) for v in run_epoch(tf.constant(order))]
        seconds.append(time.perf_counter() - t0)
        logs = {name: total / n for name, total in zip(names, sums)}
        if evaluate is not None:
            logs.update({f"val_{k}": v for k, v in evaluate().items()})
        for key, value in logs.items():
            history.setdefault(key, []).append(float(value))
        log_epoch(epoch, epochs, logs, seconds[-1])
        cb_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    cb_list.on_train_end()
    return history, seconds, steps


def _make_evaluate(model: Any, loss_fn: Callable, metric_fns: Dict[str, Callable], validation: Tuple[Any, Any],
                   batch_size: int, jit_compile: bool, strategy: Any) -> Callable[[], Dict[str, float]]:
    import tensorflow as tf

    xv, yv = validation
    n = len(yv)
    x_all, y_all = tf.constant(xv), tf.constant(yv)
    names = ["loss"] + list(metric_fns)

    def replica_sums(xb: Any, yb: Any) -> List[Any]:
        pred = model(xb, training=False)
        return [tf.reduce_sum(tf.cast(loss_fn(yb, pred), tf.float32))] + [
            tf.reduce_sum(tf.cast(fn(yb, pred), tf.float32)) for fn in metric_fns.values()]

    @tf.function(jit_compile=jit_compile)
    def sums_of(xb: Any, yb: Any) -> List[Any]:
        return strategy.run(replica_sums, args=(xb, yb))

    def evaluate() -> Dict[str, float]:
        totals = [0.0] * len(names)
        for start in range(0, n, batch_size):
            out = sums_of(x_all[start:start + batch_size], y_all[start:start + batch_size])
            totals = [a + float(b) for a, b in zip(totals, out)]
        return {k: v / n for k, v in zip(names, totals)}

    return evaluate
