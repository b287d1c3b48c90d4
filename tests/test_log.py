import json

import pytest

from tfaccel.log import configure_logging, is_chief


def _emit(capsys, **kwargs):
    logger = configure_logging(**kwargs)
    logger.info("hello")
    logger.warning("careful")
    err = capsys.readouterr().err
    configure_logging()  # back to defaults for other tests
    return err


@pytest.mark.parametrize("cluster,task,chief", [
    ({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 0}, True),
    ({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 1}, False),
    ({"chief": ["c:1"], "worker": ["a:1"]}, {"type": "worker", "index": 0}, False),
    ({"chief": ["c:1"], "worker": ["a:1"]}, {"type": "chief", "index": 0}, True),
])
def test_chief_detection(monkeypatch, cluster, task, chief):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    assert is_chief() is chief


def test_horovod_rank(monkeypatch, clean_tf_config):
    monkeypatch.setenv("HOROVOD_RANK", "1")
    assert is_chief() is False


def test_non_chief_prints_only_warnings_with_prefix(monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                                "task": {"type": "worker", "index": 1}}))
    monkeypatch.delenv("TFACCEL_OUTPUT_PREFIXED", raising=False)
    err = _emit(capsys)
    assert "hello" not in err and "[worker 1] tfaccel WARNING: careful" in err
    assert "[worker 1] tfaccel INFO: hello" in _emit(capsys, all_tasks=True)


def test_no_double_prefix_under_the_launcher(monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}))
    monkeypatch.setenv("TFACCEL_OUTPUT_PREFIXED", "1")
    assert "tfaccel INFO: hello" in _emit(capsys) and "[worker 0]" not in _emit(capsys)


def test_malformed_tf_config_does_not_break_logging(monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", "{broken")
    assert "tfaccel INFO: hello" in _emit(capsys)


def test_a_slurm_task_logs_as_its_rank_and_the_batch_script_as_the_chief(monkeypatch, capsys, clean_tf_config):
    """Inside srun (issue 38) rank 0 is the chief (worker 0, or the chief of a ps job); the others log warnings only,
    prefixed with their rank. The batch script (SLURM_PROCID=0, no step) is a single process."""
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert is_chief() is False
    err = _emit(capsys)
    assert "hello" not in err and "[rank 1] tfaccel WARNING: careful" in err
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert is_chief() is True
    monkeypatch.delenv("SLURM_STEP_ID")
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert is_chief() is True and "[" not in _emit(capsys).split("tfaccel")[0]
