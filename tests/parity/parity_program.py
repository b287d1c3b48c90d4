"""Runs every parity case on one path and writes one JSON file per case (history, weights, what tfaccel did).

    python parity_program.py PATH OUT_DIR [CASE ...]
    python parity_program.py PATH,PATH,... OUT_PARENT [CASE ...]      (several paths, one after the other)
    PARITY_PATHS=PATH,PATH,... PARITY_OUT=OUT_PARENT python parity_program.py   (the same, from the environment)

PATH: ``keras_one`` (plain model.fit, one device), ``keras_one_xla`` (the same with ``jit_compile=True``),
``keras_mirrored`` (plain model.fit under TF's own
MirroredStrategy over 2 virtual CPUs), or ``tfaccel:<strategy>:<loop>`` (tfaccel.scope + tfaccel.fit), e.g.
``tfaccel:default:compiled``, ``tfaccel:mirrored:auto``, ``tfaccel:multi_worker:auto`` (run under TF_CONFIG),
``tfaccel:horovod:auto`` (run under horovodrun), ``tfaccel:parameter_server:auto`` (every task of a chief + worker
+ ps cluster runs it: the ps and worker tasks serve until the chief creates $PS_TEST_DONE). Every process of a path writes ``OUT_DIR/<task>/<case>.json``.

Several single-process paths in one process (one TensorFlow start-up, not one per path) each write under
``OUT_PARENT/<path, ':' -> '_'>``. The plain-Keras paths must come before every ``tfaccel:`` path: tfaccel.fit may
patch Keras internals (tfaccel.compat) for the rest of the process, and a reference must be Keras' own fit. The
paths of one process must agree on the devices (2 virtual CPUs for the mirrored ones, one device otherwise).
"""

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import parity_cases  # noqa: E402


def _task() -> str:
    if os.environ.get("HOROVOD_RANK"):
        return f"rank{os.environ['HOROVOD_RANK']}"
    config = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task")
    return f"{config['type']}{config['index']}" if config else "main"


def _extras(case: str, model: object, out: str) -> dict:
    import keras

    extra = {}
    if case == "ModelCheckpoint" and _task() not in ("main", "worker0", "rank0", "chief0"):
        # Keras' rule under several workers (tf_keras'; tfaccel.resilience.keras_callbacks): only the chief writes the
        # user's path, the others a private temporary one
        extra["checkpoint_written_here"] = os.path.exists(os.path.join(out, "model.keras"))
    elif case == "ModelCheckpoint":
        loaded = keras.models.load_model(os.path.join(out, "model.keras"))
        extra["checkpoint_max_diff"] = max(float(np.max(np.abs(a - b)))
                                           for a, b in zip(loaded.get_weights(), model.get_weights()))
        extra["checkpoint_optimizer"] = type(loaded.optimizer).__name__
    if case == "CSVLogger" and _task() not in ("main", "worker0", "rank0", "chief0"):
        extra["csv_written_here"] = os.path.exists(os.path.join(out, "log.csv"))  # the same rule as ModelCheckpoint
    elif case == "CSVLogger":
        with open(os.path.join(out, "log.csv")) as fh:
            extra["csv"] = fh.read().strip().splitlines()
    if case == "LambdaCallback batch hooks":
        extra["batch_calls"] = len(parity_cases.CALLS)
    return extra


