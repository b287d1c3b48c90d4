"""Child program of test_train_multistep.py: one worker of a multi_worker (or a mirrored) job.

Trains the same tiny model from the same initial weights several ways in this process (one strategy per process,
several models under it) and prints one JSON line with each run's history, weights and loop:
  keras1:  tfaccel.fit, Keras fit, 1 step per execution (what multi_worker ran before the multi-step loop)
  auto:    tfaccel.fit with steps_per_execution="auto" (the multi-step loop, every batch in one call here)
  k3:      the multi-step loop, 3 steps per call (an epoch of 5 batches: calls of 3 and 2, the partial one inside)
  plain:   plain Keras model.fit on one device (no strategy) at the same global batch, same order (shuffle=False)
  accumulated / plain_accumulated: tfaccel.fit(gradient_accumulation_steps=2), and plain Keras on one device with
           the optimizer's own gradient_accumulation_steps=2, both with AdamW, a warmup-cosine schedule, use_ema and
           global_clipnorm (an update spans the end of an epoch: 5 batches an epoch)
  overflow / plain_overflow: mixed_float16, the first batch's second half (worker 1's part) inf in float16: tfaccel
           over the replicas, and plain Keras on one device (which skips that step)
Argv: STRATEGY (multi_worker or mirrored).
"""

import contextlib
import json
import sys

import numpy as np

N, BATCH, EPOCHS = 70, 16, 3  # 4 whole batches + a partial batch of 6 (3 per replica)


def _data(n: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype("float32")
    return x, ((x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32"))


def _accumulating_optimizer(**accumulate: int) -> object:
    import keras

    schedule = keras.optimizers.schedules.CosineDecay(0.02, decay_steps=12, warmup_target=0.05, warmup_steps=4)
    return keras.optimizers.AdamW(schedule, weight_decay=0.1, use_ema=True, ema_momentum=0.8,
                                  ema_overwrite_frequency=2, global_clipnorm=0.5, **accumulate)


def _build(optimizer: object = None) -> object:
    import keras

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=optimizer or keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    rng = np.random.default_rng(11)  # the same initial weights in every process and every run
    model.set_weights([(0.3 * rng.standard_normal(w.shape)).astype("float32") for w in model.get_weights()])
    return model


def _record(history: dict, model: object, **extra: object) -> dict:
    return {"history": {k: [float(v) for v in vals] for k, vals in history.items()},
            "weights": [w.tolist() for w in model.get_weights()], **extra}


def _overflow_runs(strategy: str) -> dict:
    """The overflow runs (module doc): final weights, loss scale and updates applied of each."""
    import keras

    import tfaccel

    x = np.random.default_rng(0).random((32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    x[12:16] = 1e5
    runs = {}
    keras.mixed_precision.set_global_policy("mixed_float16")
    for name in ("overflow", "plain_overflow"):
        keras.utils.set_random_seed(1)
        with tfaccel.scope(strategy=strategy) if name == "overflow" else contextlib.nullcontext():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1, dtype="float32")])
            model.compile(keras.optimizers.SGD(0.01), "mse")
        fit = tfaccel.fit if name == "overflow" else type(model).fit
        history = fit(model, x, y, batch_size=16, epochs=1, shuffle=False, verbose=0).history
        runs[name] = _record(history, model, scale=float(model.optimizer.dynamic_scale.numpy()),
                             updates=int(model.optimizer.iterations.numpy()))
    keras.mixed_precision.set_global_policy("float32")
    return runs


def main(strategy: str) -> int:
    import tfaccel

    if strategy == "mirrored":
        tfaccel.configure_devices(virtual_cpus=2)
    x, y = _data(N, 0)
    val = _data(22, 1)  # 22: a partial validation batch of 6
    runs = {}
    for name, kwargs in (("keras1", dict(loop="keras", steps_per_execution=1)),
                         ("auto", dict(shuffle=False)), ("k3", dict(loop="compiled", steps_per_execution=3)),
                         ("auto_shuffled", dict()), ("keras1_shuffled", dict(loop="keras", steps_per_execution=1))):
        with tfaccel.scope(strategy=strategy):
            model = _build()
        kwargs.setdefault("shuffle", "shuffled" in name)
        result = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=val, seed=3, verbose=0,
                             **kwargs)
        runs[name] = _record(result.history, model, loop=result.details["loop"], steps=result.steps,
                             spe=result.details.get("steps_per_execution"))
    with tfaccel.scope(strategy=strategy):
        model = _build(_accumulating_optimizer())
    result = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=val, shuffle=False, verbose=0,
                         gradient_accumulation_steps=2)
    runs["accumulated"] = _record(result.history, model, loop=result.details["loop"])
    keras_accumulation = _accumulating_optimizer(gradient_accumulation_steps=2)
    for name, optimizer in (("plain", None), ("plain_accumulated", keras_accumulation)):
        plain = _build(optimizer)  # built outside any strategy scope: one device, Keras' own fit
        runs[name] = _record(plain.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=val, shuffle=False,
                                       verbose=0).history, plain)
    runs.update(_overflow_runs(strategy))
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
