"""``steps_per_epoch`` and ``validation_steps``: tfaccel.fit trains and evaluates the steps Keras ``model.fit`` does
(differential tests, one device, each copy of the model from the same seed).

Found by random ``fit`` arguments against plain ``model.fit``: the compiled loop trained every batch of the arrays
whatever ``steps_per_epoch`` said and evaluated every validation batch whatever ``validation_steps`` said (it now
leaves such a job to Keras' fit, saying why); and ``steps_per_execution="auto"`` could make Keras' own fit run past
them (its train and test functions end a call only where the data ends: 64 steps a call trained 128 of a repeated
dataset's ``steps_per_epoch=70``).
"""

from typing import Any, Dict, Optional, Tuple

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.train.loops.base import whole_calls

X = np.random.default_rng(0).normal(size=(37, 4)).astype("float32")  # batch 5: 8 batches, the last of 2
Y = np.random.default_rng(1).integers(0, 3, size=(37,)).astype("int32")
XV = np.random.default_rng(2).normal(size=(11, 4)).astype("float32")
YV = np.random.default_rng(3).integers(0, 3, size=(11,)).astype("int32")


def _model(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


def _both(compiled_steps: int = 1, **kwargs: Any) -> Tuple[tfaccel.FitResult, Dict[str, Any]]:
    """Plain ``model.fit`` and ``tfaccel.fit`` of the same job; asserts the same history, weights and steps."""
    reference = _model(compiled_steps)
    history = reference.fit(verbose=0, **kwargs).history
    with tfaccel.scope(strategy="default", jit_compile=False):
        model = _model(compiled_steps)
    result = tfaccel.fit(model, verbose=0, **kwargs)
    assert sorted(result.history) == sorted(history)
    for key, values in history.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-5, atol=1e-7, err_msg=key)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert int(model.optimizer.iterations) == int(reference.optimizer.iterations)
    return result, history


@pytest.mark.parametrize("steps, epochs", [(2, 1), (3, 3)])
def test_steps_per_epoch_fewer_than_the_batches_of_arrays(steps: int, epochs: int) -> None:
    """Keras trains ``steps`` batches an epoch, its iterator going on from where the last epoch stopped, until the 8
    batches run out (3 x 3: 3, 3, then 2, and Keras warns "ran out of data")."""
    result, _ = _both(x=X, y=Y, batch_size=5, epochs=epochs, shuffle=False, steps_per_epoch=steps)
    assert result.steps == min(steps * epochs, 8)
    assert f"steps_per_epoch={steps} is not one pass over the arrays" in result.details["loops_rejected"]["compiled"]


def test_validation_steps_evaluates_that_many_batches() -> None:
    result, history = _both(x=X, y=Y, batch_size=5, epochs=2, shuffle=False, validation_data=(XV, YV),
                            validation_steps=2, validation_batch_size=3)
    assert "validation_steps is given" in result.details["loops_rejected"]["compiled"]
    full = _model().fit(X, Y, batch_size=5, epochs=2, shuffle=False, validation_data=(XV, YV),
                        validation_batch_size=3, verbose=0).history
    assert history["val_loss"][0] != pytest.approx(full["val_loss"][0])  # 2 batches of 3 are not all 11 examples


def test_a_repeated_dataset_trains_exactly_steps_per_epoch() -> None:
    """70 steps an epoch of a repeated dataset: 35 steps a call (64 would train 128 an epoch)."""
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(5).repeat()
    result, _ = _both(x=data, epochs=2, steps_per_epoch=70)
    assert result.steps == 140
    assert result.details["steps_per_execution"].startswith("35 (auto: 35, the most steps per call")


@pytest.mark.parametrize("validation_steps", [None, 2])
def test_without_batch_size_keras_batches_the_examples_by_steps_per_epoch(validation_steps: Optional[int]) -> None:
    """No ``batch_size``, ``steps_per_epoch=3``: Keras' array adapter batches 37 examples by 13 (the examples over
    the steps, rounded up), not by its default 32, and the validation arrays by 32 or, with ``validation_steps``,
    by theirs (11 examples over 2 steps: 6). tfaccel took 32 for both."""
    result, _ = _both(x=X, y=Y, epochs=2, shuffle=False, steps_per_epoch=3, validation_data=(XV, YV),
                      validation_steps=validation_steps)
    assert "global batch 13 (Keras: 37 examples / steps_per_epoch=3)" in result.details["data"]


def test_without_batch_size_validation_steps_batch_the_validation_arrays_by_their_own_steps() -> None:
    """No ``batch_size``, 70 validation examples, ``validation_steps=2``: Keras evaluates 2 batches of 35 (every
    example), not 2 batches of 32 (tfaccel evaluated 64 of the 70)."""
    rng = np.random.default_rng(4)
    xv, yv = rng.normal(size=(70, 4)).astype("float32"), rng.integers(0, 3, size=(70,)).astype("int32")
    _, history = _both(x=X, y=Y, epochs=1, shuffle=False, validation_data=(xv, yv), validation_steps=2)
    every = _model().fit(X, Y, epochs=1, shuffle=False, validation_data=(xv, yv), verbose=0).history
    assert history["val_loss"][0] == pytest.approx(every["val_loss"][0], rel=1e-6)


def test_compiled_steps_per_execution_that_does_not_divide_steps_per_epoch_runs_as_in_keras_and_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    """The model compiled with 3 steps per call, ``steps_per_epoch=2``: Keras' fit runs 3 steps an epoch (its call
    ends only where the data ends); tfaccel trains the same and says why, instead of silently."""
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(5).repeat()
    result, _ = _both(compiled_steps=3, x=data, epochs=2, steps_per_epoch=2)  # optimizer.iterations: 6 both ways
    assert result.details["steps_per_execution"].startswith("3 (as compiled")
    assert result.steps == 6  # what ran (the optimizer's count), not steps_per_epoch x epochs
    warned = [r.getMessage() for r in caplog.records if "does not divide steps_per_epoch=2" in r.getMessage()]
    assert warned and "steps_per_execution=3 (as compiled)" in warned[0], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("bound, counts, expected", [(64, (70,), 35), (64, (128,), 64), (64, (67,), 1),
                                                     (64, (70, 6), 2), (8, (8, 2), 2), (5, (), 5), (64, (64,), 64)])
def test_whole_calls_divides_every_count(bound: int, counts: Tuple[int, ...], expected: int) -> None:
    assert whole_calls(bound, *counts) == expected


def test_a_dataset_that_ends_inside_a_call_counts_the_steps_it_ran() -> None:
    """8 batches of unknown cardinality, 64 steps a call: Keras numbers the call by its 64th step although the data
    ended after 8 (it warns "ran out of data"); FitResult.steps counts the 8 of each epoch that trained."""
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(5).filter(lambda x, y: True)  # cardinality unknown
    assert int(data.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    result, _ = _both(64, x=data, epochs=2)
    assert result.steps == 16
