"""`tfaccel memory`: JSON shape, the table, and one-line errors (exit 2) that name the flag and the valid values."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tfaccel.cli.memory import format_table


RECOMMENDER = str(Path(__file__).resolve().parents[2] / "models" / "recommender.py")


def _cli(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfaccel", "memory", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_json_breakdown_of_a_reference_model():
    proc = _cli("--model", "resnet20", "--batch-size", "8", "--precision", "mixed_float16", "--input-shape",
                "16,16,3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == "resnet20" and out["precision"] == "mixed_float16" and out["per_replica_batch"] == 8
    for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes", "total_bytes",
                "activation_bytes_recompute", "total_bytes_recompute"):
        assert isinstance(out[key], int) and out[key] > 0, key
    assert out["recompute_blocks"][0] == "stage1_block1" and out["activation_bytes_recompute"] < out["activation_bytes"]
    assert out["total_bytes"] == (out["parameter_bytes"] + out["gradient_bytes"] + out["optimizer_bytes"]
                                  + out["activation_bytes"])
    # both peaks: the device (allocator) one, and the CPU process's (measured at batch 1 + the traced batch part)
    assert out["device_peak_bytes"] == out["total_bytes"]
    assert out["process_peak_bytes"] == (out["process_base_bytes"] + out["activation_bytes"]
                                         - out["activation_bytes_base"])
    assert out["process_base_bytes"] > 200 * 2 ** 20  # at least the interpreter and the TensorFlow runtime
    assert 0 < out["activation_bytes_base"] < out["activation_bytes"]


def test_table_under_parameter_server_without_recompute():
    proc = _cli("--model", "mlp", "--batch-size", "16", "--strategy", "parameter_server", "--num-ps", "2",
                "--replicas", "2", "--recompute", "none")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "mlp: batch 16 (2 replica(s), parameter_server), float32"
    names = [line.split("  ")[1].strip() for line in lines[1:]]
    assert names[:5] == ["parameters", "gradients", "optimizer slots", "activations", "total per replica"]
    assert any(line.strip().startswith("ps:1") for line in lines) and "recompute" not in proc.stdout
    assert "process peak" not in proc.stdout  # "auto": a PS worker's process is not estimated


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp16"], "--precision: unknown value 'fp16'; valid values are: 'float32', 'mixed_float16', "
                              "'mixed_bfloat16'"),
    (["--strategy", "nccl"], "--strategy: unknown value 'nccl'; valid values are: 'auto', 'default'"),
    (["--optimizer", "adamm"], "--optimizer: unknown value 'adamm'; valid values are: 'adam'"),
    (["--recompute", "yes"], "--recompute: unknown value 'yes'; valid values are: 'auto', 'all', 'none'"),
    (["--process-peak", "on"], "--process-peak: unknown value 'on'; valid values are: 'auto', 'yes', 'no'"),
    (["--batch-size", "0"], "--batch-size: must be a positive integer; received '0'"),
    (["--batch-size", "8.5"], "--batch-size: must be a positive integer; received '8.5'"),
    (["--replicas", "x"], "--replicas: must be a positive integer; received 'x'"),
    (["--input-shape", "224,a"], "--input-shape: expected positive integers separated by commas, e.g. 224,224,3; "
                                 "received '224,a'"),
    (["--model", "resnet51"], "--model: unknown value 'resnet51'; valid values are: 'mnist_cnn', 'mlp', 'resnet20', "
                              "'resnet50', 'transformer'; did you mean 'resnet50'? Or give "
                              "path/to/file.py:build_model"),
    (["--model", "nowhere/net.py"], "model 'nowhere/net.py': file 'nowhere/net.py' not found"),
    (["--num-classes", "0"], "--num-classes: must be a positive integer; received '0'"),
])
def test_bad_input_is_one_line_naming_the_flag(args, message):
    base = {"--model": "mlp", "--batch-size": "8"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    proc = _cli(*[item for pair in base.items() for item in pair], timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfaccel memory: error: ") and message in lines[0], proc.stderr


def test_a_model_with_dict_inputs_is_estimated_and_measured_in_its_own_input_structure():
    """The recommender takes {"dense", "user", "item"}: the traced step and the child process's measured step both
    feed that dict (the child fed one tensor before and failed)."""
    proc = _cli("--model", f"{RECOMMENDER}:build_model", "--batch-size", "16", "--input-shape", "8",
                "--num-classes", "1", "--process-peak", "yes", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["parameters"] == 1_617_489 and out["activation_bytes"] > 0
    assert out["process_peak_bytes"] > out["process_base_bytes"] > 200 * 2 ** 20


def test_a_builder_that_refuses_its_arguments_is_a_one_line_error_with_the_fix():
    """The user's builder raises (the recommender predicts one probability, not 10 classes): no traceback, the
    arguments given and the flags that change them (TensorFlow, loaded by then, logs its start above)."""
    proc = _cli("--model", f"{RECOMMENDER}:build_model", "--batch-size", "8", "--input-shape", "8",
                "--process-peak", "no", timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"tfaccel memory: error: model: building '{RECOMMENDER}:build_model' with input_shape=(8,), num_classes=10 "
        "failed: ValueError: recommender num_classes: the model predicts one click probability; received 10; pass "
        "the input_shape and num_classes it takes (tfaccel memory: --input-shape, --num-classes)")


def test_estimate_error_from_the_library_is_one_line_too():
    proc = _cli("--model", "mlp", "--batch-size", "9", "--replicas", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("tfaccel memory: error: batch_size: the global batch 9 does not split evenly "
                                   "over 2 replicas; give a multiple of 2 (e.g. 8)")


def test_table_shows_measured_peaks():
    report = {"model": "m", "batch_size": 4, "replicas": 1, "strategy": "default", "precision": "float32",
              "parameters": 10, "parameter_bytes": 2 ** 20, "gradient_bytes": 2 ** 20, "optimizer_bytes": 2 ** 21,
              "optimizer": "adam", "activation_bytes": 2 ** 22, "per_replica_batch": 4, "total_bytes": 2 ** 23,
              "activation_bytes_recompute": None, "ps_shard_bytes": [], "measured": {"GPU:0": 3 * 2 ** 20}}
    text = format_table(report)
    assert "measured peak GPU:0" in text and "3.0 MiB" in text and "activations, recompute" not in text
    assert "process peak" not in text
    report.update(process_peak_bytes=700 * 2 ** 20, process_base_bytes=690 * 2 ** 20)
    line = next(line for line in format_table(report).splitlines() if "process peak (CPU)" in line)
    assert "700.0 MiB" in line and "measured at batch 1 (690 MiB) + traced activations" in line


def test_shard_optimizer_state_flag_estimates_each_replicas_share():
    proc = _cli("--model", "mlp", "--batch-size", "8", "--strategy", "mirrored", "--replicas", "2",
                "--shard-optimizer-state", "--recompute", "none", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    shares = report["optimizer_shard_bytes"]
    assert len(shares) == 2 and report["optimizer_bytes"] < sum(shares) < report["optimizer_bytes"] + 2 * 12
    assert report["total_bytes"] == (report["parameter_bytes"] + report["gradient_bytes"] + max(shares)
                                     + report["activation_bytes"])


def test_gradient_accumulation_flag_adds_the_sums_on_every_replica():
    proc = _cli("--model", "mlp", "--batch-size", "8", "--strategy", "mirrored", "--replicas", "2",
                "--shard-optimizer-state", "--gradient-accumulation-steps", "4", "--recompute", "none", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["accumulator_bytes"] == report["gradient_bytes"] + 8  # the mlp's variables are all trainable
    assert report["total_bytes"] == (report["parameter_bytes"] + report["gradient_bytes"]
                                     + max(report["optimizer_shard_bytes"]) + report["accumulator_bytes"]
                                     + report["activation_bytes"])
    table = _cli("--model", "mlp", "--batch-size", "8", "--gradient-accumulation-steps", "4", "--recompute", "none")
    assert table.returncode == 0, table.stderr
    assert re.search(r"gradient sums\s+[\d.]+ MiB  gradient accumulation: one per trainable variable", table.stdout)
    bad = _cli("--model", "mlp", "--batch-size", "8", "--gradient-accumulation-steps", "zero")
    assert bad.returncode == 2 and "--gradient-accumulation-steps" in bad.stderr and "Traceback" not in bad.stderr


def test_table_shows_the_sharded_optimizer_share():
    report = {"model": "m", "batch_size": 4, "replicas": 2, "strategy": "mirrored", "precision": "float32",
              "parameters": 10, "parameter_bytes": 2 ** 20, "gradient_bytes": 2 ** 20, "optimizer_bytes": 2 ** 21,
              "optimizer": "adam", "activation_bytes": 2 ** 22, "per_replica_batch": 2, "total_bytes": 2 ** 23,
              "activation_bytes_recompute": None, "ps_shard_bytes": [], "optimizer_shard_bytes": [2 ** 20, 2 ** 19]}
    lines = format_table(report).splitlines()
    assert lines[4].split() == ["optimizer", "slots,", "sharded", "1.0", "MiB", "the", "largest", "of", "2",
                                "replicas'", "shares", "(ZeRO-1);", "counted", "in", "the", "total"]


def test_process_peak_yes_under_mirrored_names_the_option():
    proc = _cli("--model", "mlp", "--batch-size", "8", "--strategy", "mirrored", "--replicas", "2",
                "--process-peak", "yes", "--recompute", "none")
    assert proc.returncode == 2 and "process_peak: estimated for one replica per process" in proc.stderr
    assert "received strategy='mirrored', replicas=2. Pass process_peak=False" in proc.stderr


def _env_without_allocator_choice(**extra: str) -> dict:
    """The caller's environment as on a fresh machine: no TF_CPU_ALLOCATOR_USE_BFC, and oneDNN off (TF turns
    oneDNN on by default only on some processors; without it TF's CPU allocator keeps no statistics)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_ENABLE_ONEDNN_OPTS")}
    return dict(env, TF_ENABLE_ONEDNN_OPTS="0", **extra)


