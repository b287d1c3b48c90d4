"""Preemption-aware training: on SIGTERM every process of the job stops at one step they all agree on, the chief
writes a backup at that step, and every process exits with :data:`tfaccel.errors.EXIT_PREEMPTED`.

Schedulers announce a preemption with a signal and a grace period before SIGKILL (a spot VM's shutdown, a
Kubernetes eviction's ``terminationGracePeriodSeconds``, SLURM's ``--signal=USR1@60``). TensorFlow's
``PreemptionCheckpointHandler`` does this for custom training loops only (the worker that got the signal publishes
a step through the coordination service); Keras ``fit`` has nothing. tfaccel does it for every loop it runs:

* :class:`SignalWatch` (while a ``fit`` runs, main thread only) catches SIGTERM and ``TFACCEL_PREEMPTION_SIGNAL``
  (e.g. ``USR1``) with a Python handler. A watcher thread is woken through ``signal.set_wakeup_fd`` even while the
  main thread is inside a TensorFlow op: it logs the signal at once, ends the process with ``EXIT_PREEMPTED`` at once
  when nothing can be saved (no ``backup_dir``: said plainly), and ends it with ``128 + signal`` when training does
  not reach an agreed step within ``TFACCEL_PREEMPTION_TIMEOUT`` seconds (a peer gone: the launcher's failure path).
* :class:`Preemption` agrees: at step boundaries (every ``TFACCEL_PREEMPTION_CHECK_EVERY`` executions of the train
  function, ``auto`` by default: about one a second of training, chosen after the first 10 steps, and at every
  epoch end) every process adds its flag to one scalar all-reduce (a sum over MultiWorkerMirrored
  workers, Horovod ranks; none on one process or on the parameter-server coordinator). The
  processes run in lock-step, so all of them see the same answer at the same boundary. Then the chief writes the
  backup at that (epoch, step), a second all-reduce waits for it, and :class:`tfaccel.errors.Preempted` is raised.
  Where a backup can be written only at the end of an update (sharded gradient accumulation, whose sums are not
  saved: ``update_every``), the boundaries in between are not checked: the stop comes at the next update's end.
"""

import math
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

import keras

from tfaccel.errors import EXIT_PREEMPTED, Preempted
from tfaccel.log import get_logger
from tfaccel.resilience.contract import (CHECK_EVERY_ENV, DEFAULT_TIMEOUT_S, SIGNAL_ENV, TIMEOUT_ENV, env_number,
                                         preemption_signals)
from tfaccel.resilience.exiting import exit_after_handlers, flush_and_exit
from tfaccel.strategies.process_sum import strategy_sum

__all__ = ["SIGNAL_ENV", "TIMEOUT_ENV", "CHECK_EVERY_ENV", "preemption_signals", "SignalWatch", "Preemption",
           "preemption_callback", "make_preemption", "DEFAULT_TIMEOUT_S"]

# Said however the process learns of the signal first (its watcher thread or the agreed-step check).
NOTHING_SAVED = ("NOTHING WAS SAVED: this job has no backup_dir, so a restart starts from the beginning (give fit "
                 "backup_dir=... to resume where it stopped)")

# "auto": the interval is chosen at this boundary from the time the boundaries before it took (the first one left
# out: tracing), so that a check comes about once every CHECK_PERIOD_S seconds of training. A check costs 1.7 ms
# between 2 idle MultiWorkerMirrored workers on loopback here (7-30 ms with the 2 cores loaded 6x), so the checks
# cost well under 1% of the time, and a signal is seen within about a second.
PROBE_BOUNDARIES = 10
CHECK_PERIOD_S = 1.0
MAX_CHECK_EVERY = 1000


