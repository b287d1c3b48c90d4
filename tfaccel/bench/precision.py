"""P5: tfaccel's precision and XLA "auto" against float32 without XLA, same model, data and batch (a GPU figure).

Two contenders train a fresh ``config.p5_model`` (ResNet-50 at 224x224x3 by default) on the same synthetic
data at the same global batch with ``tfaccel.compile_and_fit`` on one device (``strategy="default"``), each timed
by :class:`tfaccel.bench.timing.Stopwatch` (epochs 2..N, plus the whole call as ``time_to_train``), in a seeded
random order each round:

* ``precision_xla_auto``: ``precision="auto"``, ``jit_compile="auto"`` (on a GPU with compute capability 7.0 or
  more: a mixed policy, and tfaccel's XLA decision);
* ``float32_noxla``: ``precision="float32"``, ``jit_compile=False``.

``p5_precision_xla`` = the first's examples/s over the second's, per round. The report records the precision
and XLA each contender actually got (its plan, its model's dtype policy and ``jit_compile`` after training) and
the devices. Without a GPU, ``--p5 auto`` skips the figure (``p5_precision_xla: null`` with ``p5_skipped``);
``--p5 on`` runs it anyway, where "auto" resolves to float32 and the ratio is about 1 (``p5_note`` says so).
"""

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfaccel.bench.config import BenchConfig, contender_rows, summary
from tfaccel.bench.timing import Stopwatch, run_rounds
from tfaccel.devices import detect_devices
from tfaccel.errors import invalid_choice
from tfaccel.models import get_model_builder
from tfaccel.train.api import compile_and_fit

__all__ = ["P5_MODES", "P5_CONTENDERS", "check_p5_mode", "p5_skip_reason", "measure_precision"]

P5_MODES: Tuple[str, ...] = ("auto", "on", "off")
"""``auto``: only where a GPU is present; ``on``: run anyway (e.g. on CPU); ``off``: skip."""

P5_CONTENDERS = ("precision_xla_auto", "float32_noxla")

_REQUESTS: Dict[str, Tuple[str, Any]] = {"precision_xla_auto": ("auto", "auto"), "float32_noxla": ("float32", False)}

Train = Callable[[Any], Dict[str, Any]]


def check_p5_mode(mode: Any, *, option: str = "p5") -> str:
    """Returns ``mode`` if it is one of :data:`P5_MODES`.

    Args:
        mode: the value received.
        option: how the caller names the option in the message (``"p5"``, ``"--p5"``).

    Returns:
        ``mode``.

    Raises:
        ConfigError: names the option, shows the value, lists the valid ones.
    """
    if not isinstance(mode, str) or mode not in P5_MODES:
        raise invalid_choice(option, mode, P5_MODES, "use 'auto' (only with a GPU), 'on' (run anyway) or 'off'")
    return mode


def p5_skip_reason(mode: str, gpu_names: Sequence[str]) -> Optional[str]:
    """Why P5 is not measured (``"no GPU: ..."``, ``"off: ..."``), or None where it runs.

    Args:
        mode: one of :data:`P5_MODES`.
        gpu_names: the GPUs this process sees.

    Returns:
        The reason, or None.
    """
    check_p5_mode(mode)
    if mode == "off":
        return "off: --p5 off (BenchConfig.p5='off')"
    if mode == "auto" and not gpu_names:
        return ("no GPU: TensorFlow sees no GPU on this machine and --p5 is 'auto'; run `tfaccel bench --p5 on` on a "
                "machine with an NVIDIA GPU for the figure (on CPU precision 'auto' is float32, so the ratio is ~1)")
    return None


def p5_data(n: int, input_shape: Sequence[int], classes: int) -> tuple:
    """``n`` synthetic float32 images in [0, 1) of ``input_shape`` and random int32 labels below ``classes``."""
    rng = np.random.default_rng(0)
    x = rng.random((n, *input_shape), dtype=np.float32)
    return x, rng.integers(0, classes, size=n).astype(np.int32)


def _fit(build: Callable[[], Any], x: Any, y: Any, config: BenchConfig, *, precision: str, jit: Any) -> Train:
    def train(timer: Any) -> Dict[str, Any]:
        result = compile_and_fit(build, (x, y), epochs=config.epochs, global_batch_size=config.p5_batch,
                                 strategy="default", precision=precision, jit_compile=jit,
                                 loss="sparse_categorical_crossentropy", metrics=["accuracy"], verbose=0, seed=0,
                                 callbacks=[timer])
        plan, model = result.plan, result.model
        return {"requested": {"precision": precision, "jit_compile": jit},
                "precision": plan.precision, "precision_reason": plan.precision_reason,
                "dtype_policy": str(model.dtype_policy.name), "jit_compile": bool(model.jit_compile),
                "jit_reason": str(result.details.get("jit_compile", plan.jit_reason)),
                "plan": plan.summary(), "fit": {k: str(v) for k, v in result.details.items() if k != "seed"}}

    return train


def _devices() -> Dict[str, Any]:
    info = detect_devices()
    return {"gpus": [{"name": g.name, "compute_capability": g.compute_capability, "memory_mb": g.memory_mb}
                     for g in info.gpus],
            "logical": [d.name for d in tf.config.list_logical_devices()]}


def measure_precision(config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    """P5 over ``config.repeats`` rounds: both contenders each round, in a random order, the ratio per round.

    Args:
        config: ``p5_model``, ``p5_examples``, ``p5_batch``, ``p5_input_shape``, ``p5_classes``, ``epochs``,
            ``repeats``, ``seed``.
        stopwatch: times every contender.

    Returns:
        ``p5_precision_xla`` (figure), ``examples_per_sec``, ``time_to_train``, ``cpu_per_wall`` (per contender),
        ``order``, ``details`` (the precision and XLA each contender got), ``devices``, the sizes, and ``p5_note``
        where no GPU was used.
    """
    build_model = get_model_builder(config.p5_model)
    shape, classes = tuple(config.p5_input_shape), config.p5_classes

    def build() -> Any:
        return build_model(input_shape=shape, num_classes=classes)

    x, y = p5_data(config.p5_examples, shape, classes)
    contenders = {name: _fit(build, x, y, config, precision=p, jit=j) for name, (p, j) in _REQUESTS.items()}
    rounds = run_rounds(contenders, stopwatch=stopwatch, config=config, group="precision", examples_per_epoch=len(x))
    eps = [{c: r["timings"][c]["examples_per_sec"] for c in contenders} for r in rounds]
    details = {c: rounds[-1]["timings"][c]["details"] for c in contenders}
    part = {"p5_precision_xla": summary([e["precision_xla_auto"] / e["float32_noxla"] for e in eps]),
            "examples_per_sec": contender_rows(rounds, "examples_per_sec"),
            "time_to_train": contender_rows(rounds, "time_to_train"),
            "cpu_per_wall": contender_rows(rounds, "cpu_per_wall"), "order": [r["order"] for r in rounds],
            "model": config.p5_model, "input_shape": list(shape), "classes": classes, "examples": len(x),
            "global_batch_size": config.p5_batch, "details": details, "devices": _devices()}
    if not part["devices"]["gpus"]:
        part["p5_note"] = (f"no GPU: precision 'auto' resolved to {details['precision_xla_auto']['precision']} and "
                           f"XLA to {details['precision_xla_auto']['jit_compile']}, so the ratio is ~1; the 2.5 "
                           "target is for a GPU")
    return part
