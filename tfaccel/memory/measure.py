"""Measured peaks to hold an estimate against: TensorFlow's allocator peak (GPU or CPU) and the process's peak RSS.

On a GPU, :func:`measure_device_peak` resets the allocator statistics, runs one step and reads
``tf.config.experimental.get_memory_info(device)["peak"]`` (the device list and reader can be injected).
:func:`measure_cpu_step` runs the step in a fresh child process (``python -m tfaccel.memory.measure``) so nothing
else in the caller's process counts: it reads VmRSS after importing TensorFlow (``baseline``), builds and warms the
model (two steps), resets the kernel's high-water mark (``/proc/self/clear_refs``) and TensorFlow's CPU allocator
statistics, reads VmRSS at rest and runs the timed steps. ``peak`` is VmHWM of the timed steps, ``process_hwm`` the
VmHWM of the child's whole life (the process peak on the CPU that ``process_peak_bytes`` estimates);
``allocator_peak`` is the peak of the bytes TensorFlow's CPU allocator handed out (``get_memory_info("CPU:0")``):
the tensors the device estimate counts, as on a GPU. TF 2.21 keeps these statistics only for its BFC or oneDNN
CPU allocator, so the child runs with ``TF_CPU_ALLOCATOR_USE_BFC=true`` (:func:`child_environment`); where they
are still unavailable, ``allocator_peak`` is None and ``allocator_peak_unavailable`` says why. The process
peak adds the interpreter and TF runtime, the model's Python objects, the traced graphs, kernels and oneDNN
primitives, and what the allocator's pool keeps beyond the bytes in use. By default the child asks glibc for mmap
above 1 MiB (``MALLOC_MMAP_THRESHOLD_``, freed large buffers go back to the system); ``mmap_threshold=None`` keeps
glibc's defaults, as in a user's process (this changed ResNet-50's VmHWM by under 1% here).
"""

import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tfaccel.errors import ConfigError
from tfaccel.memory.recompute import enable_recompute
from tfaccel.memory.shapes import DEFAULT_SHAPES
from tfaccel.memory.specs import step_specs
from tfaccel.models import build_model

__all__ = ["measure_device_peak", "measure_cpu_step", "time_side_by_side", "read_proc_status", "MMAP_THRESHOLD",
           "BFC_VARIABLE", "child_environment", "allocator_stats_unavailable"]

MMAP_THRESHOLD = 1 << 20
BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"


def read_proc_status(path: str = "/proc/self/status") -> Dict[str, int]:
    """Returns VmRSS and VmHWM of a process in bytes (Linux)."""
    out: Dict[str, int] = {}
    with open(path) as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def measure_device_peak(run_step: Callable[[], Any], *, devices: Optional[Sequence[str]] = None,
                        memory_info: Optional[Callable[[str], Dict[str, int]]] = None,
                        reset: Optional[Callable[[str], None]] = None) -> Dict[str, int]:
    """Runs one step and returns each GPU's allocator peak in bytes.

    Args:
        run_step: runs one training step (already warmed up).
        devices: device names such as ``"GPU:0"``. Defaults to None: the visible GPUs.
        memory_info: reads ``{"current": ..., "peak": ...}`` of a device. Defaults to
            ``tf.config.experimental.get_memory_info``.
        reset: resets a device's peak. Defaults to ``tf.config.experimental.reset_memory_stats``.

    Returns:
        ``{device: peak bytes}``; empty when there is no GPU.
    """
    if devices is None or memory_info is None or reset is None:
        if devices is None:
            devices = [f"GPU:{i}" for i, _ in enumerate(tf.config.list_logical_devices("GPU"))]
        memory_info = memory_info or tf.config.experimental.get_memory_info
        reset = reset or tf.config.experimental.reset_memory_stats
    for device in devices:
        reset(device)
    run_step()
    return {device: int(memory_info(device)["peak"]) for device in devices}


