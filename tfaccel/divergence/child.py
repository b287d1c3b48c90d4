"""One run of ``tfaccel doctor -- python train.py``: the user's unmodified script in a child process.

The child sets its devices up before TensorFlow starts (N virtual CPUs unless N GPUs are there), enters the
run's strategy scope, and runs the script as ``__main__``. The script's first ``model.fit(...)`` or
``tfaccel.fit(model, ...)`` does not train: it hands over the compiled model and the data, and the child trains
K recorded steps instead, then stops the script. The one-replica run ("single") goes first and writes the
global batches and the initial variable values it used; the N-replica run ("replicas") trains on exactly those
(or makes its own pipelines from the script's ``dataset_fn``), compares and writes the report. With ``--workers W``
the N-replica run is W processes of a MultiWorkerMirrored cluster (started by ``tfaccel.launch.run_local``, one
replica each); the chief writes the report. A bad input (the script crashes or never calls fit) becomes one line
in ``error.txt`` and exit code 2.
"""

import argparse
import json
import os
import pickle
import runpy
import sys
import traceback
from typing import Any, List, NoReturn, Optional

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel.divergence.api import DoctorReport, Feed, global_batches
from tfaccel.divergence.causes import diagnose, model_structure
from tfaccel.divergence.compare import compare, tolerance_for
from tfaccel.divergence.loop import CustomLoop, LoopCapture
from tfaccel.divergence.record import StepFacts, Trace, build_model, initial_values, record_run
from tfaccel.errors import ConfigError, TfaccelError
from tfaccel.train import api
from tfaccel.train.data import prepare_data

__all__ = ["main"]

EXIT_BAD_INPUT = 2


class _Captured(BaseException):
    """Raised by the fit hook to stop the script (a BaseException, so that the script's ``except Exception``
    does not swallow it)."""

    def __init__(self, model: Any, x: Any, y: Any, sample_weight: Any, batch_size: Any, shuffle: Any,
                 steps_per_epoch: Any) -> None:
        super().__init__("fit captured")
        self.model, self.x, self.y, self.sample_weight = model, x, y, sample_weight
        self.batch_size, self.shuffle, self.steps_per_epoch = batch_size, shuffle, steps_per_epoch


def _hook(model: Any, x: Any = None, y: Any = None, batch_size: Any = None, epochs: Any = 1, verbose: Any = "auto",
          callbacks: Any = None, validation_split: Any = 0.0, validation_data: Any = None, shuffle: Any = True,
          class_weight: Any = None, sample_weight: Any = None, initial_epoch: Any = 0, steps_per_epoch: Any = None,
          *args: Any, **kwargs: Any) -> NoReturn:
    """Takes ``fit``'s arguments (``model.fit``'s order; ``tfaccel.fit`` takes the model first too)."""
    raise _Captured(model, x, y, sample_weight, batch_size, shuffle, steps_per_epoch)


def _stop_loop(loop: CustomLoop, data: Any) -> NoReturn:
    """A custom training loop's first ``strategy.run``: its step and what it distributes, as a fit call would be."""
    raise _Captured(loop, data, None, None, None, False, None)


def _install_hooks(strategy: Any) -> LoopCapture:
    keras.Model.fit = _hook
    api.fit = _hook
    setattr(tfaccel, "fit", _hook)  # the lazy export may already be cached in the package
    return LoopCapture(strategy, _stop_loop)


def _fail(out: str, message: str) -> NoReturn:
    with open(os.path.join(out, "error.txt"), "w", encoding="utf-8") as f:
        f.write(" ".join(message.splitlines()))
    sys.exit(EXIT_BAD_INPUT)


def _run_script(out: str, script: str, argv: List[str], strategy: Any) -> _Captured:
    sys.argv = [script] + argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    capture = _install_hooks(strategy)
    try:
        with strategy.scope():
            runpy.run_path(script, run_name="__main__")
    except _Captured as captured:
        return captured
    except ConfigError as exc:  # the doctor's own refusal of a custom loop it cannot record
        _fail(out, str(exc).removeprefix("doctor: "))
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _fail(out, f"{script} exited with status {exc.code} before calling fit")
    except Exception as exc:  # the user's script crashed: one line, the way it ended
        where = traceback.extract_tb(exc.__traceback__)[-1]
        _fail(out, f"{script} crashed before calling fit: {type(exc).__name__}: {exc} "
                   f"({os.path.basename(where.filename)}:{where.lineno})")
    finally:
        capture.restore()
    _fail(out, f"{script} finished without calling model.fit(...), tfaccel.fit(model, ...) or strategy.run(...); "
               "the doctor trains the model that the script's first fit call is given (or its custom loop's step)")


def _save_trace(out: str, role: str, trace: Any) -> None:
    with open(os.path.join(out, f"{role}.json"), "w", encoding="utf-8") as f:
        json.dump(trace.to_json(), f)
    np.savez(os.path.join(out, f"{role}.npz"), *[v for step in trace.values for v in step])


