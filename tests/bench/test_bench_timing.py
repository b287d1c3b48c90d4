"""The one timing helper (Stopwatch) and the seeded random order of the contenders; the streamed inputs."""

import time

import numpy as np
import pytest

from tfaccel.bench.config import round_order
from tfaccel.bench.stream import naive_tfrecord_dataset
from tfaccel.bench.timing import Stopwatch
from tfaccel.datasets import tfrecord_dataset, write_tfrecords
from tfaccel.errors import ConfigError


def _sleeper(epochs: int, seconds: float, report: int):
    def train(timer):
        for e in range(report):
            timer.on_epoch_begin(e)
            time.sleep(seconds)
            timer.on_epoch_end(e, {"loss": np.float32(1.0)})
        return {"loop": "sleep"}

    return train


def test_stopwatch_window_is_epochs_2_to_n_and_whole_call_apart():
    stopwatch = Stopwatch()

    def train(timer):
        time.sleep(0.3)  # "tracing" before the first epoch: in time_to_train only
        return _sleeper(3, 0.05, 3)(timer)

    t = stopwatch.time("a", train, examples_per_epoch=100, epochs=3)
    assert 1000 < t.examples_per_sec <= 2000  # 200 examples in ~0.1 s
    assert t.time_to_train >= 0.45 and len(t.epoch_seconds) == 3 and t.details == {"loop": "sleep"}
    assert 0 <= t.cpu_per_wall < 0.5  # sleeping is not computing
    stopwatch.time("b", _sleeper(2, 0.01, 2), examples_per_epoch=10, epochs=2)
    assert stopwatch.timed == ["a", "b"]


def test_stopwatch_refuses_a_contender_that_hides_epochs():
    with pytest.raises(ConfigError, match=r"contender 'c' reported 1 epoch begins and 1 ends to the timer, not 3; "
                                          r"pass the timer as a callback"):
        Stopwatch().time("c", _sleeper(3, 0.0, 1), examples_per_epoch=10, epochs=3)
    with pytest.raises(ConfigError, match=r"needs epochs >= 2 .* received epochs=1"):
        Stopwatch().time("c", _sleeper(1, 0.0, 1), examples_per_epoch=10, epochs=1)


def test_round_order_is_seeded_random_and_differs_across_rounds():
    names = ["a", "b", "c", "d", "e", "f"]
    orders = [round_order(names, seed=0, group="mlp", round_index=r) for r in range(4)]
    assert all(sorted(o) == names for o in orders) and len({tuple(o) for o in orders}) > 1
    assert orders[0] == round_order(names, seed=0, group="mlp", round_index=0)  # a rerun repeats it
    assert any(round_order(names, seed=1, group="mlp", round_index=r) != orders[r] for r in range(4))


def test_streamed_and_naive_inputs_give_the_written_examples(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.random((10, 2, 3), dtype=np.float32), np.arange(10, dtype=np.int32)
    files = write_tfrecords(x, y, str(tmp_path), num_shards=3)
    batched = list(tfrecord_dataset(str(tmp_path / "*.tfrecord"), feature_shape=(2, 3), batch_size=4))
    assert [len(b[1]) for b in batched] == [4, 4, 2]
    got = np.concatenate([b[1].numpy() for b in batched])
    assert got.tolist() == list(range(10))  # the unbatched order: one record from each shard in turn
    assert np.array_equal(np.concatenate([b[0].numpy() for b in batched]), x[got])
    naive = list(naive_tfrecord_dataset(files, feature_shape=(2, 3), batch_size=4))
    naive_y = np.concatenate([b[1].numpy() for b in naive])
    assert naive_y.tolist() == [0, 3, 6, 9, 1, 4, 7, 2, 5, 8] and np.array_equal(
        np.concatenate([b[0].numpy() for b in naive]), x[naive_y])
    with pytest.raises(ConfigError, match=r"tfrecord_dataset: batch_size must be a positive integer or None "
                                          r"\(unbatched\); received batch_size=0"):
        tfrecord_dataset(str(tmp_path / "*.tfrecord"), feature_shape=(2, 3), batch_size=0)
