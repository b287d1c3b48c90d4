"""Per-worker file sharding (tfaccel.datasets.tfrecord_dataset(input_context=...)) and the accounting report,
without a cluster."""

import numpy as np
import pytest

from tfaccel.datasets import tfrecord_dataset, write_tfrecords
from tfaccel.errors import ConfigError


def _labels(ds) -> list:
    return sorted(int(y) for _, y in ds.as_numpy_iterator())


def test_each_input_pipeline_reads_its_own_whole_files(tmp_path):
    import tensorflow as tf

    x = np.arange(40, dtype=np.int32).reshape(20, 2)
    write_tfrecords(x, np.arange(20), str(tmp_path), num_shards=4)  # example i in file i % 4
    pattern = str(tmp_path / "*.tfrecord")
    parts = [_labels(tfrecord_dataset(pattern, feature_shape=(2,), dtype="int32",
                                      input_context=tf.distribute.InputContext(2, k)))
             for k in range(2)]
    assert parts[0] == [i for i in range(20) if i % 4 in (0, 2)]  # files 0 and 2 of the sorted list
    assert parts[1] == [i for i in range(20) if i % 4 in (1, 3)]
    shuffled = tfrecord_dataset(pattern, feature_shape=(2,), dtype="int32", shuffle_files=True, seed=3,
                                input_context=tf.distribute.InputContext(2, 1))
    assert _labels(shuffled) == parts[1]  # shuffling the files never mixes in another pipeline's
    assert _labels(tfrecord_dataset(pattern, feature_shape=(2,), dtype="int32")) == list(range(20))


def test_more_pipelines_than_files_is_refused(tmp_path):
    import tensorflow as tf

    write_tfrecords(np.zeros((6, 1), np.float32), np.zeros(6), str(tmp_path), num_shards=2)
    with pytest.raises(ConfigError, match=r"tfrecord_dataset: 2 files match '.*\*\.tfrecord' but input_context has 3 "
                                          r"input pipelines \(one per worker\), so some would read nothing; write at "
                                          r"least 3 shards \(write_tfrecords\(\.\.\., num_shards=3\)\)"):
        tfrecord_dataset(str(tmp_path / "*.tfrecord"), feature_shape=(1,), input_context=tf.distribute.InputContext(3, 0))


def test_accounting_report_counts_reruns_and_per_worker_work():
    from tfaccel.train.loops.ps_step import Accounting

    before = {"started": 4, "updates": [10, 10], "examples": [640, 640]}
    after = {"started": 4 + 12, "updates": [10 + 60, 10 + 40], "examples": [640 + 60 * 64, 640 + 40 * 64 - 16]}
    report = Accounting.report(before, after, closures=11, updates=88, applied=101)
    assert report == {"updates_scheduled": 88, "updates_applied": 101,
                      "updates_counted_per_worker": {"worker:0": 60, "worker:1": 40}, "updates_not_counted": 1,
                      "examples_seen": {"worker:0": 3840, "worker:1": 2544}, "examples_seen_total": 6384,
                      "closures_scheduled": 11, "closures_started": 12, "closures_rerun": 1}
