"""tfaccel bench on tiny sizes: the report has the documented shape, and the figures are real ratios."""

import json
import subprocess
import sys

import pytest

import harness
from tfaccel.bench import TARGETS, BenchConfig, format_report, run_bench


def test_speedups_report_shape_and_files(tmp_path, clean_tf_config):
    config = BenchConfig(repeats=2, examples=256, epochs=2, models=("mlp",), scaling=False)
    report = run_bench(config, json_path=str(tmp_path / "b.json"), png_path=str(tmp_path / "b.png"))
    on_disk = json.loads((tmp_path / "b.json").read_text())
    for key in ("p1", "p2", "p3"):
        fig = on_disk[key]
        assert set(fig) == {"median", "min", "max"} and fig["min"] <= fig["median"] <= fig["max"] and fig["min"] > 0
    mlp = report["per_model"]["mlp"]
    eps = mlp["examples_per_sec"]
    for contender in ("compile_and_fit", "naive", "hand_tuned", "hand_xla_loop"):
        assert len(eps[contender]["values"]) == 2 and all(v > 0 for v in eps[contender]["values"])
    # p1 is computed per round from the same round's numbers, not from medians of different rounds.
    ratios = [c / n for c, n in zip(eps["compile_and_fit"]["values"], eps["naive"]["values"])]
    assert sorted(mlp["p1"]["values"]) == pytest.approx(sorted(ratios))
    assert on_disk["versions"]["tensorflow"] and on_disk["machine"]["cpus"] and on_disk["targets"] == TARGETS
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = format_report(report)
    assert "P1 compile_and_fit / naive fit:" in text and "target >= 6.0" in text


def test_scaling_figures_with_real_processes(clean_tf_config):
    config = BenchConfig(repeats=1, examples=128, epochs=2, models=("mlp",), scaling=True, scaling_examples=256,
                         scaling_batch=32)
    report = run_bench(config)
    assert 0 < report["scaling"]["p4_ceiling"]["median"] < 2.5
    for key in ("p4_mwms", "p4_horovod"):  # Horovod is built in CI (scripts/install_horovod.sh)
        assert 0 < report[key]["median"] < 2.5, report.get("scaling")


def test_cli_rejects_bad_repeats():
    proc = subprocess.run([sys.executable, "-m", "tfaccel", "bench", "--repeats", "0"], capture_output=True,
                          text=True, timeout=120, cwd=str(harness.REPO_ROOT))
    assert proc.returncode == 2 and "--repeats must be >= 1; received 0" in proc.stderr
