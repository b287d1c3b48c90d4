"""`tfaccel doctor -- python train.py`: real child processes on the unmodified script in tests/doctor/train.py."""

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

SCRIPT = str(Path(__file__).resolve().parent / "train.py")
HUB_SCRIPT = str(Path(__file__).resolve().parent / "hub_train.py")
CTL_SCRIPT = str(Path(__file__).resolve().parent / "ctl.py")


def _doctor(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfaccel", "doctor", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def _error_line(done: subprocess.CompletedProcess) -> str:
    lines: List[str] = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    return lines[0]


def test_a_correct_custom_loop_is_equal_to_rounding_vs_2_worker_processes_as_json() -> None:
    done = _doctor("--steps", "2", "--workers", "2", "--json", "--", "python", CTL_SCRIPT, "scaled")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["equal"] is True and report["ok"] is True and report["causes"] == []
    assert [(run["replicas"], run["strategy"]) for run in report["runs"]] == [
        (1, "default"), (2, "multi_worker, 2 processes")]
    assert report["verdict"]["tolerance"]["rtol"] == 2e-05
    assert "tfaccel INFO" not in done.stderr  # the launcher's lines are not the doctor's output


def test_a_custom_loop_that_does_not_scale_its_loss_is_named() -> None:
    done = _doctor("--steps", "2", "--", "python", CTL_SCRIPT, "unscaled")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "the runs part at step 0: log loss" in done.stdout
    assert "likely cause: loop-loss-not-scaled: the global gradient norm on 2 replicas is 2x one replica's at step 0 " \
           "in a custom training loop" in done.stdout
    assert "fix: in the loop's step, tf.nn.compute_average_loss(per_example_loss, global_batch_size=" in done.stdout


def test_an_unsharded_dataset_fn_is_named_with_2_worker_processes_and_plotted(tmp_path: Path) -> None:
    plot = tmp_path / "doctor.png"
    done = _doctor("--steps", "2", "--workers", "2", "--plot", str(plot), "--", "python", SCRIPT, "unsharded")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "each run reading the dataset_fn" in done.stdout
    assert "the runs part at step 0: examples of the global batch: 8 of the 16 examples on 1 replica are not among " \
           "the 16 on 2" in done.stdout
    assert "likely cause: data-sharding-or-order: at step 0 the 2 replicas trained on 16 examples, one replica on " \
           "16, 8 of them repeated: every input pipeline reads the same examples" in done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # written by the chief worker


def test_a_kerashub_model_with_a_planted_dropout_is_named_end_to_end_within_2_minutes() -> None:
    start = time.monotonic()
    done = _doctor("--steps", "2", "--nan", "--", "python", HUB_SCRIPT, "0.1", timeout=240)
    elapsed = time.monotonic() - start
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the runs part at step 0: log loss" in done.stdout
    assert "likely cause: random-ops-per-replica: random layers " in done.stdout
    assert "feedforward_dropout, self_attention_dropout, dropout" in done.stdout and "fix:" in done.stdout
    assert "NaN/Inf sentinel, 1 replica: no NaN/Inf in 2 steps" in done.stdout
    assert "NaN/Inf sentinel, 2 replicas: no NaN/Inf in 2 steps" in done.stdout
    assert elapsed < 120, f"{elapsed:.0f} s"


@pytest.mark.parametrize("plant, message", [
    ("nofit", "finished without calling model.fit(...), tfaccel.fit(model, ...) or strategy.run(...)"),
    ("crash", "crashed before calling fit: RuntimeError: planted crash (train.py:12)"),
])
def test_a_script_that_never_trains_is_one_error_line(plant: str, message: str) -> None:
    assert message in _error_line(_doctor("--steps", "2", "--", "python", SCRIPT, plant))


@pytest.mark.parametrize("args, message", [
    (["--steps", "0", "--", "python", SCRIPT], "--steps must be a whole number >= 1; received '0'"),
    (["--replicas", "1", "--", "python", SCRIPT], "--replicas must be a whole number >= 2; received '1'"),
    (["--rtol", "x", "--", "python", SCRIPT], "--rtol must be a number; received 'x'"),
    (["--workers", "1", "--", "python", SCRIPT], "--workers must be a whole number >= 2; received '1'"),
    (["--workers", "2", "--replicas", "2", "--", "python", SCRIPT], "--replicas and --workers: give one"),
    (["--strategy", "mirored", "--", "python", SCRIPT],
     "--strategy: unknown value 'mirored'; valid values are: 'mirrored', 'multi_worker'; did you mean 'mirrored'?"),
    (["--strategy", "mirrored", "--workers", "2", "--", "python", SCRIPT], "--strategy mirrored runs in one process"),
    (["--strategy", "multi_worker", "--", "python", SCRIPT], "--strategy multi_worker needs --workers W"),
    (["--plot", "out.txt", "--", "python", SCRIPT], "--plot must name a .png file; received 'out.txt'"),
    (["--plot", "/nonexistent/d.png", "--", "python", SCRIPT], "--plot '/nonexistent/d.png': folder '/nonexistent' "
                                                               "does not exist; make it first"),
    ([], "doctor needs the training command after `--`"),
    (["--", "python", "missing.py"], "doctor: script 'missing.py' not found"),
])
def test_bad_options_are_one_error_line_before_any_run(args: List[str], message: str) -> None:
    line = _error_line(_doctor(*args, timeout=60))
    assert line.startswith("tfaccel doctor: error: ") and message in line