class SignalWatch:
    """Catches the preemption signals while a ``fit`` runs (a context manager; see the module doc).

    Args:
        can_save: a backup will be written at the agreed step (``backup_dir`` given).
        task: this process's name for the log (``"worker:1"``).
        timeout: seconds from the signal to the agreed step before the process ends with ``128 + signal``.
    """

    def __init__(self, *, can_save: bool, task: str, timeout: float) -> None:
        self.can_save, self.task, self.timeout = can_save, task, timeout
        self.received: Optional[int] = None
        self.received_at: Optional[float] = None
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._previous: Dict[int, Any] = {}
        self._pipe: Optional[Tuple[int, int]] = None
        self._old_fd = -1
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "SignalWatch":
        if threading.current_thread() is not threading.main_thread():
            get_logger().info("preemption: fit runs outside the main thread, so %s cannot catch SIGTERM; a "
                              "preempted job ends without a backup at the signal", self.task)
            return self
        signals = preemption_signals()
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._old_fd = signal.set_wakeup_fd(write)
        if self._old_fd != -1:  # the program's own wakeup fd (an event loop): keep it, catch with the handler only
            signal.set_wakeup_fd(self._old_fd)
            os.close(read)
            os.close(write)
        else:
            self._pipe = (read, write)
            self._thread = threading.Thread(target=self._watch, name="tfaccel-preemption", daemon=True)
            self._thread.start()
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        if not (exc[0] is not None and issubclass(exc[0], Preempted)):
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
        # else the handlers stay: the process ends with EXIT_PREEMPTED, and a late SIGTERM (the launcher stopping
        # the other tasks once one has exited) must not make it 143 on its way out (seen in 3 of 10 trials)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(-1)
            os.write(self._pipe[1], b"\0")  # wakes the watcher: it ends
            if self._thread is not None:
                self._thread.join(timeout=5)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        if self.received is not None and not exc[0]:
            get_logger().warning("preemption: %s got %s as training ended; the job is complete, nothing to resume",
                                 self.task, signal.Signals(self.received).name)

    def _handler(self, signum: int, frame: Any) -> None:
        self._note(signum)

    def _note(self, signum: int) -> bool:
        with self._lock:
            if self.received is not None or signum not in self._previous:
                return False
            self.received, self.received_at = signum, time.monotonic()
            return True

    def _watch(self) -> None:
        assert self._pipe is not None
        while True:
            data = os.read(self._pipe[0], 64)
            if not data or 0 in data:
                return
            if any(self._note(b) for b in data):
                self._react()

    def _react(self) -> None:
        """In the watcher thread, right after the signal: say it, end at once when nothing can be saved, and end
        the process if training does not reach an agreed step in time."""
        name, log = signal.Signals(self.received or signal.SIGTERM).name, get_logger()
        if not self.can_save:
            log.warning("preemption: %s got %s; %s. Exiting with %d", self.task, name, NOTHING_SAVED, EXIT_PREEMPTED)
            flush_and_exit(EXIT_PREEMPTED)
        log.warning("preemption: %s got %s (a preemption, or the launcher stopping the job); stopping at the next "
                    "step every worker agrees on, where the chief writes a backup (at most %g s)", self.task, name,
                    self.timeout)
        if not self.done.wait(self.timeout):
            log.error("preemption: %s did not reach an agreed step within %g s of %s (%s=...; a peer gone or a step "
                      "longer than that); exiting with %d, no backup at the signal", self.task, self.timeout, name,
                      TIMEOUT_ENV, 128 + int(self.received or signal.SIGTERM))
            flush_and_exit(128 + int(self.received or signal.SIGTERM))

    def seconds_since(self) -> Optional[float]:
        """Seconds since the signal arrived, or None when none did."""
        return None if self.received_at is None else time.monotonic() - self.received_at


class Preemption:
    """Agrees on the step to stop at, has the backup written there, and raises ``Preempted`` (module doc).

    Args:
        watch: the job's :class:`SignalWatch`.
        total: ``value -> its sum over the processes`` (a collective; identity on one process).
        processes: how many processes add to ``total``.
        save: ``(epoch, step) -> None`` writes the backup on the chief (a no-op elsewhere); None: no backup_dir.
        epochs: the job's epochs (a stop agreed at the end of the last one is no stop: the job is complete).
        progress: the chief's ``tfaccel.resilience.restarts.Progress`` (noted at every boundary). Defaults to None.
        check_every: check every this many batch boundaries (epoch ends are always checked); None: "auto", none in
            the first :data:`PROBE_BOUNDARIES` boundaries, then about one every :data:`CHECK_PERIOD_S` seconds of
            training (the interval agreed by every process: the mean of what each measured).
        update_every: only steps that are a multiple of this (and epoch ends) are boundaries; the micro-batches of
            one update under sharded gradient accumulation (a backup between them would lose their sums).
            Defaults to 1.
    """

    def __init__(self, watch: SignalWatch, *, total: Callable[[float], float], processes: int,
                 save: Optional[Callable[[int, int], None]], epochs: int, check_every: Optional[int] = None,
                 progress: Any = None, update_every: int = 1) -> None:
        self.watch, self.total, self.processes, self.save = watch, total, max(1, processes), save
        self.update_every = max(1, int(update_every))
        self.progress = progress  # a tfaccel.resilience.restarts.Progress: how far training got, for details["restarts"]
        self.epochs, self.auto = epochs, check_every is None
        self.check_every = 1 if check_every is None else max(1, int(check_every))
        self.boundaries = self.checks = 0
        self.check_seconds = 0.0
        self._second: Optional[float] = None  # "auto": when the second boundary was reached (the first traces)

    def at_boundary(self, epoch: int, step: int, *, epoch_end: bool = False) -> None:
        """Called by every process at the same boundary: the position training reached is (epoch, step).

        Raises:
            Preempted: a process got the signal; the backup (if any) holds (epoch, step).
        """
        if self.progress is not None:
            self.progress.note(epoch, step)
        if not epoch_end and step % self.update_every:
            return  # inside an update: no backup can be written here
        self.boundaries += 1
        if self.auto and self.boundaries <= PROBE_BOUNDARIES:
            if self.boundaries == 2:
                self._second = time.perf_counter()
            if self.boundaries == PROBE_BOUNDARIES:
                self._choose_interval()
            elif not epoch_end:
                return
        elif not epoch_end and self.boundaries % self.check_every:
            return
        began = time.perf_counter()
        agreed = self.total(1.0 if self.watch.received is not None else 0.0) > 0
        self.check_seconds += time.perf_counter() - began
        self.checks += 1
        if agreed and not (epoch_end and epoch >= self.epochs):
            self._stop(epoch, step)

    def _choose_interval(self) -> None:
        """Sets ``check_every`` from the time the probe's boundaries took (one collective: every process agrees)."""
        step = max(1e-6, (time.perf_counter() - (self._second or 0.0)) / (PROBE_BOUNDARIES - 2))
        mine = min(max(1, round(CHECK_PERIOD_S / step)), MAX_CHECK_EVERY)
        self.check_every = max(1, math.ceil(self.total(float(mine)) / self.processes))
        get_logger().debug("preemption: a step takes %.2f ms: checking every %d step(s)", step * 1e3,
                           self.check_every)

    def _stop(self, epoch: int, step: int) -> None:
        began = time.perf_counter()
        if self.save is not None:
            self.save(epoch, step)
            if self.progress is not None:
                self.progress.note(epoch, step, force=True)
        self.total(1.0)  # nobody exits before the chief's backup is on disk
        self.watch.done.set()
        since = self.watch.seconds_since()
        get_logger().warning(
            "preemption: %s stops at epoch %d, step %d (%s); %s (%.2f s); exiting with %d%s", self.watch.task, epoch,
            step, "its own signal" if since is not None else "another process was signalled",
            "backup written" if self.save is not None else NOTHING_SAVED, time.perf_counter() - began,
            EXIT_PREEMPTED, f", {since:.2f} s after the signal" if since is not None else "")
        # The process ends with EXIT_PREEMPTED once the exit handlers registered after `import tfaccel` ran (the
        # user's, AutoGraph's removal of its files), without TensorFlow's teardown, so it fits a grace period.
        exit_after_handlers(EXIT_PREEMPTED)
        raise Preempted(epoch=epoch, step=step, saved=self.save is not None)

    def details(self) -> Dict[str, Any]:
        """What ``FitResult.details["preemption"]`` reports: the checks made and what they cost (and, where a stop
        can come only at an update's end, every how many steps that is)."""
        return {"signals": [signal.Signals(s).name for s in preemption_signals()],
                "check_every": f"{self.check_every} (auto)" if self.auto else self.check_every,
                "checks": self.checks, "check_seconds": round(self.check_seconds, 4),
                **({"stops_at_update_ends_every": self.update_every} if self.update_every > 1 else {})}


