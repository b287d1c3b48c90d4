"""`tfaccel doctor --workers 2 -- python SCRIPT`: the N-replica run as 2 real worker processes (MultiWorkerMirrored,
started by tfaccel's launcher on loopback), each bounded by the CLI's timeout."""

import json
import os
import sys
from pathlib import Path

import pytest

import harness
from tfaccel.cli import doctor as doctor_cli_module
from tfaccel.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doctor_cli import CTL_SCRIPT, SCRIPT, run_doctor  # noqa: E402


def test_a_correct_custom_loop_is_equal_to_rounding_vs_2_worker_processes_as_json() -> None:
    done = run_doctor("--steps", "2", "--workers", "2", "--json", "--", "python", CTL_SCRIPT, "scaled")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["equal"] is True and report["ok"] is True and report["causes"] == []
    assert [(run["replicas"], run["strategy"]) for run in report["runs"]] == [
        (1, "default"), (2, "multi_worker, 2 processes")]
    assert report["verdict"]["tolerance"]["rtol"] == 2e-05
    assert "tfaccel INFO" not in done.stderr  # the launcher's lines are not the doctor's output


def test_an_unsharded_dataset_fn_is_named_with_2_worker_processes_and_plotted(tmp_path: Path) -> None:
    plot = tmp_path / "doctor.png"
    done = run_doctor("--steps", "2", "--workers", "2", "--plot", str(plot), "--", "python", SCRIPT, "unsharded",
                      env=harness.with_optional_imports(os.environ))  # the plot needs matplotlib
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "each run reading the dataset_fn" in done.stdout
    assert "the runs part at step 0: examples of the global batch: 8 of the 16 examples on 1 replica are not among " \
           "the 16 on 2" in done.stdout
    assert "likely cause: data-sharding-or-order: at step 0 the 2 replicas trained on 16 examples and one replica " \
           "on 16; 8 of the 16 are repeats: every input pipeline reads the same examples" in done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # written by the chief worker


def test_a_worker_run_past_its_timeout_is_one_error_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^doctor: the 2-worker run did not finish in 1 s \(--timeout\)$"):
        doctor_cli_module.run_workers(str(tmp_path), ["--steps", "1"], [SCRIPT, "none"], 2, 1)


def test_a_worker_that_fails_without_saying_why_is_one_error_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^doctor: the 2-worker \(worker:\d\) run failed \(exit 2\): .*"
                                          r"unrecognized arguments: --no-such-option$"):
        doctor_cli_module.run_workers(str(tmp_path), ["--steps", "1", "--no-such-option"], [SCRIPT, "none"], 2, 120)
