"""Every loop visits the same batches for the same (seed, epoch): the compiled loop (one replica), the multi-step loop
(mirrored over 2 virtual CPUs, each replica gathering its part of a batch) and the coordinator loop (its closures'
batches), all from ``tfaccel.train.data.example_order``, the one order ``example_stream`` gives Keras fit too.

The compiled and multi-step loops really train here; what each hands its steps is recorded on the way. The
coordinator loop's batches are those its ``Schedule`` puts in the closures (a cluster of its own is
tests/training/test_train_coordinator.py's business)."""

import logging
import sys
from pathlib import Path
from typing import Any, List

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))

import tfaccel  # noqa: E402
from strategies_logs import tfaccel_records  # noqa: E402
from tfaccel.train.data import example_order, example_stream, prepare_data
from tfaccel.train.loops import compiled, multi_step
from tfaccel.train.loops.ps_step import closure_batches, closure_spans

N, BATCH, SEED, EPOCHS = 22, 4, 11, 2  # 5 whole batches and a partial one of 2 (one example per replica)


def _data() -> tuple:
    x = np.arange(N, dtype="float32").reshape(N, 1)  # x is the example's index
    return x, (np.arange(N) % 2).astype("float32")


def _model() -> Any:
    import keras

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _batches(order: np.ndarray) -> List[List[int]]:
    return [order[s:s + BATCH].tolist() for s in range(0, len(order), BATCH)]


def _expected() -> List[List[List[int]]]:
    return [_batches(example_order(N, SEED, epoch, True)) for epoch in range(EPOCHS)]


def test_the_order_is_a_function_of_seed_and_epoch_and_keras_shuffle_argument() -> None:
    first = example_order(N, SEED, 0, True)
    assert sorted(first.tolist()) == list(range(N)) and first.dtype == np.int32
    assert (example_order(N, SEED, 0, True) == first).all()
    assert (example_order(N, SEED, 1, True) != first).any() and (example_order(N, SEED + 1, 0, True) != first).any()
    assert example_order(N, SEED, 0, False).tolist() == example_order(N, SEED, 0, "batch").tolist() == list(range(N))


def test_compiled_loop_visits_the_order(monkeypatch: pytest.MonkeyPatch, clean_tf_config: Any) -> None:
    seen: List[List[List[int]]] = []
    real_run = compiled._Pass.run

    def spy(self: Any, order: np.ndarray) -> Any:
        seen.append(_batches(np.asarray(order)))
        return real_run(self, order)

    monkeypatch.setattr(compiled._Pass, "run", spy)
    x, y = _data()
    with tfaccel.scope(strategy="default"):
        model = _model()
    compiled.run_compiled(model, x=x, y=y, sample_weight=None, batch_size=BATCH, epochs=EPOCHS, initial_epoch=0,
                          shuffle=True, seed=SEED, validation=None, validation_batch_size=None, validation_freq=1,
                          jit_compile=False, callbacks=[], verbose=0)
    assert seen == _expected()


def test_multi_step_loop_replicas_together_visit_the_order(monkeypatch: pytest.MonkeyPatch, clean_tf_config: Any,
                                                           cpu_replicas: List[str]) -> None:
    seen: List[List[List[int]]] = []
    real_indices = multi_step._ReplicatedPass.indices

    def spy(self: Any, order: np.ndarray) -> Any:
        whole, partial = real_indices(self, order)
        local = self.strategy.experimental_local_results
        parts = [np.asarray(t).reshape(self.whole, self.per_replica) for t in local(whole)]
        batches = [np.concatenate([p[i] for p in parts]).tolist() for i in range(self.whole)]
        tail = [np.asarray(t).tolist() for t in local(partial)]
        seen.append(batches + [sum(tail, [])])
        return whole, partial

    monkeypatch.setattr(multi_step._ReplicatedPass, "indices", spy)
    x, y = _data()
    with tfaccel.scope() as plan:  # "auto": mirrored over the 2 virtual CPUs (the request other tests make too)
        model = _model()
    assert plan.strategy == "mirrored" and plan.num_replicas == 2
    data = prepare_data(x, y, batch_size=BATCH, seed=SEED)
    multi_step.run_multi_step(model, data=data, epochs=EPOCHS, initial_epoch=0, start_step=0, steps_per_execution=3,
                              validation_batch_size=None, validation_freq=1, callbacks=[], verbose=0)
    assert seen == _expected()


@pytest.mark.parametrize("accum", [1, 2])
def test_coordinator_closures_visit_the_order(accum: int) -> None:
    steps = -(-N // BATCH)
    for epoch, expected in enumerate(_expected()):
        order = example_order(N, SEED, epoch, True)
        spans = closure_spans(0, steps - steps % accum, accum)
        got = [b.tolist() for first, last in spans
               for update in closure_batches(order, first, last, batch=BATCH, accum=accum) for b in update]
        assert got == expected[:len(got)] and len(got) == steps - steps % accum


def test_keras_fit_stream_visits_the_order() -> None:
    x, y = _data()
    stream, steps = example_stream(prepare_data(x, y, batch_size=BATCH, seed=SEED), epochs=EPOCHS, initial_epoch=0)
    got = [np.asarray(bx).reshape(-1).astype(int).tolist() for bx, _ in stream]
    assert got == [b for epoch in _expected() for b in epoch] and steps == len(_expected()[0])


def test_shuffle_follows_keras_set_random_seed_as_plain_fit_does(clean_tf_config):
    """``keras.utils.set_random_seed(s)`` then ``fit(shuffle=True)`` repeats its order after the same call, and a
    second fit gets another order, as Keras' own shuffle; before, seed=None drew from ``secrets`` and ignored it."""
    import keras

    x, y = np.zeros((16, 2), "float32"), np.zeros((16, 1), "float32")

    def seed_of_one_fit() -> int:
        with tfaccel.scope(strategy="default"):
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        return tfaccel.fit(model, x, y, batch_size=8, epochs=1, verbose=0).details["seed"]

    keras.utils.set_random_seed(5)
    with tfaccel_records() as records:
        first, second = seed_of_one_fit(), seed_of_one_fit()
    keras.utils.set_random_seed(5)
    assert seed_of_one_fit() == first != second
    assert any(r.levelno == logging.DEBUG and "from keras.utils.set_random_seed(5)" in r.getMessage()
               for r in records)
