"""What the ZeRO parity programs share (tests/training/zero_program.py, tests/training/zero_workers_program.py,
tests/horovod/hvd_zero_program.py): the optimizer cases, the model, the data and the plain ``model.fit`` reference.

It imports Keras: a program imports it after it has set its devices or strategy.
"""

import contextlib
import re
from typing import Any, Callable, Dict, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tfaccel.memory.shards import largest_share
from tfaccel.train.zero import UNEVEN

# name -> a factory of a fresh optimizer: each case's own state, schedule, decay or clipping
OPTIMIZERS: Dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "adam_schedule": lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(
        0.01, decay_steps=3, decay_rate=0.9)),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "sgd_nesterov_clipnorm": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, clipnorm=0.5),
    "rmsprop_global_clipnorm": lambda: keras.optimizers.RMSprop(0.01, global_clipnorm=0.3),
    "lamb": lambda: keras.optimizers.Lamb(0.01),  # its trust ratio reads each whole variable's norm
    # the moving average of the weights: updated every step, written to the weights every 3 steps and at the end
    "adamw_ema": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, use_ema=True, ema_momentum=0.8,
                                                ema_overwrite_frequency=3),
    # tfaccel.fit(gradient_accumulation_steps=ACCUMULATE) (FIT_OPTIONS), against Keras' own accumulation (REFERENCES)
    "adamw_accumulate": lambda: _accumulating_adamw(None),
}
BATCH, EPOCHS = 32, 2
ACCUMULATE = 2  # micro-batches per update in the accumulation case
# a case's tfaccel.fit options, and the optimizer of its plain reference fit (default: the case's own)
FIT_OPTIONS: Dict[str, Dict[str, Any]] = {"adamw_accumulate": {"gradient_accumulation_steps": ACCUMULATE}}
REFERENCES: Dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "adamw_accumulate": lambda: _accumulating_adamw(ACCUMULATE)}


def extras(case: str) -> Dict[str, Any]:
    """A case's callbacks and validation data, made fresh for each fit, given to tfaccel's fit and to the plain
    reference alike: "adamw_ema" is evaluated with the moving averages swapped in by Keras' ``SwapEMAWeights``, which
    also swaps them in at each epoch's end and back at the next epoch's start."""
    if case != "adamw_ema":
        return {}
    x, y = data()
    return {"callbacks": [keras.callbacks.SwapEMAWeights(swap_on_epoch=True)], "validation_data": (x[:64], y[:64])}


def _accumulating_adamw(keras_steps: Optional[int]) -> keras.optimizers.Optimizer:
    """AdamW with a schedule (read at the micro-batches so far), weight decay and clipnorm (of the mean gradient)."""
    return keras.optimizers.AdamW(keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.9),
                                  weight_decay=0.1, clipnorm=0.5, gradient_accumulation_steps=keras_steps)


def updates(case: str) -> int:
    """The optimizer's updates in a case's job (``EPOCHS`` x 8 batches of the 256 examples)."""
    return EPOCHS * 8 // FIT_OPTIONS.get(case, {}).get("gradient_accumulation_steps", 1)


def accumulated_words(case: str) -> str:
    """The plan's words for a case's accumulation ("" without one)."""
    steps = FIT_OPTIONS.get(case, {}).get("gradient_accumulation_steps")
    return (f"; gradients accumulated over {steps} micro-batches on each replica and exchanged once per update"
            if steps else "")


def callback_words(case: str) -> str:
    """The plan's words for a case's ``SwapEMAWeights`` (:func:`extras`; "" without one)."""
    return ("; Keras' SwapEMAWeights swaps the weights with their moving averages on the variables' owners, who "
            "share the result" if extras(case).get("callbacks") else "")


def replicated_bytes(case: str, variable_bytes: Sequence[int]) -> int:
    """What every replica holds besides its share of the slots: with accumulation, one accumulator per variable
    and the micro-batch counter."""
    return sum(variable_bytes) + 8 if case in FIT_OPTIONS else 0


def data():
    """256 examples of a linear regression, 8 features to 3 targets."""
    rng = np.random.RandomState(0)
    x = rng.randn(256, 8).astype("float32")
    return x, (x @ rng.randn(8, 3)).astype("float32")


def layers(input_shape=(8,), num_classes=3) -> keras.Model:
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(16, activation="relu"), keras.layers.Dense(num_classes)])


def model(optimizer: Callable[[], Any], weights: Optional[list] = None, *, scope: Any = None,
          metrics: Sequence[str] = ()) -> keras.Model:
    """The model compiled with a fresh optimizer (inside ``scope`` when given), from ``weights`` when given."""
    keras.utils.set_random_seed(1)
    with scope if scope is not None else contextlib.nullcontext():
        built = layers()
        built.compile(optimizer(), "mse", metrics=list(metrics))
    if weights is not None:
        built.set_weights(weights)
    return built