def preemption_callback(preemption: Preemption, *, steps_per_epoch: int, step_offset: int = 0) -> Any:
    """The Keras callback that calls :meth:`Preemption.at_boundary` at Keras' batch ends and epoch ends.

    A batch end that finishes an epoch is left to the epoch end (after validation and the epoch's backup). Put it
    after the backup callback, so that the epoch-end backup is written before the check.
    """
    class _Preemption(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epoch, self.offset = 0, step_offset
            self.preemption = preemption

        def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
            position = self.offset + batch + 1
            if position < steps_per_epoch:
                preemption.at_boundary(self.epoch, position)

        def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
            self.offset = 0
            preemption.at_boundary(epoch + 1, 0, epoch_end=True)

    return _Preemption()


def make_preemption(backend: Any, *, save: Optional[Callable[[int, int], None]], can_save: bool, epochs: int,
                    task: str, progress: Any = None, update_every: int = 1) -> Preemption:
    """The job's :class:`Preemption`, its agreement chosen for the backend (see the module doc).

    Args:
        backend: the job's Backend. save: writes the backup at (epoch, step) (None: set later, by the loop that
            writes its own backups, or no backup_dir). can_save: a backup_dir was given. epochs: the job's epochs.
        task: this process, for the log. progress, update_every: see :class:`Preemption`.

    Raises:
        ConfigError: ``TFACCEL_PREEMPTION_SIGNAL``, ``_TIMEOUT`` or ``_CHECK_EVERY`` is malformed.
    """
    preemption_signals()  # a malformed TFACCEL_PREEMPTION_SIGNAL fails before training, not at __enter__
    timeout = env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, low=1, whole=False)
    given = os.environ.get(CHECK_EVERY_ENV, "").strip()
    check_every = None if given in ("", "auto") else int(env_number(CHECK_EVERY_ENV, 1, low=1, whole=True))
    processes = backend.num_workers if backend.uses_keras_fit else 1
    if processes == 1:
        check_every = 1  # nothing to agree with: every boundary costs one flag read (the coordinator: every backup)
    if backend.sum_over_processes is not None:
        total = backend.sum_over_processes
    elif processes > 1:
        total = strategy_sum(backend.strategy)
    else:
        total = float  # one process decides alone (one worker, or the parameter-server coordinator)
    watch = SignalWatch(can_save=can_save, task=task, timeout=timeout)
    return Preemption(watch, total=total, processes=processes, save=save, epochs=epochs, check_every=check_every,
                      progress=progress, update_every=update_every)
