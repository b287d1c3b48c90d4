"""Checks a backup before a job resumes from it: readable, the same model, a position inside the epoch.

Keras' ``load_weights`` alone would raise h5py's raw ``OSError`` on a truncated file, and would load another
model's weights silently where their shapes happen to fit, or a 2-layer file into a 1-layer model. The layout
of a ``.weights.h5`` file (``layers/dense/vars/0`` ..., ``optimizer/vars/0`` ...) follows the model's
architecture, so the backup's layout is compared with the layout this model writes.
"""

import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import h5py

from tfaccel.errors import ConfigError

__all__ = ["weights_layout", "check_weights_file", "check_position"]

_SHOWN = 4  # differences quoted in a message


def weights_layout(path: str) -> Dict[str, Tuple[int, ...]]:
    """``{dataset path: shape}`` of a Keras ``.weights.h5`` file.

    Raises:
        OSError: the file is missing, truncated or not HDF5 (h5py's error).
    """
    layout: Dict[str, Tuple[int, ...]] = {}
    with h5py.File(path, "r") as fh:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                layout[name] = tuple(int(d) for d in obj.shape)

        fh.visititems(visit)
    return layout


def _model_layout(model: Any) -> Dict[str, Tuple[int, ...]]:
    """The layout ``model.save_weights`` writes for this model (written to a private temporary file)."""
    tmp = tempfile.mkdtemp(prefix="tfaccel-layout-")
    try:
        path = os.path.join(tmp, "model.weights.h5")
        model.save_weights(path)
        return weights_layout(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _differences(saved: Dict[str, Tuple[int, ...]], mine: Dict[str, Tuple[int, ...]]) -> List[str]:
    out = [f"{k} has shape {saved[k]} in the backup, {mine[k]} in this model"
           for k in sorted(set(saved) & set(mine)) if saved[k] != mine[k]]
    out += [f"{k} {saved[k]} is in the backup, not in this model" for k in sorted(set(saved) - set(mine))]
    out += [f"{k} {mine[k]} is in this model, not in the backup" for k in sorted(set(mine) - set(saved))]
    return out


def check_weights_file(model: Any, path: str, *, backup_dir: str, name: str) -> None:
    """Refuses a backup weights file that is unreadable or was not written by a model like this one.

    Args:
        model: the built, compiled model about to load the file (its optimizer built).
        path: the weights file. backup_dir, name: for the message.

    Raises:
        ConfigError: naming ``backup_dir``, the file and what is wrong.
    """
    try:
        saved = weights_layout(path)
    except OSError as exc:
        size = os.path.getsize(path) if os.path.exists(path) else None
        why = " ".join(str(exc).split())[:200]
        raise ConfigError(f"backup_dir {backup_dir}: {name} is unreadable ({size} bytes; {why}): the file was "
                          "damaged after tfaccel wrote it. Remove backup_dir to start from scratch, or restore the "
                          "file") from exc
    if not saved:
        raise ConfigError(f"backup_dir {backup_dir}: {name} holds no weights; remove backup_dir to start from scratch")
    diffs = _differences(saved, _model_layout(model))
    if diffs:
        more = f" (and {len(diffs) - _SHOWN} more)" if len(diffs) > _SHOWN else ""
        raise ConfigError(f"backup_dir {backup_dir}: {name} was written by another model: " + "; ".join(diffs[:_SHOWN])
                          + more + ". Resume with the model that wrote it, or give this job another backup_dir")


def check_position(state: Optional[Any], *, backup_dir: Optional[str], steps_per_epoch: Optional[int]) -> None:
    """Refuses a backup position that does not fit this job's epochs (a different batch size or data).

    Args:
        state: the ``BackupState`` the job resumes from, or None.
        backup_dir: for the message. steps_per_epoch: this job's steps per epoch (None: unknown, not checked).

    Raises:
        ConfigError: the step is negative or not inside an epoch, or the backup counted another epoch length.
    """
    if state is None:
        return
    epoch, step = state.get("epoch"), state.get("step")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, step)):
        raise ConfigError(f"backup_dir {backup_dir}: epoch and step must be whole numbers >= 0; received "
                          f"epoch={epoch!r:.40}, step={step!r:.40}. Remove backup_dir to start from scratch")
    if not steps_per_epoch:
        return
    written = state.get("steps_per_epoch")
    if step >= steps_per_epoch or (written is not None and written != steps_per_epoch):
        counted = f" of {written!r:.40} steps per epoch" if written is not None else ""
        raise ConfigError(f"backup_dir {backup_dir}: the backup is at step {step} of epoch {epoch}{counted}, but this "
                          f"job has {steps_per_epoch} steps per epoch (another batch size or data set). Resume with "
                          "the batch size and data that wrote it, or give this job another backup_dir")
