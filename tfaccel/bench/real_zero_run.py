"""``tfaccel bench --suite real --real-zero 2,4``: the ZeRO rows of the real suite, one child process per replica
count under mirrored (virtual CPUs), one launch of that many worker processes under multi_worker and of that many
Horovod ranks under horovod; each child measures unsharded and sharded side by side
(:mod:`tfaccel.bench.real_zero`)."""

import os
import subprocess
import sys
from typing import Any, Dict, List

from tfaccel.bench.config import BenchConfig, last_json
from tfaccel.errors import BackendUnavailableError, ConfigError
from tfaccel.launch import run_local
from tfaccel.launch.horovod import run_horovod

__all__ = ["ZERO_PATHS", "check_zero_config", "measure_real_zero", "format_real_zero"]

ZERO_PATHS = ("mirrored", "multi_worker", "horovod")


def check_zero_config(config: BenchConfig) -> None:
    """Replica counts of 2 or more, paths among :data:`ZERO_PATHS`.

    Raises:
        ConfigError: the first bad value, with what is valid.
    """
    for n in config.real_zero:
        if n < 2:
            raise ConfigError(f"--real-zero: replica count {n} is below 2 (sharding needs several replicas); "
                              "give counts such as 2,4")
    for path in config.real_paths:
        if path not in ZERO_PATHS:
            raise ConfigError(f"--real-zero with --real-paths {path!r}: the ZeRO rows run on {', '.join(ZERO_PATHS)}; "
                              f"pass --real-paths {','.join(ZERO_PATHS)}")


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    # The BFC allocator on CPU: its peak is what get_memory_info reads (it must be set before TensorFlow starts).
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TF_CPU_ALLOCATOR_USE_BFC": "true"})
    return env


def _child(config: BenchConfig, path: str, replicas: int) -> List[Dict[str, Any]]:
    cmd = [sys.executable, "-m", "tfaccel.bench.real_zero", ",".join(config.real_models), config.real_size,
           str(config.repeats)]
    if path == "multi_worker":
        result = run_local(cmd, workers=replicas, timeout=config.real_timeout, env=_env(), echo=False)
        if result.returncode != 0:
            raise RuntimeError(f"bench real zero multi_worker x{replicas}: exit {result.returncode}\n"
                               f"{result.tasks[0].stdout[-1500:]}")
        return [last_json(task.stdout) for task in result.tasks]
    if path == "horovod":  # rank 0 prints every rank's result
        result = run_horovod(replicas, cmd + ["horovod"], env=_env(), timeout=config.real_timeout, echo=False)
        if result.returncode != 0:
            raise RuntimeError(f"bench real zero horovod x{replicas}: exit {result.returncode}\n"
                               f"{result.tasks[0].stdout[-1500:]}")
        return last_json(result.tasks[0].stdout)["ranks"]
    proc = subprocess.run(cmd + [str(replicas)], capture_output=True, text=True, timeout=config.real_timeout,
                          env=_env())
    if proc.returncode != 0:
        raise RuntimeError(f"bench real zero mirrored x{replicas} failed:\n{proc.stderr[-1500:]}")
    return [last_json(proc.stdout)]


def measure_real_zero(config: BenchConfig) -> Dict[str, Any]:
    """``{"<path> x<N>": [one result per process]}`` for every path of ``config.real_paths`` and count of
    ``config.real_zero``; a row whose processes failed is ``{"error": what they printed last}`` and the others are
    still measured."""
    check_zero_config(config)
    rows: Dict[str, Any] = {}
    for path in config.real_paths:
        for n in config.real_zero:
            try:
                rows[f"{path} x{n}"] = _child(config, path, n)
            except (RuntimeError, subprocess.TimeoutExpired, BackendUnavailableError) as exc:  # Horovod not built
                rows[f"{path} x{n}"] = {"error": str(exc)[-2000:]}
    return rows


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / 2 ** 20:.2f}"


def format_real_zero(zero: Dict[str, Any]) -> List[str]:
    """One line per model, path and replica count: the step-time ratio, optimizer MiB per replica, allocator peaks."""
    lines = ["ZeRO rows: step time sharded / unsharded (median of rounds, each round side by side in one process); "
             "optimizer MiB per replica (measured | tfaccel memory's prediction); allocator peak MiB per process; "
             "bytes each replica sends per step"]
    for where, processes in zero.items():
        if "error" in processes:
            lines.append(f"  {where}: FAILED, {processes['error'].splitlines()[0]}")
            continue
        for model, row in processes[0]["rows"].items():
            last = {mode: [p["rows"][model]["runs"][mode][-1] for p in processes] for mode in ("unsharded", "sharded")}
            held = {mode: sorted(_mib(v) for run in runs for v in run["optimizer_bytes_per_replica"].values())
                    for mode, runs in last.items()}
            peaks = {mode: [_mib(run["allocator_peak_bytes"]) for run in runs] for mode, runs in last.items()}
            pred, sent = row["predicted"], row["predicted"]["bytes_per_step"]
            lines.append(
                f"  {model} {where}: ratio {row['ratio']:.2f} {row['ratios']}; optimizer MiB per replica unsharded "
                f"{held['unsharded']} | {_mib(pred.get('unsharded_optimizer_bytes'))}, sharded {held['sharded']} | "
                f"{sorted(_mib(v) for v in pred.get('sharded_optimizer_bytes', []))}; allocator peak unsharded "
                f"{peaks['unsharded']}, sharded {peaks['sharded']}; sent per step {sent['unsharded']['total']:,} B "
                f"unsharded, {sent['sharded']['total']:,} B sharded; load {row['load_average']}")
    return lines
