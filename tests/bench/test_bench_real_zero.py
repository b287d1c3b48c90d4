"""``tfaccel bench --suite real --real-zero 2,4``: its options checked before anything runs, the bytes each replica
sends per step (unsharded, sharded on mirrored, under multi_worker and under Horovod) and the report's lines."""

import argparse

import keras
import pytest

from tfaccel.bench import BenchConfig
from tfaccel.bench.real_zero_run import ZERO_PATHS, format_real_zero
from tfaccel.bench.zero_traffic import bytes_per_step
from tfaccel.cli import bench as cli_bench
from tfaccel.errors import ConfigError


def _args(**kwargs):
    base = {"real_size": "test", "real_models": None, "real_paths": None, "real_limits": None, "real_zero": None}
    return argparse.Namespace(**{**base, **kwargs})


def test_zero_rows_default_to_mirrored_multi_worker_and_horovod():
    config = cli_bench.real_config(BenchConfig(), _args(real_zero="2,4", real_models="bert_classifier"))
    assert config.real_zero == (2, 4) and tuple(config.real_paths) == ZERO_PATHS == ("mirrored", "multi_worker",
                                                                                     "horovod")
    assert config.real_models == ("bert_classifier",)


@pytest.mark.parametrize("kwargs, message", [
    ({"real_zero": "1,2"}, "--real-zero: replica count 1 is below 2 (sharding needs several replicas)"),
    ({"real_zero": "two"}, "--real-zero takes replica counts such as 2,4; received 'two'"),
    ({"real_zero": "2", "real_paths": "default"}, "--real-zero with --real-paths 'default': the ZeRO rows run on "
                                                  "mirrored, multi_worker, horovod; pass --real-paths "
                                                  "mirrored,multi_worker,horovod"),
])
def test_bad_zero_options_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        cli_bench.real_config(BenchConfig(), _args(**kwargs))


def test_bytes_per_step_unsharded_sharded_across_workers_and_ranks():
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    dense, table = (12 * 2 + 2) * 4, 10 * 4 * 4  # the Dense kernel (96 bytes) and bias (8 bytes)
    for n in (2, 4):
        plain = bytes_per_step(model, n, sharded=False, path="mirrored")
        assert plain == {"dense": int(dense * 2 * (n - 1) / n), "embedding": int(table * 2 * (n - 1) / n),
                         "total": plain["dense"] + plain["embedding"]}
        for path in ZERO_PATHS:  # unsharded: one all-reduce on every path
            assert bytes_per_step(model, n, sharded=False, path=path) == plain
        assert bytes_per_step(model, n, sharded=True, path="mirrored") == plain  # reduce to the owner + copy out
        across = bytes_per_step(model, n, sharded=True, path="multi_worker")  # rows padded to the largest owner
        # the table's 40 elements split evenly over the owners' rows: the kernel's owner (replica 0) the largest
        assert across == {"dense": 2 * (n - 1) * 96, "embedding": 2 * (n - 1) * 4 * 40 // n,
                          "total": 2 * (n - 1) * (96 + 4 * 40 // n)}
        ranks = bytes_per_step(model, n, sharded=True, path="horovod")  # the all-reduce, then an all-gather
        assert ranks["dense"] == int(dense * 3 * (n - 1) / n) and ranks["embedding"] == plain["embedding"]


def test_report_line_of_a_zero_row():
    def run(held, peak):
        return {"optimizer_bytes_per_replica": held, "allocator_peak_bytes": peak, "step_seconds": 0.1}

    row = {"runs": {"unsharded": [run({"/cpu:0": 2 ** 20, "/cpu:1": 2 ** 20}, 3 * 2 ** 20)],
                    "sharded": [run({"/cpu:0": 2 ** 19, "/cpu:1": 2 ** 19}, 2 * 2 ** 20)]},
           "ratio": 1.05, "ratios": [1.05], "load_average": [3.0, 4.0],
           "predicted": {"unsharded_optimizer_bytes": 2 ** 20, "sharded_optimizer_bytes": [2 ** 19, 2 ** 19],
                         "bytes_per_step": {"unsharded": {"total": 1000}, "sharded": {"total": 1000}}}}
    lines = format_real_zero({"mirrored x2": [{"rows": {"bert_classifier": row}}]})
    assert lines[1] == ("  bert_classifier mirrored x2: ratio 1.05 [1.05]; optimizer MiB per replica unsharded "
                        "['1.00', '1.00'] | 1.00, sharded ['0.50', '0.50'] | ['0.50', '0.50']; allocator peak "
                        "unsharded ['3.00'], sharded ['2.00']; sent per step 1,000 B unsharded, 1,000 B sharded; "
                        "load [3.0, 4.0]")


def test_a_failed_row_is_kept_as_its_error_and_the_others_are_measured(monkeypatch):
    """A row whose processes fail (e.g. a worker killed) is recorded with the reason; the rows after it still run."""
    from tfaccel.bench import real_zero_run

    def child(config, path, replicas):
        if (path, replicas) == ("multi_worker", 4):
            raise RuntimeError("bench real zero multi_worker x4: exit 134\nterminate called ...")
        return [{"rows": {}, "path": path, "replicas": replicas}]

    monkeypatch.setattr(real_zero_run, "_child", child)
    config = BenchConfig(real_zero=(2, 4), real_paths=ZERO_PATHS, real_models=("bert_classifier",))
    rows = real_zero_run.measure_real_zero(config)
    assert list(rows) == ["mirrored x2", "mirrored x4", "multi_worker x2", "multi_worker x4", "horovod x2",
                          "horovod x4"]
    assert rows["multi_worker x2"] == [{"rows": {}, "path": "multi_worker", "replicas": 2}]
    assert rows["multi_worker x4"]["error"].startswith("bench real zero multi_worker x4: exit 134")
    assert format_real_zero({"multi_worker x4": rows["multi_worker x4"]})[1] == (
        "  multi_worker x4: FAILED, bench real zero multi_worker x4: exit 134")
