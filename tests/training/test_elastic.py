"""Elastic jobs, the training side (issue 25): the batch rule, world-size records, the whole job's history."""

import json

import numpy as np
import pytest

import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.resilience.elastic import (ELASTIC_ENV, check_elastic_batch, elastic_range, merged_history,
                                   parse_workers_range, world_size_changes)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(192, 6)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int32")


@pytest.mark.parametrize("text, expected", [("3", (3, 3)), ("2:4", (2, 4)), (" 1:1 ", (1, 1))])
def test_parse_workers_range(text, expected):
    assert parse_workers_range(text) == expected


@pytest.mark.parametrize("text", ["0", "3:2", "a:b", "1:2:3", "", "-1:2"])
def test_a_bad_range_names_the_field_and_what_was_received(text):
    with pytest.raises(ConfigError, match=rf"--workers: expected a number of workers N or a range MIN:MAX .*"
                                          rf"received {text.strip()[:40]!r}"):
        parse_workers_range(text)
    assert elastic_range({}) is None and elastic_range({ELASTIC_ENV: "2:3"}) == (2, 3)


def test_the_batch_must_split_evenly_over_every_size():
    check_elastic_batch(batch_size=96, num_examples=1344, what="arrays", workers=(2, 3))  # 96 = 2*48 = 3*32
    with pytest.raises(ConfigError, match=r"--workers 2:5: the global batch 96 does not split evenly over 5 workers; "
                                          r"it does over 2 workers, 3 workers, 4 workers"):
        check_elastic_batch(batch_size=96, num_examples=1344, what="arrays", workers=(2, 5))
    with pytest.raises(ConfigError, match=r"the global batch 100 does not split evenly over 3 workers; it does over "
                                          r"2 workers, 4 workers. Use a batch that every world size divides "
                                          r"\(e.g. 108\)"):
        check_elastic_batch(batch_size=100, num_examples=1000, what="arrays", workers=(2, 4))
    with pytest.raises(ConfigError, match=r"2 workers \(4 replicas\)"):
        check_elastic_batch(batch_size=6, num_examples=60, what="arrays", workers=(1, 2), replicas_per_worker=2)


def test_the_last_partial_batch_must_split_evenly_too():
    """Digits' 1437 examples in batches of 96: the last has 93, 31 on each of 3 workers but 47/46 on 2, where Keras'
    mean of the replicas' means is not the mean over the 93 examples (2 vs 3 workers: 1.07e-3 apart in the weights
    after 3 epochs, 8.9e-8 on the first 1344 examples)."""
    with pytest.raises(ConfigError, match=r"--workers 2:3: the last batch of every epoch holds 93 examples \(1437 "
                                          r"examples, batch 96\), which does not split evenly over 2 workers \(it does "
                                          r"over 3 workers\).* e.g. x\[:1344\]"):
        check_elastic_batch(batch_size=96, num_examples=1437, what="arrays", workers=(2, 3))


def test_datasets_are_refused():
    with pytest.raises(ConfigError, match="only where tfaccel batches and orders the examples .* received a "
                                          "tf.data.Dataset"):
        check_elastic_batch(batch_size=None, num_examples=None, what="a tf.data.Dataset", workers=(1, 2))


def test_world_size_changes_and_history():
    assert world_size_changes(None, workers=3) == [] == world_size_changes(None, workers=3, previous=3)
    assert world_size_changes(None, workers=2, previous=3) == [  # a restart before the first backup
        {"from": 3, "to": 2, "epoch": 0, "step": 0, "reason": "restarted with 2 workers"}]
    state = {"epoch": 1, "step": 4, "workers": 3, "world_size_changes": []}
    assert world_size_changes(state, workers=3) == []
    assert world_size_changes(state, workers=2, reason="worker:2 lost") == [
        {"from": 3, "to": 2, "epoch": 1, "step": 4, "reason": "worker:2 lost"}]
    older = {**state, "workers": 2, "world_size_changes": [{"from": 3, "to": 2, "epoch": 0, "step": 6, "reason": "r"}]}
    assert [c["to"] for c in world_size_changes(older, workers=3)] == [2, 3]
    assert merged_history({"loss": [1.0]}, {"loss": [0.5], "val_loss": [0.7]}) == {"loss": [1.0, 0.5],
                                                                                    "val_loss": [0.7]}


