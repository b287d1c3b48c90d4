"""SIGTERM ends a ``MultiWorkerMirroredStrategy`` worker again.

Upstream behaviour (TensorFlow 2.21, checked here): when ``MultiWorkerMirroredStrategy`` starts its collective
runtime with the coordination service (always, on 2.21), ``EagerContextDistributedManager::EnableCollectiveOps``
(tensorflow/core/common_runtime/eager/context_distributed_manager.cc) creates a ``"sigterm"``
``PreemptionNotifier``. Its ``SigtermNotifier`` (xla/tsl/distributed_runtime/preemption/preemption_notifier.cc)
replaces the process's SIGTERM action with ``std::signal(SIGTERM, [](int) { sigterm_received = true; })`` and
only logs ``SIGTERM caught at ...`` and writes a preemption key into the coordination service. From then on
SIGTERM no longer ends the process: ``kill PID``, a scheduler's stop, ``tfaccel launch``'s fail-fast stop all
wait for SIGKILL (measured here: a worker blocked in a collective is still alive 8 s after SIGTERM). No
upstream issue about it was found (searched GitHub issues for the notifier, the log line and the symptom);
:data:`UPSTREAM_ISSUES` is empty and :data:`UPSTREAM_CODE` names the code instead.

When: the handler is installed inside the strategy's constructor (``context.ensure_initialized()`` ->
``EnableCollectiveOps``), before the start-up barrier (``WaitForAllTasks``), not at the first collective (checked
here by reading the SIGTERM action from a thread before, during and after the constructor and after the first
all-reduce). :func:`around_strategy_creation` records the SIGTERM action before the constructor and, when it
returns (or raises), puts that action back if the one in place is a handler that lives in a TensorFlow library. In the
default case the recorded action is ``SIG_DFL``: the kernel ends the process at once, even while the main thread
is blocked inside a C++ collective (a Python ``signal.signal`` handler would only run once that collective
returns; tested). A Python handler the program installed before the strategy is put back as it was.

Not covered: SIGTERM that arrives *during* the constructor (the start-up barrier, up to the start-up timeout,
60 s by default) is still swallowed. The constructor holds the GIL while it waits (measured: no Python thread runs
then), so nothing in Python can undo the handler before it returns; such a worker ends at SIGKILL or when the
start-up timeout fails it.

While ``tfaccel.fit`` trains, ``tfaccel.resilience.preemption`` catches SIGTERM itself (a Python handler, woken through
``signal.set_wakeup_fd`` even while the main thread is in a collective): every worker stops at one agreed step, the
chief writes the backup there, and the process exits with ``tfaccel.EXIT_PREEMPTED``; the action from before is put
back when fit returns.

Who keeps TensorFlow's handler:

* ``TFACCEL_KEEP_TF_SIGTERM=1`` (:data:`KEEP_ENV`): for programs that rely on TensorFlow's C++ preemption notice
  (the ``TF_DEFAULT_PREEMPTION_NOTICE_KEY`` coordination-service key that
  ``tf.distribute.experimental.PreemptionWatcher`` and the ``check_preemption`` op read).
* ``tf.distribute.experimental.PreemptionCheckpointHandler`` needs nothing: on CPU/GPU workers it installs its
  own Python SIGTERM handler when it is constructed, which is after the strategy exists, so it replaces
  tfaccel's ``SIG_DFL`` and its SIGTERM path works as TensorFlow intends (tested: its handler is the one in place
  once it is built; its checkpoint-and-exit flow itself is TensorFlow's and not exercised by tfaccel's tests).
* ``TFACCEL_DISABLE_COMPAT=tf_sigterm`` switches the fix off like every compat fix (for tests / retiring it).

Idempotent, reversible (:func:`remove` puts TensorFlow's handler back), and a no-op unless the SIGTERM handler
found is TensorFlow's (its address lies in a ``libtensorflow*`` / ``_pywrap_tensorflow*`` library).
"""

import contextlib
import ctypes
import os
import platform
import signal
import sys
import threading
from typing import Any, Iterator, Optional, Tuple

from tfaccel.compat import VersionWindow, is_disabled, outside_versions, switched_off
from tfaccel.log import get_logger

