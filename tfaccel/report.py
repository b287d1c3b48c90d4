"""``tfaccel env``: a paste-ready description of this machine, its software and its cluster role."""

import importlib
import json
import os
import platform
import sys
from typing import Any, Dict, List, Optional, Tuple

from tfaccel._version import __version__

__all__ = ["env_report", "format_report"]


def _version_of(module: str) -> Optional[str]:
    try:
        return getattr(importlib.import_module(module), "__version__", "unknown")
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return None


def _horovod_report() -> Dict[str, Any]:
    try:
        import horovod  # noqa: F401
    except ImportError:
        return {"installed": False}
    info: Dict[str, Any] = {"installed": True, "version": getattr(horovod, "__version__", "unknown")}
    try:
        import horovod.tensorflow as hvd

        info.update(tensorflow_built=True, gloo_built=bool(hvd.gloo_built()), mpi_built=bool(hvd.mpi_built()),
                    nccl_built=bool(hvd.nccl_built()))
    except Exception as exc:  # noqa: BLE001 - a broken build is exactly what the report should show
        info.update(tensorflow_built=False, error=f"{type(exc).__name__}: {exc}")
    return info


def _tf_config_summary(raw: Optional[str]) -> Dict[str, Any]:
    if not raw:
        return {"set": False}
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
        cluster = doc.get("cluster") or {}
        task = doc.get("task") or {}
        if not isinstance(cluster, dict) or not isinstance(task, dict):
            raise ValueError("'cluster' and 'task' must be JSON objects")
        sizes = {role: len(addrs) for role, addrs in cluster.items()}
        return {"set": True, "valid": True, "task_type": task.get("type"), "task_index": task.get("index"),
                "roles": sizes, "num_tasks": sum(sizes.values()), "environment": doc.get("environment")}
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: nested thousands deep
        return {"set": True, "valid": False, "error": f"malformed TF_CONFIG: {str(exc)[:200]}", "received": raw[:200]}


def _devices_report() -> Dict[str, Any]:
    try:
        import tensorflow as tf
    except ImportError as exc:
        return {"error": f"TensorFlow is not installed: {exc}"}
    physical: List[Dict[str, Any]] = []
    for dev in tf.config.list_physical_devices():
        entry: Dict[str, Any] = {"name": dev.name, "type": dev.device_type}
        if dev.device_type == "GPU":
            try:
                details = tf.config.experimental.get_device_details(dev)
                entry["device_name"] = details.get("device_name")
                cap = details.get("compute_capability")
                entry["compute_capability"] = ".".join(map(str, cap)) if cap else None
            except Exception as exc:  # noqa: BLE001
                entry["details_error"] = str(exc)
        physical.append(entry)
    logical: List[Dict[str, Any]] = []
    try:
        for dev in tf.config.list_logical_devices():
            entry = {"name": dev.name, "type": dev.device_type}
            if dev.device_type == "GPU":
                try:
                    entry["memory_mb"] = round(tf.config.experimental.get_memory_info(dev.name)["peak"] / 2**20)
                except Exception:  # noqa: BLE001 - not every build reports memory
                    pass
            logical.append(entry)
    except RuntimeError as exc:
        logical = [{"error": str(exc)}]
    return {"physical": physical, "logical": logical}


def _auto_choices() -> Dict[str, Any]:
    """What strategy="auto", precision="auto" and jit_compile="auto" would pick here, when those exist."""
    try:
        plan_mod = importlib.import_module("tfaccel.plan")
    except ImportError:
        return {"strategy": None, "precision": None, "jit_compile": None, "note": "auto resolution not available"}
    try:
        return plan_mod.describe_auto()
    except Exception as exc:  # noqa: BLE001 - the report must never crash
        return {"error": f"{type(exc).__name__}: {exc}"}


def env_report() -> Dict[str, Any]:
    """Collects a report of this machine, its software, devices and cluster role.

    Returns:
        A JSON-serialisable dict with keys ``python``, ``platform``, ``tfaccel``, ``tensorflow``, ``keras``,
        ``numpy``, ``horovod``, ``devices``, ``tpu``, ``tf_config``, ``auto`` and ``local_network`` (whether
        ``tfaccel launch`` can run local clusters in a private loopback-only network namespace) and ``ray``
        (Ray's installed version, and this process's Ray Train worker rank when it trains under Ray Train).

    Example:
        >>> import tfaccel
        >>> tfaccel.env_report()["tensorflow"]["version"]  # doctest: +SKIP
        '2.21.0'
    """
    from tfaccel.devices import tpu_address_hint

    tf_info: Dict[str, Any] = {"version": _version_of("tensorflow")}
    if tf_info["version"]:
        import tensorflow as tf

        build = dict(tf.sysconfig.get_build_info())
        tf_info.update(built_with_cuda=bool(build.get("is_cuda_build")), cuda_version=build.get("cuda_version"),
                       cudnn_version=build.get("cudnn_version"))
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "tfaccel": __version__,
        "tensorflow": tf_info,
        "keras": _version_of("keras"),
        "numpy": _version_of("numpy"),
        "horovod": _horovod_report(),
        "devices": _devices_report() if tf_info["version"] else {"error": "TensorFlow is not installed"},
        "tpu": {"address_hint": tpu_address_hint(),
                "COLAB_TPU_ADDR": os.environ.get("COLAB_TPU_ADDR"), "TPU_NAME": os.environ.get("TPU_NAME")},
        "tf_config": _tf_config_summary(os.environ.get("TF_CONFIG")),
        "auto": _auto_choices(),
        "local_network": _local_network(),
        "ray": _ray_report(),
    }