def test_a_backup_holds_the_metrics_only_when_they_were_read_at_its_step():
    """A backup at another step (e.g. one a preemption asked for) gets no metric state rather than a stale one."""
    from tfaccel.resilience.elastic import journal_callback

    journal = journal_callback(None, workers=2, replicas=2, changes=[], save_freq=2, steps_per_epoch=10)
    journal.metrics = (1, 4, [[3.0], [96.0]])
    assert journal.record(1, 4) == {"workers": 2, "replicas": 2, "world_size_changes": [], "history": {},
                                    "metrics": [[3.0], [96.0]]}
    assert "metrics" not in journal.record(1, 5) and "metrics" not in journal.record(2, 4)


def _build():
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(2, activation="softmax")])


class _Stop(Exception):
    pass


def _fit(backup_dir, callbacks=()):
    return tfaccel.compile_and_fit(_build, (X, Y), epochs=3, global_batch_size=16, metrics=["accuracy"],
                                   loss="sparse_categorical_crossentropy", learning_rate=0.01, seed=3, verbose=0,
                                   backup_dir=str(backup_dir), backup_freq=2, steps_per_execution=1,
                                   callbacks=list(callbacks))


def test_a_resumed_job_reports_every_epoch_once_as_the_uninterrupted_run(tmp_path, clean_tf_config):
    """Stopped after epoch 1 step 5 (backup at step 4), resumed: the history of all three epochs, the cut one
    included, and the weights equal the uninterrupted run's; a backup written on 3 workers records the change."""
    import keras

    whole = _fit(tmp_path / "whole")

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 1 and batch == 4:
                raise _Stop()

    with pytest.raises(_Stop):
        _fit(tmp_path / "cut", [Stop()])
    pointer = tmp_path / "cut" / "tfaccel_backup.json"
    state = json.loads(pointer.read_text())
    assert (state["epoch"], state["step"], state["workers"]) == (1, 4, 1)
    assert len(state["history"]["loss"]) == 1 and state["metrics"]  # epoch 0's logs, the metrics after 4 steps
    pointer.write_text(json.dumps({**state, "workers": 3}))  # as if written by a 3-worker job
    resumed = _fit(tmp_path / "cut")
    assert resumed.resumed_from == (1, 4) and resumed.steps == 12 + 8
    assert resumed.details["world_size"] == [{"from": 3, "to": 1, "epoch": 1, "step": 4,
                                              "reason": "restarted with 1 workers"}]
    assert set(resumed.history) == set(whole.history) == {"loss", "accuracy"}
    for key in whole.history:
        np.testing.assert_allclose(resumed.history[key], whole.history[key], rtol=1e-6, atol=1e-6)
    for a, b in zip(resumed.model.get_weights(), whole.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert int(resumed.model.optimizer.iterations.numpy()) == int(whole.model.optimizer.iterations.numpy()) == 36


def test_an_elastic_job_with_an_uneven_last_batch_stops_before_training(tmp_path, clean_tf_config, monkeypatch):
    monkeypatch.setenv(ELASTIC_ENV, "1:3")
    with pytest.raises(ConfigError, match=r"--workers 1:3: the last batch of every epoch holds 2 examples"):
        tfaccel.compile_and_fit(_build, (X[:50], Y[:50]), epochs=1, global_batch_size=24,
                                loss="sparse_categorical_crossentropy", verbose=0)


def test_per_replica_batch_statistics_are_named():
    import keras

    from tfaccel.resilience.elastic import per_replica_statistics

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.BatchNormalization(name="bn"),
                              keras.layers.BatchNormalization(synchronized=True, name="sync")])
    assert per_replica_statistics(model) == ["bn"] and per_replica_statistics(_build()) == []


def test_an_elastic_job_with_per_replica_batch_statistics_says_so(clean_tf_config, monkeypatch, caplog):
    import keras

    monkeypatch.setenv(ELASTIC_ENV, "1:2")

    def build():
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.BatchNormalization(name="bn"),
                                 keras.layers.Dense(2, activation="softmax")])

    with caplog.at_level("WARNING", logger="tfaccel"):
        tfaccel.compile_and_fit(build, (X, Y), epochs=1, global_batch_size=16, loss="sparse_categorical_crossentropy",
                                verbose=0)
    assert "elastic: bn normalize(s) with each replica's own batch statistics" in caplog.text
