"""Bounded start-up and lost-peer detection for MultiWorkerMirroredStrategy (issue 9, R2).

TensorFlow 2.21's ``MultiWorkerMirroredStrategy`` configures its coordination service with
``cluster_register_timeout_in_ms=0``: a worker whose peer never starts waits in the constructor forever
(tensorflow/tensorflow#39922, #46931: "stuck at start-up"). tfaccel configures the coordination service
itself, before the strategy is built (the strategy keeps a service that is already configured):

- start-up: every coordinated task (chief, workers) must register within ``startup_timeout`` seconds
  (``cluster_register_with_barrier``), otherwise every task that did start fails with an error naming
  the tasks that never came (measured here: the service leader gets their names from TF; the others
  find them by probing the peers' ports);
- lost peer: a peer that stops sending heartbeats for ``heartbeat_timeout`` seconds (frozen, host gone)
  aborts every collective of the survivors with ``UnavailableError`` naming it; a peer process that died
  is seen at once (its connection is reset) by the next collective.

The per-collective ``timeout_seconds`` of ``CommunicationOptions`` is separate; it bounds a collective whose peers
are alive but never join it. It is off by default (:data:`DEFAULT_COLLECTIVE_TIMEOUT_S`, as in TensorFlow): on
TensorFlow 2.21 every collective run with a timeout starts a thread that lives for the whole timeout (measured on
CPUs over gRPC: with 3 s, two workers training a small model held ~2,200 threads each; with 600 s they grew by
~200 threads an epoch of 32 steps until thread creation failed, ``std::system_error: Resource temporarily
unavailable``), so a job holds about (collectives per second) x (timeout) threads. A dead or frozen peer is caught
by the heartbeat without it.

Defaults come from the strategy options, else from the environment (``TFACCEL_STARTUP_TIMEOUT``,
``TFACCEL_HEARTBEAT_TIMEOUT``, ``TFACCEL_COLLECTIVE_TIMEOUT``), else from the constants below.
"""

import dataclasses
import numbers
import os
import re
from typing import Any, List, Mapping, Optional, Tuple

from tfaccel.compat.tf_runtime import configure_coordination_service, coordination_service_configured
from tfaccel.errors import ConfigError, DeviceError
from tfaccel.launch.procs import port_open

__all__ = ["PeerTimeouts", "resolve_timeouts", "configure_coordination", "startup_error", "lost_task_names",
           "DEFAULT_STARTUP_TIMEOUT_S", "DEFAULT_HEARTBEAT_TIMEOUT_S", "DEFAULT_COLLECTIVE_TIMEOUT_S", "ENV_NAMES"]

DEFAULT_STARTUP_TIMEOUT_S = 60.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 20.0  # TF would use 10 s; measured: a survivor exits ~heartbeat + 12 s after the loss
DEFAULT_COLLECTIVE_TIMEOUT_S = 0.0  # off: a timeout holds one thread per collective for its whole length (above)
ENV_NAMES = {"startup": "TFACCEL_STARTUP_TIMEOUT", "heartbeat": "TFACCEL_HEARTBEAT_TIMEOUT",
             "collective": "TFACCEL_COLLECTIVE_TIMEOUT"}
_COORDINATED_JOBS = ("chief", "worker")
_TASK_RE = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


@dataclasses.dataclass(frozen=True)
class PeerTimeouts:
    """The timeouts a multi-worker job runs with (seconds; 0 disables one), and where each came from."""

    startup: float
    heartbeat: float
    collective: float
    sources: Tuple[str, str, str] = ("default", "default", "default")

    def note(self) -> str:
        """One line for the plan."""
        def show(value: float, source: str) -> str:
            return ("off" if not value else f"{value:g} s") + ("" if source == "default" else f" ({source})")

        startup, heartbeat, collective = (show(v, s) for v, s in zip(
            (self.startup, self.heartbeat, self.collective), self.sources))
        threads = (f"; each collective holds a thread for the per-collective timeout on TensorFlow 2.21, about "
                   f"collectives per second x {self.collective:g} threads" if self.collective else "")
        return (f"peer timeouts: start-up {startup}, lost-peer heartbeat {heartbeat}, per-collective {collective} "
                f"(a peer that never starts or dies fails every surviving worker with its name instead of a hang"
                f"{threads})")

    def notes(self) -> Tuple[str, ...]:
        """The plan notes for these timeouts."""
        return (self.note(),)


