"""A new user's first launches (issue 33) as real processes: the getting-started script on 2 workers says little and
only what is true; forgetting `with tfaccel.scope()` is one line per worker about that mistake."""

import re
import sys

from launch_util import SCRIPTS, Launcher, wait_gone

import harness

PY = sys.executable
MAX_LINES_PER_WORKER = 15


def _launch(*cmd: str, timeout: float = 240):
    with Launcher("--workers", "2", "--timeout", str(timeout), "--", PY, *cmd) as launcher:
        rc = launcher.wait(timeout=timeout + 30)
    assert not wait_gone(launcher.all_pids()), "a process outlived the launcher"
    return rc, launcher


def _worker_lines(launcher: Launcher, index: int) -> list:
    prefix = f"[worker {index}] "
    return [line[len(prefix):] for line in (launcher.stdout + launcher.stderr).splitlines() if line.startswith(prefix)]


def test_the_getting_started_script_on_two_workers_says_little_and_true(clean_tf_config, tmp_path):
    page = (harness.REPO_ROOT / "docs" / "getting-started.md").read_text()
    script = tmp_path / "train.py"
    script.write_text(re.search(r"```python\n(.*?)```", page, re.S).group(1))
    rc, launcher = _launch(str(script))
    assert rc == 0, launcher.stderr[-3000:]
    for index in range(2):
        lines = _worker_lines(launcher, index)
        assert 3 <= len(lines) <= MAX_LINES_PER_WORKER, lines
        text = "\n".join(lines)
        assert "absl::InitializeLog" not in text and "oneDNN" not in text and "eagerly has significant" not in text
        assert "drew seed" not in text  # verbose=0
        assert "multi-step loop" in lines[-1]  # the script's own prints: plan, history, loop
    assert "TensorFlow's start-up banners left out (--tf-logs shows them)" in launcher.stderr


def test_a_model_built_outside_the_scope_is_one_line_per_worker_about_that(clean_tf_config):
    rc, launcher = _launch(str(SCRIPTS / "no_scope.py"))
    assert rc == 2  # a ConfigError: exit 2, which the launcher never restarts
    # the first worker to fail ends the job, so the other may be stopped before it says anything: at most one line
    # each, and at least one worker's line
    said = [_worker_lines(launcher, index) for index in range(2)]
    assert all(len(lines) <= 1 for lines in said) and any(said), said
    for lines in filter(None, said):
        assert lines[0].startswith(f"tfaccel.ConfigError at {SCRIPTS / 'no_scope.py'}:11: fit: the model was built "
                                   "outside tfaccel.scope(), but this process's strategy 'multi_worker' (TF_CONFIG "
                                   "describes 2 tasks (worker x2) without ps tasks) must be set up before TensorFlow "
                                   "runs"), lines
    assert "Traceback" not in launcher.stderr and "Collective ops must be configured" not in launcher.stderr


NOISY = ("import sys; print('WARNING: All log messages before absl::InitializeLog() is called are written to STDERR', "
         "file=sys.stderr); print('the job failed', file=sys.stderr); sys.exit(3)")


def test_tensorflows_banners_are_left_out_unless_asked(clean_tf_config):
    for extra, shown in (((), False), (("--tf-logs",), True)):
        with Launcher("--workers", "1", "--timeout", "60", *extra, "--", PY, "-c", NOISY) as launcher:
            rc = launcher.wait(timeout=90)
        assert rc == 3 and "[worker 0] the job failed" in launcher.stderr
        assert ("[worker 0] WARNING: All log messages before absl" in launcher.stderr) is shown
        tail = launcher.stderr.split("Last lines of worker:0:")[1]  # the failure report's tail of the task
        assert "the job failed" in tail and ("absl::InitializeLog" in tail) is shown
