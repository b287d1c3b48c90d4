"""Measured peaks: the GPU path with an injected device list and memory reader, the CPU child process for real."""

import pytest

from tfaccel.errors import ConfigError
from tfaccel.memory.bench import format_bench
from tfaccel.memory.measure import measure_cpu_step, measure_device_peak, read_proc_status


def test_device_peak_resets_runs_then_reads_each_gpu():
    calls = []
    peaks = {"GPU:0": 0, "GPU:1": 0}

    def reset(device):
        calls.append(("reset", device))
        peaks[device] = 0

    def step():
        calls.append(("step",))
        peaks["GPU:0"], peaks["GPU:1"] = 5 * 2 ** 20, 7 * 2 ** 20

    def info(device):
        calls.append(("read", device))
        return {"current": 1, "peak": peaks[device]}

    out = measure_device_peak(step, devices=["GPU:0", "GPU:1"], memory_info=info, reset=reset)
    assert out == {"GPU:0": 5 * 2 ** 20, "GPU:1": 7 * 2 ** 20}
    assert calls == [("reset", "GPU:0"), ("reset", "GPU:1"), ("step",), ("read", "GPU:0"), ("read", "GPU:1")]


def test_no_gpu_means_no_device_peaks():
    assert measure_device_peak(lambda: None, devices=[], memory_info=lambda d: {}, reset=lambda d: None) == {}


def test_proc_status_reads_rss_and_high_water_mark():
    status = read_proc_status()
    assert 0 < status["VmRSS"] <= status["VmHWM"]


def test_cpu_step_in_a_child_process():
    out = measure_cpu_step("mlp", batch_size=32, steps=1, timeout_s=240)
    assert out["baseline"] > 0 and out["peak"] >= out["rest"] > out["baseline"]
    assert out["process_peak"] == out["peak"] - out["baseline"] and len(out["step_seconds"]) == 1
    assert out["process_hwm"] >= out["peak"]  # the whole life of the child, warm-up included
    assert out["allocator_peak"] > 4 * 101770 * 4  # at least the MLP's weights, gradients and Adam slots
    assert out["device_peaks"] == {}


def test_failed_child_is_a_config_error_with_its_last_lines():
    with pytest.raises(ConfigError, match=r"memory measurement of 'mlp' \(batch 4\) failed with exit code 1: .*"
                                          r"recompute blocks='auto': model 'mlp' has no layers named like blocks"):
        measure_cpu_step("mlp", batch_size=4, recompute="auto", timeout_s=240)


def test_bench_tables():
    mib = 2 ** 20
    rec = {"model": "resnet50", "input_shape": [224, 224, 3], "batch_size": 16,
           "activation_bytes": {"allocator_peak": {"plain": 1000 * mib, "auto": 500 * mib, "all": 400 * mib},
                                "process_peak": {"plain": 2000 * mib, "auto": 1500 * mib, "all": 1000 * mib}},
           "activation_reduction": {"allocator_peak": {"auto": 0.5, "all": 0.6},
                                    "process_peak": {"auto": 0.25, "all": 0.5}},
           "step_seconds": {"plain": 2.0, "auto": 2.5, "all": 3.0}, "step_time_increase": {"auto": 0.25, "all": 0.5}}
    rows = [{"model": "mlp", "input_shape": [8], "batch_size": 4, "estimate_bytes": 110 * mib,
             "allocator_peak_bytes": 100 * mib, "process_base_bytes": 700 * mib, "process_estimate_bytes": 790 * mib,
             "process_peak_bytes": 800 * mib, "error_allocator": 0.1, "error_process": -0.0125}]
    text = format_bench(rec, rows)
    assert "| activations, TF allocator (MiB) | 1000 | 500 (-50%) | 400 (-60%) |" in text
    assert "| activations, process RSS (MiB) | 2000 | 1500 (-25%) | 1000 (-50%) |" in text
    assert "| step time (s) | 2.00 | 2.50 (+25%) | 3.00 (+50%) |" in text
    assert "| mlp | (8,) | 4 | 110 | 100 | +10% | 700 | 790 | 800 | -1% |" in text


def test_side_by_side_timing_runs_each_setting_the_same_number_of_steps():
    from tfaccel.memory.measure import time_side_by_side

    out = time_side_by_side("resnet20", batch_size=8, input_shape=(16, 16, 3), recompute=(None, "all"), steps=2)
    assert set(out) == {"None", "all"} and all(len(v) == 2 and min(v) > 0 for v in out.values())


def test_bench_timing_line_without_the_memory_part():
    timing = {"steps": 4, "step_seconds": {"plain": 1.0, "auto": 1.2, "all": 1.5},
              "step_time_increase": {"auto": 0.2, "all": 0.5}}
    assert format_bench(None, [], timing) == ("side-by-side step time (s, median of 4): plain 1.00, auto 1.20, "
                                              "all 1.50; auto +20%, all +50%\n")


def test_allocator_statistics_unavailable_says_why():
    from tfaccel.memory.measure import allocator_stats_unavailable

    def refuse(device: str) -> None:
        raise ValueError(f"Cannot reset memory stats for device '{device}'")

    reason = allocator_stats_unavailable(refuse)
    assert reason.startswith("TensorFlow keeps no allocator statistics for CPU:0 in this process (Cannot reset ")
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in reason
    assert allocator_stats_unavailable(lambda device: None) is None


def test_child_environment_asks_for_the_bfc_allocator_unless_the_caller_chose(monkeypatch):
    from tfaccel.memory.measure import child_environment

    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    assert child_environment()["TF_CPU_ALLOCATOR_USE_BFC"] == "true"
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "false")
    assert child_environment()["TF_CPU_ALLOCATOR_USE_BFC"] == "false"


def test_the_memory_bench_refuses_a_run_without_an_allocator_peak():
    from tfaccel.memory.bench import estimate_benchmark

    run = {"allocator_peak": None, "allocator_peak_unavailable": "no statistics here", "process_hwm": 1,
           "baseline": 1}
    with pytest.raises(ConfigError, match="memory bench: the measuring child read no CPU allocator peak: no "
                                          "statistics here"):
        estimate_benchmark([("mlp", (8,), 4)], measured={("mlp", 4): run})