def _load_trace(out: str, role: str) -> Any:
    with open(os.path.join(out, f"{role}.json"), encoding="utf-8") as f:
        raw = json.load(f)
    arrays = np.load(os.path.join(out, f"{role}.npz"))
    flat = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
    per = len(raw["names"])
    values = [flat[i * per:(i + 1) * per] for i in range(len(raw["steps"]))]
    return Trace(raw["replicas"], raw["strategy"], raw["names"], [StepFacts(**s) for s in raw["steps"]], values,
                 raw.get("nan"), raw.get("steps_per_epoch"), raw.get("source", "batches"))


def _save_arrays(path: str, arrays: List[Any]) -> None:
    np.savez(path, *arrays)


def _load_arrays(path: str) -> List[np.ndarray]:
    loaded = np.load(path)
    return [loaded[f"arr_{i}"] for i in range(len(loaded.files))]


def _save_batches(out: str, batches: List[Any]) -> None:
    """The global batches as their leaves (``batches.npz``) and their nesting (``batches.pkl``: tuples stay
    tuples, dicts dicts, which JSON would not keep)."""
    _save_arrays(os.path.join(out, "batches.npz"), tf.nest.flatten(batches))
    with open(os.path.join(out, "batches.pkl"), "wb") as f:
        pickle.dump(tf.nest.map_structure(lambda _: None, batches), f)


def _load_batches(out: str) -> List[Any]:
    with open(os.path.join(out, "batches.pkl"), "rb") as f:
        skeleton = pickle.load(f)
    return tf.nest.pack_sequence_as(skeleton, _load_arrays(os.path.join(out, "batches.npz")))


def _feed(out: str, captured: _Captured, steps: int, seed: int) -> Feed:
    try:
        data = prepare_data(captured.x, captured.y, sample_weight=captured.sample_weight,
                            batch_size=captured.batch_size, shuffle=captured.shuffle, seed=seed,
                            steps_per_epoch=captured.steps_per_epoch or steps)
        return global_batches(data, steps)
    except TfaccelError as exc:
        _fail(out, str(exc))


def _single(out: str, captured: _Captured, steps: int, seed: int, nan: bool) -> None:
    feed = _feed(out, captured, steps, seed)
    build_model(captured.model, feed.batches[0])
    _save_arrays(os.path.join(out, "initial.npz"), initial_values(captured.model))
    _save_batches(out, feed.batches)
    with open(os.path.join(out, "structure.json"), "w", encoding="utf-8") as f:
        json.dump(model_structure(captured.model), f)
    _save_trace(out, "single", record_run(captured.model, feed.batches, strategy=tf.distribute.get_strategy(),
                                          label="default", sentinel=nan, dataset_fn=feed.dataset_fn,
                                          steps_per_epoch=feed.steps_per_epoch))


def _replicas(out: str, captured: _Captured, strategy: Any, args: argparse.Namespace) -> None:
    with open(os.path.join(out, "structure.json"), encoding="utf-8") as f:
        structure = json.load(f)
    batches = _load_batches(out)
    single = _load_trace(out, "single")
    dataset_fn = captured.x if callable(captured.x) else None  # the run makes its own pipelines from it
    many = record_run(captured.model, batches, strategy=strategy, start=_load_arrays(os.path.join(out, "initial.npz")),
                      label=args.strategy + (f", {args.workers} processes" if args.workers else ""),
                      sentinel=args.nan, dataset_fn=dataset_fn, steps_per_epoch=single.steps_per_epoch)
    if not tfaccel.is_chief():
        return
    verdict = compare(single, many, tolerance_for(structure["dtype"], len(batches), args.rtol))
    report = DoctorReport(verdict, diagnose(verdict, single, many, structure), single, many)
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report.to_json(), f, default=float)
    with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(report.summary() + "\n")
    if args.plot:
        try:
            report.plot(args.plot)
        except TfaccelError as exc:
            _fail(out, str(exc).removeprefix("doctor: "))


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tfaccel.divergence.child")
    parser.add_argument("--role", choices=("single", "replicas"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--strategy", default="mirrored")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--nan", action="store_true")
    parser.add_argument("--plot", default=None)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Runs one role; the report (``replicas``) or the trace (``single``) lands in ``--out``."""
    args = _parse(argv)
    if args.role == "replicas" and not args.workers:  # one process: N virtual CPUs, made before TensorFlow starts
        tfaccel.configure_devices(virtual_cpus=args.replicas)
    strategy = tfaccel.get_strategy(args.strategy) if args.role == "replicas" else tf.distribute.get_strategy()
    if strategy.num_replicas_in_sync < 2 and args.role == "replicas":
        _fail(args.out, f"strategy {args.strategy!r} has {strategy.num_replicas_in_sync} replica here; the doctor "
                        "compares 1 replica with N >= 2")
    captured = _run_script(args.out, args.script, args.args, strategy)
    if args.role == "single":
        _single(args.out, captured, args.steps, args.seed, args.nan)
    else:
        _replicas(args.out, captured, strategy, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