def run_case(path: str, case: parity_cases.Case, out: str) -> dict:
    import keras

    os.makedirs(out, exist_ok=True)
    keras.utils.set_random_seed(parity_cases.SEED)
    kwargs = case.fit_kwargs(out)
    if path.startswith("keras_"):
        strategy = _keras_strategy(path)
        with strategy.scope():
            model = case.build()
        if path == "keras_one_xla":  # what tfaccel's plan picks on one CPU device (Keras' own "auto" picks False)
            model.jit_compile = True
        history = model.fit(verbose=0, **kwargs).history
        record = {"status": "ok", "steps": None, "loop": "keras model.fit"}
    else:
        import tfaccel

        _, strategy_name, loop = path.split(":")
        with tfaccel.scope(strategy=strategy_name):
            model = case.build()
        try:
            result = tfaccel.fit(model, verbose=0, loop=loop, seed=parity_cases.SEED, **kwargs)
        except tfaccel.ConfigError as exc:
            return {"status": "refused", "message": str(exc)}
        history = result.history
        record = {"status": "ok", "steps": result.steps, "loop": result.details.get("loop")}
    record["jit"] = bool(model.jit_compile)
    record["history"] = {k: [float(v) for v in vals] for k, vals in history.items()}
    record["weights"] = [w.tolist() for w in model.get_weights()]
    record["weight_paths"] = [w.path for w in model.weights]
    record.update(_extras(case.name, model, out))
    return record


_STRATEGY: dict = {}  # path -> the strategy its cases share


def _keras_strategy(path: str) -> object:
    import tensorflow as tf

    if path not in _STRATEGY:
        if path == "keras_mirrored":
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            _STRATEGY[path] = tf.distribute.MirroredStrategy(devices,
                                                            cross_device_ops=tf.distribute.ReductionToOneDevice())
        else:
            _STRATEGY[path] = tf.distribute.get_strategy()
    return _STRATEGY[path]


def serve_until_done(done: str) -> None:
    """A ps or worker task of the parameter-server path: a server until the chief creates ``done``."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    workers = len(resolver.cluster_spec().as_dict().get("worker", []))
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)  # 2 cores: see VERIFIED.md
    tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                         protocol="grpc", config=config, start=True)
    deadline = time.monotonic() + 1500
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.2)
    os._exit(0)  # a gRPC server has no clean shutdown; the chief is done with us


def _mirrored(path: str) -> bool:
    return path == "keras_mirrored" or path.startswith("tfaccel:mirrored")


def _paths(argv: list) -> tuple:
    """``([(path, out_dir), ...], case names)`` from the command line or, without one, the environment."""
    if not argv:
        argv = [os.environ["PARITY_PATHS"], os.environ["PARITY_OUT"]]
    paths, out_dir, names = argv[0].split(","), argv[1], argv[2:] or list(parity_cases.CASES)
    if len(paths) == 1:
        return [(paths[0], out_dir)], names
    keras_after = [p for i, p in enumerate(paths) if p.startswith("keras_") and
                   any(q.startswith("tfaccel:") for q in paths[:i])]
    if keras_after or len({_mirrored(p) for p in paths}) > 1 or any("multi_worker" in p or "horovod" in p
                                                                   or "parameter_server" in p for p in paths):
        raise SystemExit(f"parity_program: cannot run {paths} in one process (plain Keras first, one device kind, "
                         "single-process paths only)")
    return [(p, os.path.join(out_dir, p.replace(":", "_"))) for p in paths], names


def run_path(path: str, out_dir: str, names: list) -> None:
    """Runs every case of ``names`` on ``path``, one JSON record per case under ``out_dir/<task>``."""
    task_dir = os.path.join(out_dir, _task())
    for name in names:
        safe = "".join(c if c.isalnum() else "_" for c in name)
        try:
            record = run_case(path, parity_cases.CASES[name], os.path.join(task_dir, safe))
        except Exception:  # recorded, and the test fails with it
            record = {"status": "error", "message": traceback.format_exc()}
        with open(os.path.join(task_dir, f"{safe}.json"), "w") as fh:
            json.dump(record, fh)
        print(f"parity {path} {name}: {record['status']}", flush=True)


def main(argv: list) -> int:
    runs, names = _paths(argv)
    path = runs[0][0]
    task_type = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {}).get("type")
    if path.startswith("tfaccel:parameter_server") and task_type in ("ps", "worker"):
        serve_until_done(os.environ["PS_TEST_DONE"])
    if _mirrored(path):
        import tfaccel

        tfaccel.configure_devices(virtual_cpus=2)
    for path, out_dir in runs:
        run_path(path, out_dir, names)
    if os.environ.get("PS_TEST_DONE"):
        open(os.environ["PS_TEST_DONE"], "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
