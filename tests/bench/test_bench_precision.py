"""tfaccel bench P5 (precision and XLA "auto" / float32 without XLA) on CPU with a tiny model: the report's shape,
both contenders timed by the one Stopwatch in the seeded order, what precision and XLA each got; the skip path
(``p5_precision_xla: null`` with a reason); the CLI's check of --p5."""

import json
import subprocess
import sys

import pytest

import harness
from tfaccel.bench import TARGETS, BenchConfig, format_report, run_bench
from tfaccel.bench.config import round_order
from tfaccel.bench.precision import P5_CONTENDERS, check_p5_mode, p5_skip_reason
from tfaccel.errors import ConfigError

FIGURE = {"median", "min", "max"}


def _gpus() -> list:
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


def test_p5_on_runs_both_contenders_with_one_timer_on_cpu(tmp_path):
    config = BenchConfig(repeats=2, epochs=3, models=(), scaling=False, stream=False, p5="on", p5_model="mnist_cnn",
                         p5_examples=256, p5_batch=64, p5_input_shape=(28, 28, 1), p5_classes=10, seed=3)
    report = run_bench(config, json_path=str(tmp_path / "p5.json"), png_path=str(tmp_path / "p5.png"))
    on_disk = json.loads((tmp_path / "p5.json").read_text())
    fig = on_disk["p5_precision_xla"]
    assert set(fig) == FIGURE and 0 < fig["min"] <= fig["median"] <= fig["max"]
    part = on_disk["precision"]
    assert len(part["p5_precision_xla"]["values"]) == 2 and "p5_skipped" not in on_disk
    eps = {c: v["values"] for c, v in part["examples_per_sec"].items()}
    assert part["p5_precision_xla"]["values"] == pytest.approx(
        [a / f for a, f in zip(eps["precision_xla_auto"], eps["float32_noxla"])])

    # One helper timed both contenders in every round, in the seeded order the report records.
    assert part["order"] == [round_order(list(P5_CONTENDERS), seed=3, group="precision", round_index=r)
                             for r in range(2)]
    assert on_disk["timing"]["timed"] == [c for order in part["order"] for c in order]
    assert set(on_disk["time_to_train"]["precision"]) == set(P5_CONTENDERS)
    assert all(set(f) == FIGURE and f["median"] > 0 for f in on_disk["time_to_train"]["precision"].values())

    # What each contender got: on CPU "auto" is float32, and XLA is off for convolutions (and off when asked).
    auto, f32 = part["details"]["precision_xla_auto"], part["details"]["float32_noxla"]
    assert auto["requested"] == {"precision": "auto", "jit_compile": "auto"}
    assert f32["requested"] == {"precision": "float32", "jit_compile": False}
    for got in (auto, f32):
        assert got["precision"] == "float32" and got["dtype_policy"] == "float32" and got["jit_compile"] is False
    assert part["model"] == "mnist_cnn" and part["input_shape"] == [28, 28, 1] and part["global_batch_size"] == 64
    if not _gpus():
        assert part["devices"]["gpus"] == [] and any("CPU" in d for d in part["devices"]["logical"])
        assert on_disk["p5_note"].startswith("no GPU: precision 'auto' resolved to float32")
        assert f"  P5: {on_disk['p5_note']}" in format_report(report) and "on no GPU (CPU):" in format_report(report)
    assert on_disk["targets"]["p5_precision_xla"] == TARGETS["p5_precision_xla"] == 2.5
    text = format_report(report)
    assert "P5 precision+XLA auto / float32 no XLA (GPU only): " in text and "target >= 2.5" in text
    assert "precision_xla_auto: float32, jit_compile False" in text
    assert (tmp_path / "p5.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_p5_skipped_gives_null_and_reason(tmp_path):
    mode = "off" if _gpus() else "auto"  # on this GPU-less machine: the "auto" path
    report = run_bench(BenchConfig(repeats=1, models=(), scaling=False, stream=False, p5=mode),
                       png_path=str(tmp_path / "skip.png"))
    assert report["p5_precision_xla"] is None and "precision" not in report
    assert report["p5_skipped"].startswith("off: " if mode == "off" else "no GPU: ")
    assert report["timing"]["timed"] == []
    text = format_report(report)
    assert f"(GPU only): not measured ({report['p5_skipped']}); target >= 2.5 (GPU only)" in text
    assert (tmp_path / "skip.png").exists()
    assert p5_skip_reason("auto", []).startswith("no GPU: ") and p5_skip_reason("off", ["GPU:0"]).startswith("off: ")
    assert p5_skip_reason("auto", ["/physical_device:GPU:0"]) is None and p5_skip_reason("on", []) is None


def test_p5_mode_checked_in_library_and_cli():
    with pytest.raises(ConfigError, match=r"p5: unknown value 'sometimes'; valid values are: 'auto', 'on', 'off'"):
        run_bench(BenchConfig(models=(), scaling=False, stream=False, p5="sometimes"))
    assert check_p5_mode("on") == "on"
    proc = subprocess.run([sys.executable, "-m", "tfaccel", "bench", "--p5", "yes"], capture_output=True,
                          text=True, timeout=120, cwd=str(harness.REPO_ROOT))
    assert proc.returncode == 2
    assert "--p5: unknown value 'yes'; valid values are: 'auto', 'on', 'off'" in proc.stderr, proc.stderr
