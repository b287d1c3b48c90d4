"""tfaccel.compat.keras_ps_model: when a model is left as it is (every reason), without a cluster.

That the fix is needed, and works, is shown on a real chief + worker + ps cluster by
tests/training/test_train_coordinator.py (Keras evaluate / predict / .keras after parameter-server training; without
the fix Keras 3.15 raises "To use this dataset, you need to pass this dataset to
ClusterCoordinator.create_per_worker_dataset").
"""

import keras

from tfaccel.compat import keras_ps_model


def _model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def test_a_model_of_another_strategy_is_left_alone():
    model = _model()
    assert keras_ps_model.why_not_needed(model) == "the model's strategy is NoneType, not ParameterServerStrategy"
    assert keras_ps_model.release_from_strategy(model) is False


def test_switched_off_and_unknown_versions_are_left_alone(monkeypatch):
    model = _model()
    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", "keras_ps_model")
    assert keras_ps_model.why_not_needed(model) == "switched off by TFACCEL_DISABLE_COMPAT (keras_ps_model)"
    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT")
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    assert keras_ps_model.why_not_needed(model) == (
        "Keras 3.16.0 is outside the versions this fix is known to be needed on (3.0 up to 3.15.x); not patching. "
        "If evaluate fails after parameter-server training, see keras-team/keras#18624")
    assert keras_ps_model.release_from_strategy(model) is False