def measure_cpu_step(model: str, *, batch_size: int, precision: str = "float32", recompute: Optional[Any] = None,
                     input_shape: Optional[Sequence[int]] = None, num_classes: Optional[int] = None,
                     optimizer: str = "adam", steps: int = 2, timeout_s: float = 900.0,
                     mmap_threshold: Optional[int] = MMAP_THRESHOLD) -> Dict[str, Any]:
    """Measures one model's training step in a fresh child process on the CPU.

    Args:
        model: a built-in model name or ``"path/to/file.py:build_model"``.
        batch_size: the batch of each step.
        precision: the dtype policy. Defaults to ``"float32"``.
        recompute: blocks for :func:`tfaccel.memory.enable_recompute`, or None for none. Defaults to None.
        input_shape: one example's shape. Defaults to the model's usual input.
        num_classes: number of classes. Defaults to the model's usual head (10 for a file).
        optimizer: a Keras optimizer name. Defaults to ``"adam"``.
        steps: timed steps after two warm-up steps. Defaults to 2.
        timeout_s: the child's time limit. Defaults to 900.
        mmap_threshold: ``MALLOC_MMAP_THRESHOLD_`` of the child (freed large buffers go back to the system), or
            None for glibc's defaults, as in a user's process. Defaults to ``MMAP_THRESHOLD`` (1 MiB).

    Returns:
        ``{"baseline": ..., "rest": ..., "peak": ..., "process_hwm": ..., "allocator_peak": ...,
        "step_seconds": [...], "step_peak": peak - rest, "process_peak": peak - baseline,
        "device_peaks": {"GPU:0": allocator peak, ...}, "allocator_peak_unavailable": None or why}`` (bytes,
        seconds; ``device_peaks`` is empty without a GPU; ``allocator_peak`` is None where TensorFlow keeps no CPU
        allocator statistics, and ``allocator_peak_unavailable`` then says why). ``process_hwm`` is the child's
        VmHWM over its whole life (import, build, warm-up and timed steps): the process peak on the CPU.

    Raises:
        ConfigError: the child failed (its last output lines are in the message).
    """
    request = {"model": model, "batch_size": batch_size, "precision": precision, "recompute": recompute,
               "input_shape": list(input_shape) if input_shape else None, "num_classes": num_classes,
               "optimizer": optimizer, "steps": steps}
    env = child_environment()
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    result = _run_child(request, env=env, timeout_s=timeout_s,
                        what=f"memory measurement of {model!r} (batch {batch_size})")
    result["step_peak"] = result["peak"] - result["rest"]
    result["process_peak"] = result["peak"] - result["baseline"]
    return result


def time_side_by_side(model: str, *, batch_size: int, recompute: Sequence[Optional[Any]] = (None, "auto"),
                      input_shape: Optional[Sequence[int]] = None, steps: int = 6, timeout_s: float = 1800.0
                      ) -> Dict[str, List[float]]:
    """Times one model with each recompute setting in ONE child process, steps interleaved (a, b, a, b, ...), so
    that the load of a shared machine falls on every contender alike.

    Returns:
        ``{str(setting): [step seconds, ...]}``.

    Raises:
        ConfigError: the child failed.
    """
    request = {"timing": True, "model": model, "batch_size": batch_size, "precision": "float32",
               "recompute": list(recompute), "input_shape": list(input_shape) if input_shape else None,
               "steps": steps}
    return _run_child(request, env=child_environment(), timeout_s=timeout_s,
                      what=f"side-by-side timing of {model!r}")