def _check(name: str, value: Any, source: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        raise ConfigError(f"multi_worker: {name} must be a number of seconds >= 0 (0 disables it); received "
                          f"{value!r} from {source}")
    return float(value)


def resolve_timeouts(*, startup_timeout_seconds: Optional[float] = None,
                     heartbeat_timeout_seconds: Optional[float] = None, timeout_seconds: Optional[float] = None,
                     environ: Optional[Mapping[str, str]] = None) -> PeerTimeouts:
    """Argument > environment > default for each timeout.

    Raises:
        ConfigError: a value that is not a number of seconds >= 0 (the message names the option or variable).
    """
    env = os.environ if environ is None else environ
    out, sources = [], []
    for key, option, value, default in (
            ("startup", "startup_timeout_seconds", startup_timeout_seconds, DEFAULT_STARTUP_TIMEOUT_S),
            ("heartbeat", "heartbeat_timeout_seconds", heartbeat_timeout_seconds, DEFAULT_HEARTBEAT_TIMEOUT_S),
            ("collective", "timeout_seconds", timeout_seconds, DEFAULT_COLLECTIVE_TIMEOUT_S)):
        if value is not None:
            out.append(_check(option, value, f"strategy option {option}"))
            sources.append("given")
        elif env.get(ENV_NAMES[key]):
            out.append(_check(option, env[ENV_NAMES[key]], f"${ENV_NAMES[key]}"))
            sources.append(f"${ENV_NAMES[key]}")
        else:
            out.append(default)
            sources.append("default")
    return PeerTimeouts(out[0], out[1], out[2], tuple(sources))  # type: ignore[arg-type]


def configure_coordination(cluster_spec: Any, timeouts: PeerTimeouts) -> bool:
    """Configures TF's coordination service with bounded start-up and heartbeats; call before building MWMS.

    Args:
        cluster_spec: the ``tf.train.ClusterSpec`` of the job.
        timeouts: the timeouts to use.

    Returns:
        True when tfaccel configured the service; False when one was configured already (left as it is).
    """
    if coordination_service_configured():
        return False
    configure_coordination_service(cluster_spec, _COORDINATED_JOBS, register_timeout_s=timeouts.startup,
                                   heartbeat_timeout_s=timeouts.heartbeat)
    return True


def lost_task_names(message: str) -> List[str]:
    """``["worker:1"]`` for every ``/job:worker/replica:0/task:1`` a TensorFlow error message names."""
    seen: List[str] = []
    for job, index in _TASK_RE.findall(message or ""):
        name = f"{job}:{index}"
        if name not in seen:
            seen.append(name)
    return seen


def _silent_peers(task: Any) -> List[str]:
    """The other coordinated tasks whose address does not accept connections now."""
    silent = []
    for role in _COORDINATED_JOBS:
        for index, address in enumerate(task.spec.roles.get(role, ())):
            if (role, index) == (task.task_type, task.task_index):
                continue
            host, _, port = address.rpartition(":")
            if not port_open(host.strip("[]"), int(port), timeout=1.0):
                silent.append(f"{role}:{index} ({address})")
    return silent


def startup_error(exc: BaseException, *, task: Optional[Any], timeouts: PeerTimeouts) -> DeviceError:
    """The tfaccel error for a cluster that did not come up in time, naming the tasks that never joined."""
    named = [name for name in lost_task_names(str(exc)) if task is None or name != task.name]
    if not named and task is not None:
        named = _silent_peers(task)
    who = ", ".join(named) if named else "unknown (TensorFlow did not say; check every task's log)"
    this = task.name if task is not None else "this task"
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DeviceError(
        f"multi_worker: the cluster did not come up within the start-up timeout of {timeouts.startup:g} s; "
        f"{this} waited for: {who}. Start every task of the cluster (tfaccel launch starts them all in local "
        f"mode; per-host mode needs `tfaccel launch --cluster FILE --task NAME` on each host), or raise the "
        f"timeout (strategy option startup_timeout_seconds, or ${ENV_NAMES['startup']}). "
        f"TensorFlow said: {type(exc).__name__}: {first_line}")