def test_measure_works_where_the_cpu_allocator_keeps_no_statistics():
    """The child `tfaccel memory` starts gets the BFC allocator from tfaccel itself (a fresh machine failed with
    "Cannot reset memory stats for device 'CPU:0'" before): both peaks, and the measured allocator peak."""
    proc = subprocess.run([sys.executable, "-m", "tfaccel", "memory", "--model", "mlp", "--batch-size", "32",
                           "--json", "--measure"], capture_output=True, text=True, timeout=300, check=False,
                          env=_env_without_allocator_choice())
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["device_peak_bytes"] > 0 and out["process_peak_bytes"] > 200 * 2 ** 20
    assert out["measured"]["CPU allocator"] > 4 * 101770 * 4 and out["measured"]["CPU process"] > 200 * 2 ** 20
    assert out["measured_unavailable"] == {}


def test_an_allocator_without_statistics_is_reported_not_fatal():
    """A caller who turns the BFC allocator off explicitly keeps that choice: the allocator peak is null with the
    reason, the process peak is still measured, and the command exits 0."""
    proc = subprocess.run([sys.executable, "-m", "tfaccel", "memory", "--model", "mlp", "--batch-size", "8",
                           "--json", "--measure"], capture_output=True, text=True, timeout=300, check=False,
                          env=_env_without_allocator_choice(TF_CPU_ALLOCATOR_USE_BFC="false"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["measured"]["CPU allocator"] is None and out["measured"]["CPU process"] > 200 * 2 ** 20
    reason = out["measured_unavailable"]["CPU allocator"]
    assert "no allocator statistics for CPU:0" in reason and "received 'false'" in reason
    table = format_table(dict(out, measured_unavailable={"CPU allocator": "why"}))
    assert any(line.split() == ["measured", "peak", "CPU", "allocator", "n/a", "MiB", "why"]
               for line in table.splitlines())