def child_environment() -> Dict[str, str]:
    """The environment of a measuring child: this process's, with TensorFlow's BFC allocator on the CPU.

    TensorFlow keeps allocator statistics for ``CPU:0`` only when its CPU allocator is the BFC one or oneDNN's,
    and oneDNN is on by default only on some processors (TF 2.21, ``tensorflow-cpu``): elsewhere
    ``get_memory_info("CPU:0")`` raises "Allocator stats not available". tfaccel starts the child, so it asks
    for the BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC=true``) unless the caller's environment says otherwise.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.setdefault(BFC_VARIABLE, "true")
    return env


def _run_child(request: Dict[str, Any], *, env: Dict[str, str], timeout_s: float, what: str) -> Dict[str, Any]:
    """Runs ``python -m tfaccel.memory.measure REQUEST`` and returns the JSON line it prints."""
    proc = subprocess.run([sys.executable, "-m", "tfaccel.memory.measure", json.dumps(request)], env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise ConfigError(f"{what} failed with exit code {proc.returncode}: {tail}")
    return json.loads(lines[-1])


def _prepare(request: Dict[str, Any], recompute: Optional[Any]) -> Any:
    """Builds, compiles and warms one model of the request; returns a function that runs one step."""
    shape, classes = DEFAULT_SHAPES.get(request["model"], (None, 10))
    shape = tuple(request["input_shape"] or shape)
    classes = request.get("num_classes") or classes
    keras.config.set_dtype_policy(request["precision"])
    model = build_model(request["model"], input_shape=shape, num_classes=classes)
    if recompute is not None:
        enable_recompute(model, recompute)
    model.compile(optimizer=request.get("optimizer", "adam"), loss="sparse_categorical_crossentropy",
                  jit_compile=False)
    rng = np.random.default_rng(0)
    x_specs, y_spec = step_specs(model, request["batch_size"], request["input_shape"])  # its own input structure
    x = keras.tree.map_structure(lambda spec: tf.constant(_random(rng, spec)), x_specs)
    y = tf.constant(rng.integers(0, classes, size=tuple(y_spec.shape)).astype("int32"))
    for _ in range(2):
        model.train_on_batch(x, y)
    return lambda: model.train_on_batch(x, y)


def _random(rng: Any, spec: Any) -> np.ndarray:
    """Inputs for one spec: ids below 100 for an integer input (an embedding's), normal values otherwise."""
    if spec.dtype.is_integer:
        return rng.integers(0, 100, size=tuple(spec.shape)).astype(spec.dtype.as_numpy_dtype)
    return rng.normal(size=tuple(spec.shape)).astype(spec.dtype.as_numpy_dtype)


def _timing_child(request: Dict[str, Any]) -> Dict[str, List[float]]:
    steps = {str(setting): _prepare(request, setting) for setting in request["recompute"]}
    times: Dict[str, List[float]] = {name: [] for name in steps}
    for _ in range(request["steps"]):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def _child(request: Dict[str, Any]) -> Dict[str, Any]:
    tf.constant(1.0) + 1.0  # start the runtime before the baseline
    baseline = read_proc_status()["VmRSS"]
    step = _prepare(request, request["recompute"])
    warm_peak = read_proc_status()["VmHWM"]  # the whole life so far: import, build, tracing, two warm-up steps
    _reset_high_water_mark()
    unavailable = allocator_stats_unavailable(tf.config.experimental.reset_memory_stats)
    rest = read_proc_status()["VmRSS"]
    times: List[float] = []
    for _ in range(request["steps"]):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = read_proc_status()["VmHWM"]
    allocator_peak = None if unavailable else int(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    gpus = tf.config.list_logical_devices("GPU")
    device_peaks = measure_device_peak(step) if gpus else {}
    return {"baseline": baseline, "rest": rest, "peak": peak, "process_hwm": max(warm_peak, peak),
            "allocator_peak": allocator_peak, "allocator_peak_unavailable": unavailable,
            "step_seconds": times, "device_peaks": device_peaks}


def allocator_stats_unavailable(reset: Callable[[str], None]) -> Optional[str]:
    """Resets the CPU allocator's peak; returns None, or why TensorFlow keeps no statistics for ``CPU:0``."""
    try:
        reset("CPU:0")
    except ValueError as exc:  # TF: "Cannot reset memory stats for device 'CPU:0'"
        return (f"TensorFlow keeps no allocator statistics for CPU:0 in this process ({exc}); they need the BFC "
                f"allocator ({BFC_VARIABLE}=true, which the measuring child sets unless the environment sets "
                f"{BFC_VARIABLE} otherwise; received {os.environ.get(BFC_VARIABLE)!r}) or oneDNN")
    return None


if __name__ == "__main__":
    _request = json.loads(sys.argv[1])
    sys.stdout.write(json.dumps(_timing_child(_request) if _request.get("timing") else _child(_request)) + "\n")
