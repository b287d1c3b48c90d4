"""Compares one path's parity results with its reference: history keys, per-epoch values, final weights."""

import json
import math
import os
from typing import List, Optional

import numpy as np

import parity_cases

REL, ABS = 1e-5, 1e-5
# Absolute floor for history values near zero (a loss of 1e-7 has no meaningful relative error).
HISTORY_ATOL = 1e-6


def safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def load(out_dir: str, task: str, case: str) -> dict:
    with open(os.path.join(out_dir, task, f"{safe(case)}.json")) as fh:
        return json.load(fh)


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(REL * abs(b), HISTORY_ATOL)


def _weight_difference(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference of two weights; NaN where only one of them is NaN (where both are, as TerminateOnNaN's
    case leaves them, they agree)."""
    if np.any(np.isnan(a) != np.isnan(b)):
        return math.nan
    both = ~np.isnan(a)
    return float(np.max(np.abs(a[both] - b[both]), initial=0.0))


def differences(ref: dict, got: dict, case: str) -> List[str]:
    """Every way ``got`` differs from ``ref`` (an empty list: equal)."""
    if got["status"] != "ok":
        return [f"{got['status']}: {got.get('message', '')[-2000:]}"]
    assert ref["status"] == "ok", (case, ref.get("message"))
    problems = []
    if sorted(ref["history"]) != sorted(got["history"]):
        return [f"history keys {sorted(got['history'])} != Keras' {sorted(ref['history'])}"]
    for key, values in ref["history"].items():
        if len(values) != len(got["history"][key]) or not all(map(_close, got["history"][key], values)):
            problems.append(f"history[{key!r}] {got['history'][key]} != Keras' {values}")
    worst = max(_weight_difference(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
                for a, b in zip(ref["weights"], got["weights"]))
    if not worst <= ABS:
        problems.append(f"final weights differ by {worst:.3g} (> {ABS})")
    for key in ("batch_calls",):
        if ref.get(key) != got.get(key):
            problems.append(f"{key}: {got.get(key)} != Keras' {ref.get(key)}")
    if "checkpoint_max_diff" in got and got["checkpoint_max_diff"] > ABS:
        problems.append(f"ModelCheckpoint file loads with other weights ({got['checkpoint_max_diff']:.3g})")
    if "csv" in ref and len(ref["csv"]) != len(got.get("csv", [])):
        problems.append(f"CSVLogger wrote {len(got.get('csv', []))} lines, Keras {len(ref['csv'])}")
    return problems


def reference_for(case: str, *, kind: str, jit: bool) -> str:
    """The reference path of a case for a path of ``kind`` (``"one"``, ``"tf_distribute"``, ``"horovod"``): plain
    Keras on one device with the same XLA setting (XLA draws Dropout masks from another RNG kernel), or plain
    Keras with as many replicas where that is what the path means (see parity_cases)."""
    spec = parity_cases.CASES[case]
    one = "keras_one_xla" if jit else "keras_one"
    if kind == "tf_distribute":
        return one if spec.multi_replica_reference == "one_device" else "keras_mirrored"
    if kind == "horovod":
        return "keras_mirrored" if spec.per_replica_statistics else one
    return one


def expected_steps(case: str) -> Optional[int]:
    """Training steps a case must report (None: not checked)."""
    return {"TerminateOnNaN": 5, "EarlyStopping": 2 * 5}.get(case)
