"""tfaccel.doctor in this process (2 virtual CPUs): a correct model is equal to rounding, each planted cause is named."""

import functools
import re
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.divergence.loop import LoopCapture
from tfaccel.errors import ConfigError
from tfaccel.real_suite import get_real_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plants  # noqa: E402

STEPS = 3


@functools.lru_cache(maxsize=None)  # one doctor run per plant for the whole module
def _doctor(plant: str, n: int = 64, steps: int = STEPS) -> "tfaccel.divergence.DoctorReport":
    return tfaccel.doctor(plants.BUILDERS[plant], plants.data(n), steps=steps, batch_size=16)


@pytest.mark.parametrize("plant", ["none", "batchnorm_synchronized"])
def test_a_correct_model_is_equal_to_rounding(plant: str) -> None:
    report = _doctor(plant)
    assert report.equal, report.summary()
    assert report.causes == []
    summary = report.summary()
    assert "equal to rounding (rtol=3e-05" in summary and "reorders additions" in summary
    assert [row["digest"][0] for row in report.verdict.rows] == [report.single.digest(s) for s in range(STEPS)]
    assert report.to_json()["equal"] is True


@pytest.mark.parametrize("plant, cause, quantity", [
    ("batchnorm", "batchnorm-per-replica", "log loss"),
    ("dropout", "random-ops-per-replica", "log loss"),
    ("scaled_metric", "metric-fed-scaled-loss", "log loss"),
    ("per_replica_mean", "loss-reduced-per-replica", "gradient norm"),
    ("loss_scale", "loss-scale-skips-on-one-path", "log loss"),
])
def test_each_planted_cause_is_named_first(plant: str, cause: str, quantity: str) -> None:
    report = _doctor(plant)
    assert not report.equal
    assert report.verdict.first.step == 0
    assert any(p.quantity == quantity for p in report.verdict.parts), report.verdict.parts
    assert report.causes and report.causes[0].name == cause, report.summary()
    summary = report.summary()
    assert "the runs part at step 0" in summary and f"likely cause: {cause}:" in summary and "fix:" in summary


def test_the_uneven_last_batch_is_named_at_its_step() -> None:
    report = _doctor("none", n=49, steps=4)  # batches 16, 16, 16, 1: the last leaves a replica empty
    assert report.verdict.first.step == 3
    assert [c.name for c in report.causes] == ["uneven-last-batch"], report.summary()


def test_a_loss_scale_optimizer_records_its_scale_and_skipped_steps() -> None:
    report = _doctor("loss_scale")
    single, many = report.single.steps[0], report.many.steps[0]
    assert single.nonfinite_grads > 0 and many.nonfinite_grads == 0
    assert single.loss_scale < many.loss_scale
    assert np.isfinite(many.grad_norm)


@pytest.mark.parametrize("steps", [0, -1, 1.5, True])
def test_bad_steps_are_refused(steps: object) -> None:
    with pytest.raises(ConfigError, match=f"steps must be a whole number >= 1; received {steps!r}"):
        tfaccel.doctor(plants.BUILDERS["none"], plants.data(), steps=steps)


def test_the_nan_sentinel_names_the_first_layer_in_each_run() -> None:
    report = tfaccel.doctor(plants.BUILDERS["loss_scale"], plants.data(), steps=2, batch_size=16, nan=True)
    assert report.single.nan["step"] == 0 and report.single.nan["layer"].startswith("blowup"), report.single.nan
    assert report.many.nan == {"step": None, "layer": None, "what": "no NaN/Inf in 2 steps"}
    summary = report.summary()
    assert "NaN/Inf sentinel, 1 replica: first at step 0: the output of layer blowup" in summary
    assert "NaN/Inf sentinel, 2 replicas: no NaN/Inf in 2 steps" in summary


def test_a_kerashub_model_with_dict_inputs_is_equal_to_rounding_without_dropout() -> None:
    spec = get_real_model("bert_classifier")  # tests/doctor/test_doctor_cli.py plants its dropout
    report = tfaccel.doctor(lambda: spec.build("test", dropout=0.0), spec.data("test"), steps=2,
                            batch_size=spec.job("test").batch_size)
    assert report.equal and report.causes == [], report.summary()


def test_a_dataset_fn_batched_by_the_global_batch_in_each_replica_is_named() -> None:
    report = tfaccel.doctor(plants.BUILDERS["none"], plants.dataset_fn(shard=True, per_replica=False), steps=2)
    assert [r["batch_size"] for r in report.verdict.rows] == [16, 16]
    assert report.verdict.first.quantity == "examples of the global batch" and report.verdict.first.replicas == 32
    assert report.causes[0].name == "data-sharding-or-order", report.summary()
    assert "each pipeline batches by another size" in report.causes[0].evidence
    assert "each run reading the dataset_fn" in report.summary()


