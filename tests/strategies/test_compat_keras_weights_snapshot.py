"""tfaccel.compat.keras_weights_snapshot: save_weights' file in two halves (a snapshot, then the write)."""

import h5py
import keras
import numpy as np
from keras.src.backend.common import global_state
from keras.src.saving import saving_lib

from tfaccel.compat import keras_weights_snapshot as kws


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.train_on_batch(np.ones((4, 4), "float32"), np.zeros((4, 2), "float32"))  # optimizer state exists
    return model


def _contents(path):
    """Every group and dataset of an h5 file: name -> (values or None, attributes)."""
    found = {}
    with h5py.File(path, "r") as fh:
        fh.visititems(lambda name, obj: found.__setitem__(
            name, (np.array(obj) if isinstance(obj, h5py.Dataset) else None, dict(obj.attrs))))
    return found


def test_the_file_is_the_one_save_weights_writes_and_loads_back(tmp_path):
    model = _model()
    model.save_weights(tmp_path / "keras.weights.h5")
    kws.write_weights(kws.snapshot_weights(model), str(tmp_path / "ours.weights.h5"))
    theirs, ours = _contents(tmp_path / "keras.weights.h5"), _contents(tmp_path / "ours.weights.h5")
    assert list(ours) == list(theirs) and any("optimizer" in name for name in ours)
    for name, (values, attrs) in theirs.items():
        assert attrs == ours[name][1], name
        assert (values is None and ours[name][0] is None) or np.array_equal(values, ours[name][0]), name
    fresh = _model()
    fresh.load_weights(tmp_path / "ours.weights.h5")
    for a, b in zip(fresh.get_weights() + [v.numpy() for v in fresh.optimizer.variables],
                    model.get_weights() + [v.numpy() for v in model.optimizer.variables]):
        np.testing.assert_array_equal(a, b)


def test_the_snapshot_keeps_the_values_of_its_moment_while_training_goes_on(tmp_path):
    model = _model()
    before = model.get_weights() + [v.numpy() for v in model.optimizer.variables]
    snapshot = kws.snapshot_weights(model)
    assert snapshot.nbytes == sum(w.nbytes for w in before)
    model.train_on_batch(np.ones((4, 4), "float32"), np.ones((4, 2), "float32"))  # in-place updates
    for w in model.weights:
        w.assign(w + 1.0)
    kws.write_weights(snapshot, str(tmp_path / "then.weights.h5"))
    fresh = _model()
    fresh.load_weights(tmp_path / "then.weights.h5")
    for a, b in zip(fresh.get_weights() + [v.numpy() for v in fresh.optimizer.variables], before):
        np.testing.assert_array_equal(a, b)


def test_keras_still_misses_its_skipset_cache_and_the_snapshot_fills_the_key_it_reads():
    # Keras 3.15.1 stores saving_attr_skipset_<type> and reads saving_attr_skiplist_<type>; when an upgrade reads
    # what it stores, this fails: _cache_skipsets can go.
    global_state.set_global_attribute("saving_attr_skiplist_Layer", None)
    saving_lib.get_attr_skipset("Layer")
    assert global_state.get_global_attribute("saving_attr_skiplist_Layer", None) is None
    kws.snapshot_weights(_model())
    assert global_state.get_global_attribute("saving_attr_skiplist_Layer") == saving_lib.get_attr_skipset("Layer")
