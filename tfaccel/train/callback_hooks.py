"""Which of a job's callbacks act per batch: the one reading of Keras callbacks that the loops and the job share.

Keras calls batch hooks once per execution, not per step, so a callback with per-batch hooks needs Keras' batch loop
(one step per call); tfaccel's whole-epoch and multi-step loops hand such a job on.
"""

from typing import Any, List

import keras

__all__ = ["batch_hook_reasons"]

_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end",
                "on_test_batch_begin", "on_test_batch_end")


def batch_hook_reasons(cb: Any) -> List[str]:
    """Why one callback needs Keras' batch loop. Keras' own progress, checkpoint and TensorBoard callbacks override
    batch hooks that act only under some settings (Keras 3.15); those settings are checked instead."""
    cbs, name = keras.callbacks, type(cb).__name__
    base = next((known for known in (cbs.ProgbarLogger, cbs.ModelCheckpoint, cbs.BackupAndRestore, cbs.TensorBoard)
                 if isinstance(cb, known)), cbs.Callback)
    hooks = [h for h in _BATCH_HOOKS  # instance attributes too: LambdaCallback(on_batch_end=...) sets them
             if vars(cb).get(h) is not None or getattr(type(cb), h) is not getattr(base, h)]
    found = [f"callback {name} has per-batch hooks ({', '.join(hooks)})"] if hooks else []
    freq = cb.save_freq if base in (cbs.ModelCheckpoint, cbs.BackupAndRestore) else "epoch"
    if isinstance(freq, int) and not isinstance(freq, bool):
        found.append(f"callback {name} saves every {freq} batches (save_freq={freq})")
    if base is cbs.TensorBoard:
        settings = ([f"update_freq={cb.update_freq!r}"] if cb.update_freq != "epoch" else []) \
            + (["write_steps_per_second=True"] if cb.write_steps_per_second else []) \
            + (["profile_batch is set"] if getattr(cb, "_should_trace", False) else [])
        found += [f"callback {name} writes per batch ({', '.join(settings)})"] if settings else []
    return found