def test_a_dataset_fn_with_an_unseeded_shuffle_is_named() -> None:
    report = tfaccel.doctor(plants.BUILDERS["none"], plants.dataset_fn(shard=True, shuffle=True), steps=1)
    assert report.verdict.first.quantity == "examples of the global batch", report.summary()
    assert report.causes[0].name == "data-sharding-or-order"
    assert re.search(r"at step 0 the 2 replicas trained on 16 examples and one replica on 16; \d+ of them are other "
                     r"ones: the pipelines order or shuffle the examples differently", report.causes[0].evidence)


def test_an_unsharded_dataset_fn_is_equal_in_one_process() -> None:
    # One process has one input pipeline, so a dataset_fn that does not shard reads each example once: the cause
    # shows with --workers (tests/doctor/test_doctor_cli.py).
    assert _doctor_fn(shard=False).equal


@functools.lru_cache(maxsize=None)
def _doctor_fn(shard: bool) -> "tfaccel.divergence.DoctorReport":
    return tfaccel.doctor(plants.BUILDERS["none"], plants.dataset_fn(shard=shard), steps=2)


def test_a_float32_metric_count_that_passes_2_to_the_24_within_an_epoch_is_named_though_the_runs_agree() -> None:
    report = tfaccel.doctor(plants.BUILDERS["none"], plants.long_epoch(), steps=2)
    assert report.equal and not report.ok and report.to_json()["ok"] is False
    assert [c.name for c in report.causes] == ["metric-accumulator-overflow"], report.summary()
    evidence = report.causes[0].evidence
    assert "1 replica: " in evidence and "2 replicas: " in evidence
    # the loss tracker's total (the loss, a few units, times 16 a step) passes 2**24 first, some 100,000s of steps in
    found = re.search(r"1 replica: loss/total grows by [\d.]+ a step: at that rate it passes 2\*\*24 = 16,777,216 "
                      r"\(float32 stops adding exactly\) at about step ([\d,]+) of an epoch of 1,200,000 steps", evidence)
    assert found and int(found.group(1).replace(",", "")) < 1_200_000, evidence
    assert "but a run has a problem of its own:\nlikely cause: metric-accumulator-overflow" in report.summary()


def test_a_metric_accumulator_that_is_not_finite_is_named() -> None:
    big = plants.data()
    report = tfaccel.doctor(plants.BUILDERS["none"], (big[0], big[1] * 1e19), steps=2, batch_size=16)
    causes = [c.name for c in report.causes]
    assert "metric-accumulator-overflow" in causes, report.summary()
    assert "is not finite after" in report.causes[causes.index("metric-accumulator-overflow")].evidence


def test_the_plot_is_a_png_of_both_runs(tmp_path: Path) -> None:
    path = tmp_path / "doctor.png"
    _doctor("batchnorm").plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_plot_without_matplotlib_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ConfigError, match=r"--plot needs matplotlib, which is not installed; pip install "
                                          r"'tfaccel\[doctor\]'"):
        _doctor("batchnorm").plot(str(tmp_path / "doctor.png"))


def test_a_plot_path_that_cannot_be_written_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be written"):
        _doctor("batchnorm").plot(str(tmp_path / "missing" / "doctor.png"))


def test_a_custom_loop_that_runs_a_step_before_distributing_a_dataset_is_refused() -> None:
    strategy = tf.distribute.get_strategy()
    capture = LoopCapture(strategy, stop=lambda loop, data: pytest.fail("stopped"))
    try:
        with pytest.raises(ConfigError, match="the custom loop called strategy.run before distributing a dataset"):
            strategy.run(lambda: None)
    finally:
        capture.restore()
    assert "run" not in vars(strategy)


def test_a_custom_loop_whose_step_reaches_two_models_is_refused() -> None:
    first, second = plants.BUILDERS["none"](), plants.BUILDERS["none"]()

    def step(batch: object) -> object:
        return first(batch) + second(batch)

    strategy = tf.distribute.get_strategy()
    capture = LoopCapture(strategy, stop=lambda loop, data: pytest.fail("stopped"))
    try:
        strategy.experimental_distribute_dataset(tf.data.Dataset.range(2).batch(1))
        with pytest.raises(ConfigError, match=r"reaches 2 Keras models through its globals and closure; the doctor "
                                              r"compares a loop that trains one model \(received \['Sequential', "
                                              r"'Sequential'\]\)"):
            strategy.run(step)
    finally:
        capture.restore()


def test_a_distributed_dataset_is_refused_for_its_dataset_fn() -> None:
    made = tfaccel.get_strategy("mirrored").experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(
        plants.data()).batch(16))
    with pytest.raises(ConfigError, match=r"doctor: x is a tf.distribute.DistributedDataset, which one strategy made; "
                                          r"give fit the dataset_fn\(input_context\) that makes it"):
        tfaccel.doctor(plants.BUILDERS["none"], made, steps=1)


class _Batches(keras.utils.PyDataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> tuple:
        return plants.data(16)


def test_a_py_dataset_is_refused_with_what_the_doctor_takes() -> None:
    with pytest.raises(ConfigError, match=r"doctor: data must be arrays, a batched tf.data.Dataset or a "
                                          r"dataset_fn\(input_context\); received a keras.utils.PyDataset"):
        tfaccel.doctor(plants.BUILDERS["none"], _Batches(), steps=1)
