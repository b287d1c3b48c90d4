"""tfaccel.compat.keras_backup_restore: fails when Keras moves where BackupAndRestore leaves the restored epoch."""

import keras
import numpy as np

from tfaccel.compat.keras_backup_restore import UPSTREAM_ISSUES, restored_initial_epoch


def test_backup_and_restore_leaves_the_restored_epoch_where_tfaccel_reads_it(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    writer = keras.callbacks.BackupAndRestore(str(tmp_path / "b"), delete_checkpoint=False)
    model.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), epochs=2, verbose=0, callbacks=[writer])
    fresh = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    fresh.compile(optimizer="sgd", loss="mse")
    assert restored_initial_epoch(fresh) is None
    reader = keras.callbacks.BackupAndRestore(str(tmp_path / "b"))
    reader.set_model(fresh)
    reader.on_train_begin()
    assert restored_initial_epoch(fresh) == 2
    np.testing.assert_array_equal(fresh.get_weights()[0], model.get_weights()[0])
    assert UPSTREAM_ISSUES == ("tensorflow/tensorflow#38635",)
