"""What ``tfaccel bench`` measures (:class:`BenchConfig`), its targets, and the helpers every part shares."""

import dataclasses
import json
import statistics
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["BenchConfig", "SUITES", "TARGETS", "TARGET_MODELS", "summary", "round_order", "contender_rows", "last_json"]

TARGETS: Dict[str, float] = {"p1": 6.0, "p2": 2.0, "p3": 0.95, "p3_time_to_train": 0.95, "p4_mwms_of_ceiling": 0.95,
                             "p6_stream": 0.9, "p5_precision_xla": 2.5}
"""The figure each key must reach (its median), on an idle machine; never asserted in a timed test.
``p5_precision_xla``'s holds on a GPU only (on CPU precision "auto" is float32)."""

SUITES: Tuple[str, ...] = ("reference", "real")
"""What ``tfaccel bench --suite`` measures: the reference models' figures (P1-P6), or the real models (tfaccel.real_suite)."""

TARGET_MODELS: Dict[str, Tuple[str, ...]] = {"p2": ("mlp",)}
"""Per-model figures whose target holds for these models only (P2: the MLP; the CNN is compute-bound)."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to measure. ``quick`` fits in a few minutes on 2 cores.

    Attributes:
        quick: the small sizes. repeats: rounds per figure. seed: seeds each round's contender order.
        examples, epochs, batch: P1-P3 data size, epochs per contender (epochs 2..N are timed), global batch.
        models: reference models for P1-P3 (``tfaccel.models`` names).
        scaling: measure P4. scaling_examples / scaling_batch: per worker. scaling_timeout: seconds per job.
        stream: measure P6. stream_model / stream_examples / stream_shards: its model, data size and files.
        stream_examples_per_record: examples per TFRecord record of the streamed contender (blocks; the naive
            contender reads its own files of one example per record).
        p5: measure P5 (precision and XLA "auto" / float32 without XLA): "auto" (only with a GPU), "on", "off".
        p5_model / p5_examples / p5_batch / p5_input_shape / p5_classes: its model, synthetic data and global batch.
        suite: ``"reference"`` (P1-P6) or ``"real"`` (the real models, ``tfaccel.bench.real``).
        real_models / real_paths / real_size / real_timeout: the real suite's models, paths, job size
            (``tfaccel.real_suite.SIZES``) and seconds allowed per contender.
        real_limits: the limit contenders of the real suite's ``default`` path (``tfaccel.bench.real.REAL_LIMITS``:
            the hand-written loop with XLA on, off); the row's ``limit`` is the faster of them each round.
        real_zero: replica counts of the ZeRO rows (``tfaccel.bench.real_zero_run``: optimizer-state sharding
            against the unsharded state on ``real_paths`` among mirrored, multi_worker and horovod); empty: the usual
            rows.
    """

    quick: bool = True
    repeats: int = 3
    seed: int = 0
    examples: int = 6144
    epochs: int = 5
    batch: int = 32
    models: Sequence[str] = ("mlp", "mnist_cnn")
    scaling: bool = True
    scaling_examples: int = 1024
    scaling_batch: int = 64
    scaling_timeout: float = 240.0
    stream: bool = True
    stream_model: str = "mlp"
    stream_examples: int = 6144
    stream_shards: int = 8
    stream_examples_per_record: int = 256
    p5: str = "auto"
    p5_model: str = "resnet50"
    p5_examples: int = 2048
    p5_batch: int = 64
    p5_input_shape: Tuple[int, ...] = (224, 224, 3)
    p5_classes: int = 1000
    suite: str = "reference"
    real_models: Sequence[str] = ("bert_classifier", "gpt2_causal_lm", "resnet50", "mobilenet_v3_small", "recommender")
    real_paths: Sequence[str] = ("default", "mirrored", "multi_worker")
    real_size: str = "bench"
    real_timeout: float = 900.0
    real_limits: Sequence[str] = ("xla", "noxla")
    real_zero: Sequence[int] = ()

    @staticmethod
    def make(quick: bool) -> "BenchConfig":
        """The ``--quick`` sizes, or the full ones."""
        if quick:
            return BenchConfig()
        return BenchConfig(quick=False, repeats=5, examples=32768, epochs=4, scaling_examples=8192,
                           stream_examples=32768, p5_examples=8192, p5_batch=128)


def summary(values: Sequence[float]) -> Dict[str, Any]:
    """``{"median", "min", "max", "values"}`` of one figure over the rounds."""
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values)),
            "values": [float(v) for v in values]}


def round_order(names: Sequence[str], *, seed: int, group: str, round_index: int) -> List[str]:
    """The contenders of one round in a random order, drawn from (seed, group, round) so a rerun repeats it.

    Args:
        names: the contenders.
        seed: the bench's seed.
        group: what the round measures (a model name, ``"scaling"``, ``"stream"``).
        round_index: the round, from 0.

    Returns:
        ``names`` shuffled.
    """
    key = [int(seed), sum(ord(c) * 31 ** i for i, c in enumerate(group)) % (2 ** 31), int(round_index)]
    return [names[i] for i in np.random.default_rng(key).permutation(len(names))]


def contender_rows(rounds: Sequence[Dict[str, Any]], field: str) -> Dict[str, Dict[str, Any]]:
    """``{contender: summary}`` of one field (``examples_per_sec``, ``time_to_train``) over the rounds."""
    names = rounds[0]["timings"].keys()
    return {name: summary([r["timings"][name][field] for r in rounds]) for name in names}


def last_json(text: str) -> Dict[str, Any]:
    """The last JSON object line of a contender process's output (how bench processes report their timing)."""
    for line in reversed(text.strip().splitlines()):
        if "{" in line and line.rstrip().endswith("}"):  # horovodrun prefixes rank lines with "[0]<stdout>:"
            return json.loads(line[line.index("{"):])
    raise RuntimeError(f"no result line in worker output:\n{text[-1500:]}")
