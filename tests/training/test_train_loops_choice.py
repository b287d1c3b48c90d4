"""``tfaccel.train.loops.choose``: the first loop of ``LOOPS`` with no blockers trains the job; the chosen loop's line
and every loop tried before it, with its reasons, are in ``FitResult.details``."""

import numpy as np
import pytest

import tfaccel
from tfaccel.train.loops import LOOPS


def _build():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])


def _data(n=40):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 4)).astype("float32"), rng.integers(0, 3, n)


def test_the_loops_in_their_order():
    assert [loop.name for loop in LOOPS] == ["coordinator", "multi_step", "compiled", "keras_fit"]
    assert [loop.own for loop in LOOPS] == [False, True, True, False]


def test_the_chosen_loop_and_every_rejected_loop_with_its_reasons(clean_tf_config):
    import keras

    per_batch = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None)
    result = tfaccel.compile_and_fit(_build, _data(), epochs=1, global_batch_size=8, strategy="default",
                                     loss="sparse_categorical_crossentropy", callbacks=[per_batch], verbose=0, seed=1)
    rejected = result.details["loops_rejected"]
    assert list(rejected) == ["coordinator", "multi_step", "compiled"]
    assert rejected["coordinator"] == ["strategy default trains with Keras' train function"]
    assert rejected["multi_step"] == ["strategy default (the multi-step loop runs mirrored and multi_worker)"]
    assert rejected["compiled"] == ["callback LambdaCallback has per-batch hooks (on_train_batch_end)"]
    assert result.details["loop"] == "Keras fit (callback LambdaCallback has per-batch hooks (on_train_batch_end))"


@pytest.mark.parametrize("loop, chosen, rejected", [
    ("auto", "compiled whole-epoch loop", ["coordinator", "multi_step"]),
    ("keras", "Keras fit (asked for)", ["coordinator", "multi_step", "compiled"]),
])
def test_what_was_asked_for_decides_among_the_loops_that_can_run(loop, chosen, rejected, clean_tf_config):
    result = tfaccel.compile_and_fit(_build, _data(), epochs=1, global_batch_size=8, strategy="default",
                                     loss="sparse_categorical_crossentropy", verbose=0, seed=1, loop=loop)
    assert result.details["loop"].startswith(chosen) and list(result.details["loops_rejected"]) == rejected
    if loop == "keras":
        assert result.details["loops_rejected"]["compiled"] == ["loop='keras' asks for Keras fit"]
