"""The limit every benchmark compares tfaccel with: the same compiled model trained by a hand-written loop.

Each epoch's whole batches run in one ``tf.function`` (``tf.while_loop``, XLA on or off) calling the model's own
``train_step``, so the loss, the metrics and the optimizer are the ones ``fit`` would run; the data sits on the
device, the order is a seeded permutation per epoch, and nothing else runs (no ``fit``, no callbacks but the
timer, the partial last batch dropped). Both ``tfaccel bench --quick`` (P3) and ``--suite real`` use it, so a
ratio to "the limit" means the same job everywhere.
"""

from typing import Any, Dict

import numpy as np
import tensorflow as tf

from tfaccel.compat.keras_internals import symbolic_build

__all__ = ["LIMIT_CONTENDERS", "LIMIT_LOOP", "train_step_loop"]

LIMIT_CONTENDERS = {"limit_xla": True, "limit_noxla": False}  # name -> jit_compile
LIMIT_LOOP = "hand-written whole-epoch tf.while_loop calling model.train_step"


def train_step_loop(model: Any, data: tuple, *, batch: int, epochs: int, jit: bool, timer: Any,
                    seed: int = 0) -> Dict[str, Any]:
    """Trains the compiled ``model`` on ``data`` (``(x, y)``, ``x`` possibly nested) for ``epochs`` epochs.

    Args:
        model: a compiled Keras model (its optimizer, loss and metrics are used as compiled).
        data: in-memory ``(x, y)``. batch: the batch size. epochs: epochs to run.
        jit: compile each epoch's loop with XLA. timer: a callback-like object with ``on_epoch_begin(epoch)`` and
            ``on_epoch_end(epoch, logs)``. seed: the seed of each epoch's example order.

    Returns:
        What ran, for a benchmark's details: ``{"jit_compile": jit, "loop": LIMIT_LOOP}``.
    """
    xs, ys = tf.nest.map_structure(tf.constant, data[0]), tf.constant(data[1])
    examples = len(data[1])
    steps = examples // batch

    def batch_at(idx: Any) -> tuple:
        return tf.nest.map_structure(lambda t: tf.gather(t, idx), xs), tf.gather(ys, idx)

    symbolic_build(model, batch_at(tf.range(batch)))  # the optimizer slots and metrics, before the loop traces

    @tf.function(jit_compile=jit)
    def epoch(order: Any) -> Any:
        def body(i: Any) -> Any:
            model.train_step(batch_at(tf.slice(order, [i * batch], [batch])))  # not order[i*b:...]: slow under XLA
            return (i + 1,)

        tf.while_loop(lambda i: i < steps, body, (tf.constant(0),))
        return model.get_metrics_result()

    rng = np.random.default_rng(seed)
    for e in range(epochs):
        timer.on_epoch_begin(e)
        model.reset_metrics()
        logs = epoch(tf.constant(rng.permutation(examples)[:steps * batch].astype(np.int32)))
        timer.on_epoch_end(e, logs)
    return {"jit_compile": jit, "loop": LIMIT_LOOP}