__all__ = ["NAME", "UPSTREAM_ISSUES", "UPSTREAM_CODE", "AFFECTED_VERSIONS", "KEEP_ENV", "NOTE", "is_needed",
           "why_not_needed", "apply", "remove", "is_applied", "handler_owner", "around_strategy_creation"]

NAME = "tf_sigterm"
UPSTREAM_ISSUES: Tuple[str, ...] = ()  # none found; see UPSTREAM_CODE
UPSTREAM_CODE = ("tensorflow/core/common_runtime/eager/context_distributed_manager.cc "
                 "(EnableCollectiveOps creates the \"sigterm\" PreemptionNotifier)",
                 "xla/tsl/distributed_runtime/preemption/preemption_notifier.cc (SigtermNotifier: std::signal)")
# [first affected, first version not known to be affected): seen on TF 2.21 (checked here). Earlier versions
# carry the same code but were not checked; re-check (tests/strategies/test_compat_tf_sigterm.py) and widen.
AFFECTED_VERSIONS: VersionWindow = ((2, 21), (2, 22))
KEEP_ENV = "TFACCEL_KEEP_TF_SIGTERM"
NOTE = (f"SIGTERM ends this worker: TensorFlow's SIGTERM preemption notifier is set aside by compat fix {NAME} "
        f"({KEEP_ENV}=1 keeps it); while fit trains, every worker stops at an agreed step, the backup is written "
        "there and the process exits 75 (tfaccel.resilience.preemption)")

# struct sigaction starts with the handler on Linux (glibc, musl) and macOS; 512 bytes is more than its size
# there (152 on Linux x86_64/aarch64). Other layouts (e.g. MIPS, sa_flags first) are not handled.
_SIGACTION_BYTES = 512
_SUPPORTED_MACHINES = ("x86_64", "amd64", "aarch64", "arm64")
_TF_LIBRARY_MARKERS = ("libtensorflow", "_pywrap_tensorflow", "_pywrap_tfe")

_lock = threading.Lock()
_state: dict = {}  # "tf_action": TensorFlow's sigaction bytes while the fix is in place


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        libc.sigaction.restype = ctypes.c_int
        libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        libc.dladdr.restype = ctypes.c_int
        _libc = libc
    return _libc


def _read_action() -> ctypes.Array:
    """The process's current SIGTERM action (raw ``struct sigaction``), read without changing it."""
    buf = ctypes.create_string_buffer(_SIGACTION_BYTES)
    if _c().sigaction(int(signal.SIGTERM), None, buf) != 0:
        raise OSError(ctypes.get_errno(), "sigaction(SIGTERM) could not be read")
    return buf


def _write_action(buf: Any) -> None:
    if _c().sigaction(int(signal.SIGTERM), buf, None) != 0:
        raise OSError(ctypes.get_errno(), "sigaction(SIGTERM) could not be set")


def _handler_address(buf: Any) -> int:
    return ctypes.c_void_p.from_buffer(buf).value or 0


def _owner_of(address: int) -> str:
    if address in (0, 1):
        return "SIG_DFL" if address == 0 else "SIG_IGN"
    info = _DlInfo()
    if not _c().dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return f"unknown ({address:#x})"
    return os.fsdecode(info.dli_fname)


def handler_owner() -> str:
    """Who handles SIGTERM in this process: ``"SIG_DFL"``, ``"SIG_IGN"`` or the file of the library that holds
    the handler (e.g. ``.../libtensorflow_cc.so.2`` while TensorFlow's notifier is installed)."""
    return _owner_of(_handler_address(_read_action()))


def _is_tensorflows(buf: Any) -> bool:
    owner = os.path.basename(_owner_of(_handler_address(buf)))
    return any(marker in owner for marker in _TF_LIBRARY_MARKERS)


def why_not_needed() -> Optional[str]:
    """Why the fix should not be applied here, or None when it should.

    Returns:
        A reason (platform, TensorFlow version outside the affected range), or None.
    """
    if sys.platform not in ("linux", "darwin") or platform.machine().lower() not in _SUPPORTED_MACHINES:
        return (f"{sys.platform}/{platform.machine()}: tfaccel reads the SIGTERM action with sigaction() only on "
                "Linux and macOS on x86_64/arm64; not patching")
    import tensorflow as tf

    return outside_versions("TensorFlow", tf.__version__, AFFECTED_VERSIONS,
                            f"a MultiWorkerMirrored worker ignores SIGTERM, see {UPSTREAM_CODE[0]}")


