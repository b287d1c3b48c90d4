"""Horovod itself: whether this process is a rank, loading ``horovod.tensorflow`` (built with Gloo), and pinning a
rank to its GPU."""

import os
from typing import Any, Mapping, Optional

from tfaccel._lazy import optional_module
from tfaccel.devices import device_backend
from tfaccel.errors import BackendUnavailableError, DeviceError
from tfaccel.log import get_logger

__all__ = ["INSTALL_HINT", "launched_by_horovod", "import_horovod", "pin_gpu_to_local_rank"]

INSTALL_HINT = ("Horovod 0.28.1 must be built against the installed TensorFlow: run "
                "`bash scripts/install_horovod.sh .venv` (plain `pip install horovod` cannot build against "
                "TF >= 2.19); see docs/guides/horovod.md")

# Variables horovodrun (Gloo) sets in every rank; MPI launches are recognised by Horovod's own variables only.
_HOROVOD_ENV_VARS = ("HOROVOD_RANK", "HOROVOD_GLOO_RENDEZVOUS_ADDR")


def launched_by_horovod(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when this process is a rank started by ``horovodrun`` (cheap: imports nothing).

    Args:
        environ: the environment to read. Defaults to ``os.environ``.

    Returns:
        Whether Horovod's rank variables are present.
    """
    env = os.environ if environ is None else environ
    return any(name in env for name in _HOROVOD_ENV_VARS)


def import_horovod() -> Any:
    """Imports ``horovod.tensorflow`` and checks that its TensorFlow ops and Gloo were built.

    Returns:
        The ``horovod.tensorflow`` module.

    Raises:
        BackendUnavailableError: Horovod is not installed, its TensorFlow ops do not load, or it was built
            without Gloo; the message says how to build it.
    """
    try:
        hvd = optional_module("horovod.tensorflow")
        gloo = hvd.gloo_built()  # loads the compiled ops library
    except ImportError as exc:
        raise BackendUnavailableError(f"strategy 'horovod': cannot import horovod.tensorflow ({exc}). "
                                      f"{INSTALL_HINT}") from exc
    except Exception as exc:  # a wheel built against another TF fails to load its .so with other errors
        raise BackendUnavailableError(f"strategy 'horovod': horovod.tensorflow is installed but does not load "
                                      f"({type(exc).__name__}: {exc}); it was probably built against another "
                                      f"TensorFlow. Rebuild it: {INSTALL_HINT} (add --force)") from exc
    if not gloo:
        raise BackendUnavailableError("strategy 'horovod': this Horovod was built without Gloo, which tfaccel "
                                      f"uses to start ranks. Rebuild it: {INSTALL_HINT} (add --force)")
    return hvd



def pin_gpu_to_local_rank(local_rank: int, *, _backend_override: Any = None) -> Optional[int]:
    """Makes only GPU ``local_rank % num_gpus`` visible to this process (with memory growth).

    Must run before TensorFlow initialises its devices. Does nothing when there is no GPU.

    Args:
        local_rank: this rank's index on its host (``hvd.local_rank()``).

    Returns:
        The index of the pinned physical GPU, or None when there is no GPU.

    Raises:
        DeviceError: TensorFlow already initialised its devices with another GPU visible.
    """
    be = device_backend(_backend_override)
    gpus = be.list_physical_devices("GPU")
    if not gpus:
        return None
    index = local_rank % len(gpus)
    if len(gpus) < local_rank + 1:
        get_logger().warning("horovod: local rank %d shares GPU %d: only %d GPU(s) on this host for more ranks",
                             local_rank, index, len(gpus))
    if be.is_initialized():
        visible = be.get_visible_devices("GPU")
        if list(visible) == [gpus[index]]:
            return index
        raise DeviceError(f"horovod: cannot pin local rank {local_rank} to GPU {index}: TensorFlow already "
                          f"initialised its devices with {len(visible)} visible GPU(s). Create the 'horovod' "
                          "backend before any TensorFlow op runs (first thing in the script)")
    be.set_visible_devices([gpus[index]], "GPU")
    be.set_memory_growth(gpus[index], True)
    return index