def _ray_report() -> Dict[str, Any]:
    """Ray's installed version (not imported) and whether this process trains under Ray Train."""
    from importlib import metadata

    from tfaccel.integrations.ray_train import ray_context

    try:
        version: Optional[str] = metadata.version("ray")
    except metadata.PackageNotFoundError:
        version = None
    return {"version": version, "worker": ray_context()}


def _local_network() -> Dict[str, Any]:
    from tfaccel.launch.netns import isolation_available

    ok, detail = isolation_available()
    if ok:
        how = "as root" if detail == "net" else "in a user namespace"
        return {"private": True, "detail": f"private loopback-only network namespace ({how})"}
    return {"private": False, "detail": f"host network: {detail}"}


def format_report(report: Dict[str, Any]) -> str:
    """Renders an ``env_report()`` as the Markdown-ish list ``tfaccel env`` prints (paste it into an issue)."""
    items = _software_items(report) + _device_items(report) + _cluster_items(report) + _auto_items(report)
    return "\n".join(["Copy-and-paste the text below in your GitHub issue", ""] +
                     [f"- {key}: {value}" for key, value in items])


def _software_items(report: Dict[str, Any]) -> List[Tuple[str, Any]]:
    items: List[Tuple[str, Any]] = [("tfaccel version", report["tfaccel"]), ("Platform", report["platform"]),
                                    ("Python version", report["python"])]
    tf_info = report["tensorflow"]
    items.append(("TensorFlow version", tf_info.get("version") or "not installed"))
    if tf_info.get("version"):
        items.append(("TensorFlow built with CUDA", tf_info.get("built_with_cuda")))
        if tf_info.get("built_with_cuda"):
            items.append(("CUDA / cuDNN", f"{tf_info.get('cuda_version')} / {tf_info.get('cudnn_version')}"))
    items += [("Keras version", report["keras"] or "not installed"),
              ("NumPy version", report["numpy"] or "not installed")]
    hvd = report["horovod"]
    if not hvd.get("installed"):
        items.append(("Horovod", "not installed"))
    elif not hvd.get("tensorflow_built"):
        items.append(("Horovod", f"{hvd.get('version')} (TensorFlow ops unusable: {hvd.get('error')})"))
    else:
        items.append(("Horovod", f"{hvd.get('version')} (gloo={hvd['gloo_built']}, mpi={hvd['mpi_built']}, "
                                 f"nccl={hvd['nccl_built']})"))
    return items


def _device_items(report: Dict[str, Any]) -> List[Tuple[str, Any]]:
    devices = report["devices"]
    if "error" in devices:
        return [("Devices", devices["error"])]
    items: List[Tuple[str, Any]] = []
    for dev in devices["physical"]:
        extra = ""
        if dev["type"] == "GPU":
            extra = f" ({dev.get('device_name')}, compute capability {dev.get('compute_capability')})"
        items.append(("Physical device", f"{dev['name']}{extra}"))
    for dev in devices["logical"]:
        if "error" in dev:
            items.append(("Logical devices", dev["error"]))
        else:
            mem = f" ({dev['memory_mb']} MiB)" if dev.get("memory_mb") is not None else ""
            items.append(("Logical device", f"{dev['name']}{mem}"))
    return items


def _cluster_items(report: Dict[str, Any]) -> List[Tuple[str, Any]]:
    items: List[Tuple[str, Any]] = [
        ("TPU", report["tpu"]["address_hint"] or "none found (COLAB_TPU_ADDR / TPU_NAME unset)")]
    tfc = report["tf_config"]
    if not tfc["set"]:
        items.append(("TF_CONFIG", "not set (a Kubernetes pod, a cloud trainer or SLURM may still describe a "
                                   "cluster: `tfaccel tf-config --explain` says which)"))
    elif not tfc["valid"]:
        items.append(("TF_CONFIG", tfc["error"]))
    else:
        roles = ", ".join(f"{r}={n}" for r, n in tfc["roles"].items())
        items.append(("TF_CONFIG", f"task {tfc['task_type']}:{tfc['task_index']} of {tfc['num_tasks']} ({roles})"))
    net = report.get("local_network")
    if net:
        items.append(("tfaccel launch local clusters", net["detail"] + (
            "" if net["private"] else " (their ports can be reached from other machines)")))
    ray_info = report.get("ray") or {}
    worker = ray_info.get("worker")
    items.append(("Ray", (ray_info.get("version") or "not installed") + (
        f" (this process is Ray Train worker {worker['rank']} of {worker['world_size']}, "
        f"{'tfaccel launch --backend ray' if worker['mode'] == 'launch' else 'in a Ray Train function'})"
        if worker else "")))
    return items


def _auto_items(report: Dict[str, Any]) -> List[Tuple[str, Any]]:
    auto = report.get("auto") or {}
    if "error" in auto:
        return [("auto choices", auto["error"])]
    items: List[Tuple[str, Any]] = []
    for key, reason_key in (("strategy", "strategy_reason"), ("precision", "precision_reason"),
                            ("jit_compile", "jit_reason")):
        value, reason = auto.get(key), auto.get(reason_key)
        items.append((f"auto {key}", f"{value} ({reason})" if reason else value if value is not None else "n/a"))
    return items