def is_needed() -> bool:
    """True when this platform and TensorFlow version are ones this fix is known to be needed on."""
    return why_not_needed() is None


def is_applied() -> bool:
    """True while TensorFlow's SIGTERM handler is set aside by this fix."""
    return "tf_action" in _state


def _declined(*, force: bool, quiet: bool = False) -> Optional[str]:
    """Why apply() does nothing (already logged unless ``quiet``), or None."""
    logger = get_logger()
    if not force and is_disabled(NAME):
        if not quiet:
            logger.warning("compat fix %s: %s; TensorFlow's preemption notifier catches SIGTERM, so SIGTERM "
                           "does not end this MultiWorkerMirrored worker (only SIGKILL does); see %s", NAME,
                           switched_off(NAME), UPSTREAM_CODE[0])
        return "disabled"
    if not force and os.environ.get(KEEP_ENV, "").strip().lower() in ("1", "true", "yes"):
        if not quiet:
            logger.info("%s=%s: TensorFlow's SIGTERM preemption notifier is kept; SIGTERM does not end this worker "
                        "(only SIGKILL does)", KEEP_ENV, os.environ[KEEP_ENV])
        return "kept"
    reason = why_not_needed()
    if reason is not None:
        if not quiet:
            logger.info("compat fix %s not applied: %s", NAME, reason)
        return "not needed"
    return None


def _restore(previous: Optional[Any]) -> bool:
    """Puts ``previous`` (default SIG_DFL) in place of TensorFlow's handler; False when TF's is not installed."""
    with _lock:
        if "tf_action" in _state:
            return True
        current = _read_action()
        if not _is_tensorflows(current):
            return False
        if previous is None or _is_tensorflows(previous):
            previous = ctypes.create_string_buffer(_SIGACTION_BYTES)  # zeroed: SIG_DFL, no flags, empty mask
        _write_action(previous)
        _state["tf_action"] = current
    get_logger().debug("compat fix %s applied: SIGTERM ends this worker again (%s replaced by %s)", NAME,
                       _owner_of(_handler_address(current)), _owner_of(_handler_address(previous)))
    return True


def apply(*, force: bool = False, previous: Optional[Any] = None) -> bool:
    """Sets TensorFlow's SIGTERM handler aside (idempotent): SIGTERM ends the process again.

    Args:
        force: apply even when ``TFACCEL_DISABLE_COMPAT`` lists this fix or ``TFACCEL_KEEP_TF_SIGTERM`` is set.
            Defaults to False.
        previous: the raw SIGTERM action to put back (recorded before TensorFlow installed its handler).
            Defaults to ``SIG_DFL``.

    Returns:
        True when the fix is in place after the call; False when it was declined (the reason is logged) or when
        TensorFlow's handler is not installed (nothing to undo).
    """
    if is_applied():
        return True
    if _declined(force=force) is not None:
        return False
    return _restore(previous)


def remove() -> bool:
    """Puts TensorFlow's SIGTERM handler back.

    Returns:
        True when something was restored, False when the fix was not in place.
    """
    with _lock:
        saved = _state.pop("tf_action", None)
        if saved is None:
            return False
        _write_action(saved)
        return True


@contextlib.contextmanager
def around_strategy_creation() -> Iterator[None]:
    """Wrap the ``MultiWorkerMirroredStrategy`` constructor: the SIGTERM action from before it is put back in place
    of TensorFlow's handler when it returns (also when it raises).

    Example:
        >>> with tf_sigterm.around_strategy_creation():
        ...     strategy = tf.distribute.MultiWorkerMirroredStrategy()
    """
    declined = None if is_applied() else _declined(force=False, quiet=True)
    if is_applied() or declined is not None:
        try:
            yield
        finally:
            # Say why the fix is not in place, once, and only where TensorFlow did install its handler.
            if declined == "not needed" or (declined is not None and _is_tensorflows(_read_action())):
                _declined(force=False)
        return
    before: Optional[Any] = _read_action()
    if _is_tensorflows(before):
        before = None  # TensorFlow's notifier was installed earlier (a strategy built outside tfaccel): SIG_DFL
    try:
        yield
    finally:
        _restore(before)