def plain_fit(plain: keras.Model, x, y, case: str = "") -> dict:
    """The reference: plain ``model.fit`` on one device (with the ``case``'s :func:`extras`), its history and final
    weights."""
    history = plain.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, **extras(case)).history
    return {"plain_history": history, "plain_weights": [w.tolist() for w in plain.get_weights()]}


def embedding_layers() -> keras.Model:
    """An Embedding table (sparse ``IndexedSlices`` gradients, left unsharded) beside Dense layers (sharded)."""
    return keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8),
                             keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


# name -> a factory of a fresh optimizer for the Embedding model: each summed gradient clipped (the table's too),
# or every gradient clipped by the global norm over the sharded and unsharded ones (0.05: below the first steps' norm)
EMBEDDING_OPTIMIZERS: Dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "embedding": lambda: keras.optimizers.Adam(0.01, clipnorm=1.0),
    "embedding_global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05),
}

EMBEDDING_UNCLIPPED: Dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "embedding_unclipped": lambda: keras.optimizers.Adam(0.01),
}
"""Over workers only: Adam reads the table's slices themselves (no clipping densifies them), so their sum may not
ride in the sharded exchange (tfaccel.compat.keras_zero_collective.foldable)."""


def embedding_model(scope: Any = None,
                    optimizer: Callable[[], Any] = EMBEDDING_OPTIMIZERS["embedding"]) -> keras.Model:
    """:func:`embedding_layers` compiled with a fresh ``optimizer`` (by default Adam with ``clipnorm``)."""
    keras.utils.set_random_seed(2)
    with scope if scope is not None else contextlib.nullcontext():
        built = embedding_layers()
        built.compile(optimizer(), "mse", metrics=["mae"])
    return built


def global_norms(model: keras.Model, x, y) -> list:
    """The global gradient norm of each of the first 3 batches of plain training from the model's weights (its
    optimizer is not stepped): whether a ``global_clipnorm`` bites."""
    norms = []
    for start in range(0, 3 * BATCH, BATCH):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x[start:start + BATCH], y=y[start:start + BATCH],
                                      y_pred=model(x[start:start + BATCH], training=True))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
        norms.append(float(tf.linalg.global_norm(grads)))
    return norms


def embedding_data():
    """256 rows of 6 token ids below 50, one regression target each."""
    rng = np.random.RandomState(1)
    return rng.randint(0, 50, (256, 6)).astype("int32"), rng.randn(256, 1).astype("float32")


class StopAt(keras.callbacks.Callback):
    """Raises ``RuntimeError`` at the end of batch ``step`` (1-based) of epoch ``epoch`` on every process: the job
    ends there, its last backup left behind."""

    def __init__(self, epoch: int = 1, step: int = 5) -> None:
        super().__init__()
        self.at, self.epoch = (epoch, step), 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch + 1) == self.at:
            raise RuntimeError("stopped for the test")


def assert_two_shard_backup(run: dict) -> None:
    """The sharded Adam-with-schedule fit of 2 processes stopped by :class:`StopAt` (1, 5), backed up every 3 steps of
    8: its last backup (step 11) has one shard file per process, named by the pointer with the owners, and the fresh
    model resumed from (1, 3). ``run``: what the program reported (``pointer``, ``left``, ``resumed_from``)."""
    shards = run["pointer"]["optimizer_shards"]
    assert (run["pointer"]["epoch"], run["pointer"]["step"], run["pointer"]["global_step"]) == (1, 3, 11)
    assert shards["count"] == shards["processes"] == 2 and sorted(set(shards["owners"])) == [0, 1]
    assert shards["files"] == ["backup-11.shard-0-of-2.npz", "backup-11.shard-1-of-2.npz"]
    assert set(shards["files"]) | {"backup-11.weights.h5"} <= set(run["left"])
    assert run["resumed_from"] == [1, 3]


def uneven_words(sizes, replicas: int) -> str:
    """What the plan adds when the whole-variable partition of ``sizes`` (bytes) is uneven ("" if it is not), with
    the variable's path written as VARIABLE (see :func:`variable_blind`)."""
    share = largest_share(sizes, replicas)
    if share <= UNEVEN:
        return ""
    return (f"; uneven: one replica holds {share:.2f}x the mean share of the sharded state (whole variables are "
            f"partitioned, and VARIABLE alone is {max(sizes) / sum(sizes):.0%} of it)")


def variable_blind(note: str) -> str:
    """``note`` with the variable an uneven partition names written as VARIABLE (layer names vary by process)."""
    return re.sub(r"and \S+ alone is", "and VARIABLE alone is", note)
