"""Where Keras 3's ``BackupAndRestore`` leaves the epoch a restored job resumes at.

Keras 3 (seen on 3.15.1 with TensorFlow 2.21) has no public way to ask which epoch ``BackupAndRestore`` restored:
its ``on_train_begin`` loads the weights and sets the private ``model._initial_epoch``, which ``fit`` then reads
(``keras/src/callbacks/backup_and_restore.py``, ``keras/src/backend/tensorflow/trainer.py``). Under multi-worker
training tfaccel must know that epoch before training starts, to line its per-epoch example order up with it.
Keras 3 also dropped tf_keras' per-worker temporary paths, so every worker writes the same backup file
(tensorflow/tensorflow#38635 is the tf.keras-era report of that race; tf_keras answered it with
``distributed_file_utils``); tfaccel.resilience.keras_callbacks gives the other workers private paths.
tests/strategies/test_compat_keras_backup_restore.py fails when the attribute moves.
"""

from typing import Any, Optional

__all__ = ["NAME", "UPSTREAM_ISSUES", "restored_initial_epoch"]

NAME = "keras_backup_restore"
UPSTREAM_ISSUES = ("tensorflow/tensorflow#38635",)


def restored_initial_epoch(model: Any) -> Optional[int]:
    """The epoch a ``BackupAndRestore.on_train_begin`` just restored ``model`` to, or None when it restored none."""
    epoch = getattr(model, "_initial_epoch", None)
    return int(epoch) if epoch is not None else None
