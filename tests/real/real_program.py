"""Trains the real-model suite's test jobs on one path; writes per model a JSON record and the weights (.npz).

    python real_program.py PATH OUT_DIR MODEL[,MODEL...] [MUTANT ...]
    REAL_PATH=... REAL_OUT=... REAL_NAMES=... python real_program.py

PATH: ``keras_one`` (plain model.fit on one device, at the XLA setting tfaccel's plan chose: read from
``$REAL_JIT_FROM/main/<model>.json``), ``keras_mirrored`` (plain model.fit under TF's MirroredStrategy over 2 virtual
CPUs), or ``tfaccel:<strategy>`` (``tfaccel.scope(strategy=...)`` + ``tfaccel.fit`` with every option at "auto";
``tfaccel:multi_worker`` runs under TF_CONFIG, ``tfaccel:horovod`` as Horovod ranks). MUTANTs (``model:what``, see real_cases.MUTANTS) are trained after
the models by the same path, each a model that differs from the suite's in one way. Every process writes
``OUT_DIR/<task>/<name>.json`` and ``<name>.npz`` (the weights after the first step, then the final ones).
"""

import hashlib
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import real_cases  # noqa: E402


def _task() -> str:
    if os.environ.get("HOROVOD_RANK"):  # a Horovod rank (run_horovod): rank0, rank1
        return f"rank{os.environ['HOROVOD_RANK']}"
    config = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task")
    return f"{config['type']}{config['index']}" if config else "main"


def _digest(weights: list) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()[:16]


def _strategy(path: str) -> object:
    import tensorflow as tf

    if path == "keras_mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return tf.distribute.get_strategy()


def _scope(path: str, strategy: object) -> object:
    """What the user writes around build + compile: tfaccel.scope(), or the hand-built strategy's scope."""
    if path.startswith("tfaccel:"):
        import tfaccel

        return tfaccel.scope(strategy=path.split(":")[1])
    return strategy.scope()


def _jit_for(name: str) -> bool:
    with open(os.path.join(os.environ["REAL_JIT_FROM"], "main", f"{name}.json")) as fh:
        return bool(json.load(fh)["jit"])


def _FirstEpochWeights(model: object) -> object:  # noqa: N802 - Keras is imported lazily
    """An epoch-level callback (it keeps tfaccel's compiled loop) that keeps the weights after the first epoch."""
    import keras

    class Keep(keras.callbacks.Callback):
        weights = None

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            if epoch == 0:
                self.weights = model.get_weights()

    return Keep()


def _fit(path: str, model: object, x: object, y: object, *, batch_size: int, epochs: int,
         callbacks: tuple = (), shard: bool = False) -> tuple:
    """One fit call: (history, what tfaccel did)."""
    kwargs = dict(x=x, y=y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))
    if path.startswith("keras_"):
        return model.fit(**kwargs).history, {"loop": "keras model.fit"}
    import tfaccel

    result = tfaccel.fit(model, seed=real_cases.SEED, shard_optimizer_state=shard, **kwargs)
    return result.history, {"loop": result.details.get("loop"), "steps": result.steps,
                            "optimizer_state": result.details.get("optimizer_state")}


def _slots(path: str, case: object, model: object) -> dict:
    """Under tfaccel's mirrored path: the optimizer bytes each device holds after the job and, for a sharded case,
    what ``tfaccel memory --shard-optimizer-state`` predicts for them (the estimate traces a copy of the model, made
    on the default strategy, with a fresh optimizer of the case's: Adam by name, or the case's own factory)."""
    if path != "tfaccel:mirrored":
        return {}
    from tfaccel.compat.keras_zero import slot_bytes_per_device
    from tfaccel.memory import estimate_memory

    held = slot_bytes_per_device(model.optimizer, model.distribute_strategy)
    out = {"slot_bytes": [held[d] for d in sorted(held)]}
    if case.shard:
        started = time.perf_counter()
        estimate = estimate_memory(model, batch_size=case.batch_size, strategy="mirrored", replicas=len(held),
                                   optimizer=case.fresh_optimizer() or "adam", recompute=False,
                                   shard_optimizer_state=True, input_shape=case.input_shape)
        out.update(estimate_sharded=list(estimate.optimizer_shard_bytes), estimate_unsharded=estimate.optimizer_bytes,
                   estimate_seconds=time.perf_counter() - started)
    return out


def run(path: str, name: str, strategy: object, out: str) -> dict:
    """Builds the case (same initial weights everywhere), trains one step, then the whole job; saves the weights."""
    import keras

    case = real_cases.case(name)
    keras.utils.set_random_seed(real_cases.SEED)
    started = time.perf_counter()
    with _scope(path, strategy):
        model = case.build()
    if path == "keras_one":
        model.jit_compile = _jit_for(name)
    initial = _digest(model.get_weights())
    if case.one_batch:  # one fit over one batch: its first epoch is the first step
        keep = _FirstEpochWeights(model)
        history, did = _fit(path, model, *case.first_batch(), batch_size=case.batch_size, epochs=case.epochs,
                            callbacks=[keep])
        one_step = keep.weights
    else:  # one step (the first batch), then the whole job
        _fit(path, model, *case.first_batch(), batch_size=case.batch_size, epochs=1, shard=case.shard)
        one_step = model.get_weights()
        history, did = _fit(path, model, *case.data(), batch_size=case.batch_size, epochs=case.epochs,
                            shard=case.shard)
    final = model.get_weights()
    np.savez(out + ".npz", *one_step, *final)
    return {"status": "ok", "jit": bool(model.jit_compile), "initial": initial, **did, **_slots(path, case, model),
            "history": {k: [float(v) for v in vals] for k, vals in history.items()},
            "weight_paths": [w.path for w in model.weights], "seconds": time.perf_counter() - started}


def main(argv: list) -> int:
    if not argv:  # several paths side by side (the test's phases): each process gets its own from the environment
        argv = [os.environ["REAL_PATH"], os.environ["REAL_OUT"], os.environ["REAL_NAMES"]]
    path, out_dir, names = argv[0], argv[1], argv[2].split(",") + argv[3:]
    if path in ("keras_mirrored", "tfaccel:mirrored"):
        import tfaccel

        tfaccel.configure_devices(virtual_cpus=2)
    strategy = None if path.startswith("tfaccel:") else _strategy(path)
    task_dir = os.path.join(out_dir, _task())
    os.makedirs(task_dir, exist_ok=True)
    for name in names:
        safe = name.replace(":", "__")
        try:
            record = run(path, name, strategy, os.path.join(task_dir, safe))
        except Exception:  # recorded, and the test fails with it
            record = {"status": "error", "message": traceback.format_exc()}
        with open(os.path.join(task_dir, f"{safe}.json"), "w") as fh:
            json.dump(record, fh)
        print(f"real {path} {name}: {record['status']} {record.get('seconds', 0):.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
