"""Helpers for tests/horovod: the "Horovod must be built" gate, a fake hvd module, a log capture."""

import logging
import os
from typing import Any, List

import pytest

from tfaccel.errors import BackendUnavailableError

NO_HOROVOD_ENV = "TFACCEL_NO_HOROVOD"


def require_horovod() -> Any:
    """Returns horovod.tensorflow; FAILS (not skips) when it is not built, unless TFACCEL_NO_HOROVOD=1.

    CI builds Horovod with scripts/install_horovod.sh; a silent skip would let a broken build pass CI.
    """
    if os.environ.get(NO_HOROVOD_ENV) == "1":
        pytest.skip(f"{NO_HOROVOD_ENV}=1: Horovod deliberately not built here")
    from tfaccel.strategies.horovod import import_horovod

    try:
        return import_horovod()
    except BackendUnavailableError as exc:
        pytest.fail(f"Horovod is not usable: {exc}\nBuild it with `bash scripts/install_horovod.sh .venv`, or set "
                    f"{NO_HOROVOD_ENV}=1 to run without the horovod tests on purpose.", pytrace=False)


class FakeHvd:
    """Stands in for horovod.tensorflow in single-process tests; records the collectives it is asked for.

    grouped_allreduce multiplies by ``scale`` so a test can see that the gradients went through it.
    """

    Average = "Average"
    Sum = "Sum"

    class Compression:
        none = "compression.none"
        fp16 = "compression.fp16"

    def __init__(self, *, size: int = 2, rank: int = 1, local_rank: int = 1, scale: float = 0.5) -> None:
        self._size, self._rank, self._local_rank, self.scale = size, rank, local_rank, scale
        self.calls: List[tuple] = []
        self.initialized = False

    def init(self) -> None:
        self.initialized = True

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def local_rank(self) -> int:
        return self._local_rank

    def gloo_built(self) -> bool:
        return True

    def grouped_allreduce(self, tensors: List[Any], op: Any = None, compression: Any = None) -> List[Any]:
        self.calls.append(("grouped_allreduce", len(tensors), op, compression))
        return [t * self.scale for t in tensors]

    def allreduce(self, tensor: Any, op: Any = None, name: Any = None) -> Any:
        self.calls.append(("allreduce", op, name))
        return tensor + 1.0

    def allgather(self, tensor: Any, name: Any = None) -> Any:
        """Every rank's tensor, concatenated: here ``size`` copies of this rank's."""
        import tensorflow as tf

        self.calls.append(("allgather", tuple(tensor.shape)))
        return tf.concat([tensor] * self._size, axis=0)

    def broadcast_variables(self, variables: List[Any], root_rank: int) -> None:
        self.calls.append(("broadcast_variables", list(variables), root_rank))


class LogCapture(logging.Handler):
    """Collects the tfaccel logger's records (it does not propagate to pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self, level: int = logging.DEBUG) -> str:
        return "\n".join(r.getMessage() for r in self.records if r.levelno >= level)
