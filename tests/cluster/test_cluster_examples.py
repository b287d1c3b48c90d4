"""Every file in tf_config/ gets its verdict; `tfaccel tf-config` output is what TensorFlow's resolver accepts."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple

import pytest
import yaml

from tfaccel.cli.main import main
from tfaccel.cluster import ClusterConfigError, ClusterSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "tf_config"
SUFFIXES = (".yaml", ".yml", ".json")

# Every invalid example and the field + problem its one-line message must name.
INVALID = {
    "bad_json.json": "not valid JSON: Expecting value at line 1 column 29",
    "bad_port.yaml": 'worker[1] "localhost:99999": port must be 1-65535',
    "bare_number.yaml": 'worker[0] 2222: must be a "host:port" string, got int',
    "capitalised_role.yaml": "role \"Worker\": unknown role; valid roles are chief, worker, ps, evaluator "
                             "(roles are lowercase: write 'worker')",
    "duplicate_address.yaml": 'worker[0] "10.0.0.1:2222": duplicate address, already used by chief[0]',
    "duplicate_key.yaml": "worker (line 2): key given twice",
    "empty_cluster.yaml": "the cluster is empty",
    "empty_host.yaml": 'worker[0] ":2222": host is empty',
    "master_and_chief.yaml": "master: both 'master' and 'chief' are given",
    "missing_port.yaml": 'worker[0] "10.0.0.2": port is missing',
    "not_a_list.yaml": 'worker "10.0.0.2:2222": must be a list of "host:port" strings',
    "ps_without_worker.yaml": "ps ['10.0.0.4:2222']: parameter servers need at least one worker",
    "task_index_out_of_range.json": 'task "worker:2": task index out of range',
    "two_chiefs.yaml": "chief ['10.0.0.1:2222', '10.0.0.5:2222']: at most one chief is allowed, got 2",
    "unknown_key.json": '"tasks": unknown key; valid keys of a TF_CONFIG document are cluster, task',
    "unknown_role.yaml": "role \"workers\": unknown role; valid roles are chief, worker, ps, evaluator; "
                         "did you mean 'worker'?",
    "yaml_boolean.yaml": 'worker[1] False: must be a "host:port" string, got bool (YAML reads off/on/yes/no',
}


def _files(folder: Path) -> List[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in SUFFIXES)


VALID_FILES = _files(EXAMPLES)
INVALID_FILES = _files(EXAMPLES / "invalid")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _tasks_of_valid_examples() -> List[Tuple[str, str]]:
    return [(_rel(p), f"{r}:{i}") for p in VALID_FILES for r, i in ClusterSpec.from_file(p).tasks()]


def test_the_example_folders_are_complete() -> None:
    assert len(VALID_FILES) >= 5 and (EXAMPLES / "README.md").is_file()
    assert {p.name for p in INVALID_FILES} == set(INVALID), "every invalid example needs an expected message"


@pytest.mark.parametrize("path", VALID_FILES, ids=lambda p: p.name)
def test_valid_examples_load(path: Path) -> None:
    spec = ClusterSpec.from_file(path)
    assert spec.tasks()
    assert spec.strategy_hint in ("local", "multi_worker", "parameter_server")


@pytest.mark.parametrize("path", INVALID_FILES, ids=lambda p: p.name)
def test_invalid_examples_fail_with_one_line_naming_file_and_field(path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ClusterConfigError) as info:
        ClusterSpec.from_file(path)
    assert INVALID[path.name] in str(info.value)
    monkeypatch.chdir(REPO)
    assert main(["tf-config", _rel(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = [line for line in err.splitlines() if not line.startswith("tfaccel WARNING")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tfaccel tf-config: error: cluster file {_rel(path)}: ")
    assert INVALID[path.name] in lines[0]


@pytest.mark.parametrize("path, task", _tasks_of_valid_examples())
def test_cli_json_is_what_tf_config_cluster_resolver_accepts(path: str, task: str, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    import tensorflow as tf

    monkeypatch.chdir(REPO)
    assert main(["tf-config", path, "--task", task, "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    spec = ClusterSpec.from_file(path)
    role, index = task.split(":")
    assert doc["task"] == {"type": role, "index": int(index)}
    assert doc["cluster"] == {r: list(a) for r, a in spec.roles.items()}

    monkeypatch.setenv("TF_CONFIG", out.strip())
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert resolver.task_type == role and resolver.task_id == int(index)
    assert resolver.cluster_spec().as_dict() == doc["cluster"]
    assert resolver.cluster_spec().task_address(role, int(index)) == spec.address(task)


def test_cli_all_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(REPO)
    assert main(["tf-config", "tf_config/chief_workers_ps.yaml", "--all"]) == 0
    docs = json.loads(capsys.readouterr().out)
    spec = ClusterSpec.from_file("tf_config/chief_workers_ps.yaml")
    assert docs == {f"{r}:{i}": spec.tf_config((r, i)) for r, i in spec.tasks()}


def test_cli_summary_and_file_default_task(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(REPO)
    assert main(["tf-config", "tf_config/two_workers.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tf_config/two_workers.yaml: valid; 2 task(s): worker:0 10.0.0.2:2222")
    assert "--task ROLE:INDEX (one of: worker:0 worker:1)" in out
    assert main(["tf-config", "tf_config/tfjob_tf_config.json"]) == 0  # a TF_CONFIG document names its task
    doc = json.loads(capsys.readouterr().out)
    assert doc["task"] == {"type": "worker", "index": 1} and doc["environment"] == "cloud"


@pytest.mark.parametrize("argv, expected", [
    (["tf_config/two_workers.yaml", "--task", "ps:0"], "cluster file tf_config/two_workers.yaml: task \"ps:0\": "
                                                       "the cluster has no 'ps' role"),
    (["tf_config/two_workers.yaml", "--task", "worker:5"], "task index out of range"),
    (["tf_config/nope.yaml"], "cluster file tf_config/nope.yaml: no such file"),
    (["--task", "worker:0"], "FILE: no cluster description given and no source describes one here (TF_CONFIG, a JobSet"),
    (["tf_config/one_host.yaml", "--", "python"], "command after -- 'python': only used with --tfjob"),
    (["tf_config/one_host.yaml", "--tfjob", "x"], "--tfjob 'x': needs --image IMG"),
    (["tf_config/one_host.yaml", "--tfjob", "x", "--image", "i", "--format", "env"],
     "--format 'env': does not apply to --tfjob"),
    (["tf_config/one_host.yaml", "--image", "i"], "--image / --namespace: only used with --tfjob NAME"),
    (["tf_config/one_host.yaml", "--tfjob", "Bad", "--image", "i"], "tfjob name 'Bad': must be a DNS-1123 label"),
])
def test_cli_errors_are_one_line_exit_2(argv: List[str], expected: str, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture, clean_tf_config: None) -> None:
    monkeypatch.chdir(REPO)
    assert main(["tf-config", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("tfaccel tf-config: error: ")
    assert expected in err


def test_cli_reads_slurm_when_no_file(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                      clean_tf_config: None) -> None:
    for key, value in {"SLURM_PROCID": "1", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "1(x2)",
                       "SLURM_STEP_ID": "0"}.items():
        monkeypatch.setenv(key, value)
    assert main(["tf-config", "--slurm-port", "2345"]) == 0
    assert json.loads(capsys.readouterr().out) == {"cluster": {"worker": ["node01:2345", "node02:2345"]},
                                                   "task": {"type": "worker", "index": 1}}
    assert main(["tf-config", "--slurm-ps", "1", "--all"]) == 2
    assert "parameter-server training needs a chief" in capsys.readouterr().err


# ---- real subprocesses: the installed command, a real shell ---------------------------------------------

def _tfaccel(*args: str, env: dict = None) -> subprocess.CompletedProcess:  # type: ignore[assignment]
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("SLURM_")}
    return subprocess.run([sys.executable, "-m", "tfaccel", "tf-config", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=dict(base, **(env or {})))


def test_subprocess_json_and_no_tensorflow_import() -> None:
    start = time.monotonic()
    proc = _tfaccel("tf_config/chief_workers_ps.yaml", "--task", "ps:1")
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["task"] == {"type": "ps", "index": 1}
    assert elapsed < 10, f"tfaccel tf-config took {elapsed:.1f}s"
    probe = subprocess.run([sys.executable, "-c", "import sys, tfaccel.cli.tf_config, tfaccel.cluster; "
                            "from tfaccel.cli.main import build_parser; build_parser(); "
                            "print('tensorflow' in sys.modules)"], capture_output=True, text=True, timeout=60,
                           cwd=REPO)
    assert probe.stdout.strip() == "False", probe.stderr


def test_subprocess_invalid_file_one_line_no_traceback() -> None:
    proc = _tfaccel("tf_config/invalid/bad_port.yaml", "--task", "worker:0")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == ('tfaccel tf-config: error: cluster file tf_config/invalid/bad_port.yaml: worker[1] '
                           '"localhost:99999": port must be 1-65535\n')


def test_subprocess_env_format_is_safe_to_eval() -> None:
    for path in ("tf_config/with_evaluator.yaml", "tf_config/tfjob_tf_config.json"):
        spec = ClusterSpec.from_file(REPO / path)
        for role, index in spec.tasks():
            script = (f'eval "$({sys.executable} -m tfaccel tf-config {path} --task {role}:{index} --format env)"'
                      ' && printf "%s" "$TF_CONFIG"')
            proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout) == spec.tf_config((role, index))


def test_env_format_quotes_single_quotes(tmp_path: Path) -> None:
    # No valid address holds a quote, but the environment string might: it must survive eval intact.
    from tfaccel.cli.tf_config import _env_line

    doc = {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}, "environment": "it's $(x) `y`"}
    proc = subprocess.run(["bash", "-c", _env_line(doc) + '; printf "%s" "$TF_CONFIG"'], capture_output=True,
                          text=True, timeout=30)
    assert json.loads(proc.stdout) == doc


def test_subprocess_all_env_and_slurm_eval() -> None:
    proc = _tfaccel("tf_config/two_workers.yaml", "--all", "--format", "env")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "# worker:0" and lines[2] == "# worker:1"
    assert all(line.startswith("export TF_CONFIG='") for line in lines[1::2])
    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "gpu[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
             "TFACCEL_SLURM_PORT": "4000"}
    script = f'eval "$({sys.executable} -m tfaccel tf-config --format env)" && printf "%s" "$TF_CONFIG"'
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=dict({k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **slurm))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cluster"] == {"worker": ["gpu1:4000", "gpu1:4001", "gpu2:4000", "gpu2:4001"]}


def test_subprocess_tfjob_manifest() -> None:
    proc = _tfaccel("tf_config/chief_workers_ps.yaml", "--tfjob", "mnist", "--image", "tensorflow/tensorflow:2.21.0",
                    "--namespace", "ml", "--", "python", "scripts/train.py", "--epochs", "3")
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(proc.stdout)
    assert manifest["metadata"] == {"name": "mnist", "namespace": "ml"}
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Chief": 1, "Worker": 2, "PS": 2}
    for replica in replicas.values():
        assert replica["restartPolicy"] == "OnFailure"
        container = replica["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "scripts/train.py", "--epochs", "3"]
        assert container["image"] == "tensorflow/tensorflow:2.21.0"
