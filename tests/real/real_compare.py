"""The real-model parity rule: what a path's record must share with its reference's (see real_cases)."""

import json
import math
import os
import sys
from typing import List

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))

import parity_compare  # noqa: E402

REL, ABS, HISTORY_ATOL = parity_compare.REL, parity_compare.ABS, parity_compare.HISTORY_ATOL


def load(out_dir: str, task: str, name: str) -> dict:
    """A path's record of one case, with its weights: ``one_step`` and ``final`` lists of arrays."""
    safe = name.replace(":", "__")
    with open(os.path.join(out_dir, task, f"{safe}.json")) as fh:
        record = json.load(fh)
    if record["status"] == "ok":
        with np.load(os.path.join(out_dir, task, f"{safe}.npz")) as arrays:
            weights = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        half = len(weights) // 2
        record["one_step"], record["final"] = weights[:half], weights[half:]
    return record


def _close(a: float, b: float, rel: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(rel * abs(b), HISTORY_ATOL)


def _epoch(ref: dict, got: dict, index: int, rel: float, label: str) -> List[str]:
    problems = []
    for key, values in ref["history"].items():
        if not _close(got["history"][key][index], values[index], rel):
            problems.append(f"{label} epoch {key}: {got['history'][key][index]!r} != Keras' {values[index]!r} "
                            f"(rel {rel:g})")
    return problems


def differences(ref: dict, got: dict, *, last_epoch_rel: float) -> List[str]:
    """Every way ``got`` breaks the rule against ``ref`` (an empty list: it holds)."""
    if got["status"] != "ok":
        return [f"{got['status']}: {got.get('message', '')[-3000:]}"]
    assert ref["status"] == "ok", ref.get("message")
    if got["initial"] != ref["initial"]:
        return [f"initial weights differ (digest {got['initial']} vs {ref['initial']}): not the same starting point"]
    if sorted(got["history"]) != sorted(ref["history"]):
        return [f"history keys {sorted(got['history'])} != Keras' {sorted(ref['history'])}"]
    problems = []
    for path, a, b in zip(ref["weight_paths"], ref["one_step"], got["one_step"]):
        if not np.allclose(b, a, rtol=REL, atol=ABS):
            problems.append(f"weights after one step: {path} differs by {float(np.max(np.abs(a - b))):.3g}")
            break
    problems += _epoch(ref, got, 0, REL, "first")
    problems += _epoch(ref, got, -1, last_epoch_rel, "last")
    if any(len(v) != len(ref["history"][k]) for k, v in got["history"].items()):
        problems.append("not as many epochs as Keras")
    return problems


def same_weights_everywhere(a: dict, b: dict) -> List[str]:
    """The processes of one job end with the same weights (BatchNormalization's per-replica moving statistics
    aside, as in Keras' own multi-replica fit)."""
    return [f"the two processes ended with different values of {path}"
            for path, wa, wb in zip(a["weight_paths"], a["final"], b["final"])
            if "moving_" not in path and not np.array_equal(wa, wb)]
