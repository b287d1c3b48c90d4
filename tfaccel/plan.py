"""The Plan: every decision tfaccel takes for a job (strategy, precision, XLA), with the reason for each.

``resolve_plan`` builds the backend and returns both; ``compile_and_fit`` logs ``plan.summary()`` once on the
chief and returns the plan in its result. ``describe_auto`` says what ``"auto"`` would pick here without
building anything (``tfaccel env`` shows it).
"""

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from tfaccel.errors import ConfigError
from tfaccel.strategies.base import Backend

__all__ = ["Plan", "resolve_plan", "describe_auto"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a job runs on and why.

    Attributes:
        strategy: the registry name of the backend (``"mirrored"``, ``"multi_worker"``, ...).
        strategy_reason: why it was chosen.
        num_replicas: replicas contributing to one optimizer step, over all processes.
        num_workers: processes that hold replicas.
        worker_index: this process's index among them.
        task: this process's cluster task (``"worker:1"``), or None outside a cluster.
        is_chief: this process writes checkpoints, logs and summaries.
        precision: the Keras dtype policy.
        precision_reason: why.
        jit_compile: whether Keras compiles the step with XLA.
        jit_reason: why.
        notes: other things worth knowing (loss scaling, compat fixes, TPU batching, ...).
    """

    strategy: str
    strategy_reason: str
    num_replicas: int
    num_workers: int
    worker_index: int
    task: Optional[str]
    is_chief: bool
    precision: str
    precision_reason: str
    jit_compile: bool
    jit_reason: str
    notes: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_replicas < 1 or self.num_workers < 1 or not 0 <= self.worker_index < self.num_workers:
            raise ConfigError(f"Plan: inconsistent replica counts; received num_replicas={self.num_replicas}, "
                              f"num_workers={self.num_workers}, worker_index={self.worker_index}")

    def summary(self) -> str:
        """One paragraph for the log: ``strategy mirrored (2 replicas; reason) | precision ... | XLA ...``."""
        where = f"{self.num_replicas} replica{'s' if self.num_replicas != 1 else ''}"
        if self.num_workers > 1 or self.task:
            where += f", worker {self.worker_index} of {self.num_workers}"
            if self.task:
                where += f" ({self.task}{', chief' if self.is_chief else ''})"
        text = (f"strategy {self.strategy} ({where}; {self.strategy_reason}) | precision {self.precision} "
                f"({self.precision_reason}) | XLA {'on' if self.jit_compile else 'off'} ({self.jit_reason})")
        if self.notes:
            text += " | " + "; ".join(self.notes)
        return text

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        out = dataclasses.asdict(self)
        out["notes"] = list(self.notes)
        return out


def _notes(backend: Backend, precision: str) -> Tuple[str, ...]:
    notes = list(getattr(backend, "notes", ()))
    traits = backend.traits
    if traits.plan_note:
        notes.append(traits.plan_note)
    if traits.keras_fit_fix:
        from tfaccel.compat import keras_mwms

        if keras_mwms.is_applied():
            notes.append(f"Keras 3 fit fix {keras_mwms.NAME} applied ({keras_mwms.UPSTREAM_ISSUES[0]})")
    if precision == "mixed_float16":
        notes.append("float16: loss scaling by Keras' LossScaleOptimizer (custom loops: "
                     "tfaccel.precision.wrap_loss_scale)")
    return tuple(notes)


def resolve_plan(*, strategy: str = "auto", precision: str = "auto", jit_compile: Union[str, bool] = "auto",
                 strategy_options: Optional[Mapping[str, Any]] = None, devices: Optional[Any] = None,
                 task: Optional[Any] = None) -> Tuple[Plan, Backend]:
    """Decides strategy, precision and XLA, builds the backend, and explains every choice.

    The backend comes from ``get_backend``: the one this process already built for the same request (a
    ``get_strategy("multi_worker")`` earlier in the script included), else a new one; a second, different
    collective strategy is a ``ConfigError`` (see ``tfaccel.strategies.registry``). Nothing is set globally:
    call ``tfaccel.set_precision(plan.precision)`` before building the model. A global dtype policy other than
    float32 that the user set before (``keras.mixed_precision.set_global_policy``) is kept by ``precision="auto"``
    and conflicts with a different explicit ``precision``.

    Args:
        strategy: a registry name or ``"auto"``. Defaults to ``"auto"``.
        precision: one of ``tfaccel.precision.PRECISION_NAMES``. Defaults to ``"auto"``.
        jit_compile: ``"auto"``, True or False. Defaults to ``"auto"``.
        strategy_options: options of the strategy entry, e.g. ``{"cross_device_ops": "nccl"}``.
        devices: the ``DeviceInfo`` to decide from. Defaults to what is detected (without initialising TF early).
        task: this process's ``TaskInfo``. Defaults to ``tfaccel.cluster.task_from_env()``.

    Returns:
        (plan, backend).

    Raises:
        ConfigError: an unknown strategy, option, precision or jit_compile value (checked before anything is built),
            or a request for a second, different collective strategy in this process.
        BackendUnavailableError: the chosen backend cannot run here.

    Example:
        >>> from tfaccel.plan import resolve_plan
        >>> plan, backend = resolve_plan()  # doctest: +SKIP
        >>> print(plan.summary())  # doctest: +SKIP
    """
    from tfaccel.devices import detect_devices
    from tfaccel.precision import resolve_precision, user_global_policy
    from tfaccel.strategies import get_backend
    from tfaccel.strategies._task import current_task
    from tfaccel.xla import resolve_jit

    if strategy_options is not None and not isinstance(strategy_options, Mapping):
        raise ConfigError(f"strategy_options must be a dict of the strategy's options; received {strategy_options!r}")
    info = devices if devices is not None else detect_devices(initialise=False)
    # validates before anything is built; a global dtype policy the user set is their choice and stands
    policy, policy_reason = resolve_precision(precision, devices=info, global_policy=user_global_policy())
    if not (isinstance(jit_compile, bool) or jit_compile == "auto"):
        resolve_jit(jit_compile, backend=Backend("default", None), devices=info)  # raises the standard error
    if task is None:
        task = current_task()
    evaluator_notes: Tuple[str, ...] = ()
    if task is not None and task.task_type == "evaluator":  # the side-car evaluator is no member of the training
        evaluator_notes = (_evaluator_note(strategy, strategy_options),)
        if strategy in CLUSTER_STRATEGIES:
            strategy, strategy_options = "auto", None
    backend = get_backend(strategy, devices=devices, task=task, **dict(strategy_options or {}))
    jit, jit_reason = resolve_jit(jit_compile, backend=backend, devices=info)
    plan = Plan(**backend.plan_fields(), task=getattr(task, "name", None), precision=policy,
                precision_reason=policy_reason, jit_compile=jit, jit_reason=jit_reason,
                notes=_notes(backend, policy) + evaluator_notes + _source_notes(task))
    return plan, backend


CLUSTER_STRATEGIES = ("parameter_server", "multi_worker")


def _source_notes(task: Any) -> Tuple[str, ...]:
    """Where this process's cluster came from, with the facts its source read (a JobSet's labels, SLURM's ...);
    nothing for a plain TF_CONFIG, which the strategy's reason names already."""
    if task is None or not getattr(task, "facts", ()) or task.source == "TF_CONFIG":
        return ()
    return (f"cluster from {task.describe_source()}",)


def _evaluator_note(strategy: str, strategy_options: Optional[Mapping[str, Any]]) -> str:
    """What the plan says in the evaluator task (tfaccel.resilience.evaluator)."""
    note = ("this task is the side-car evaluator: tfaccel.fit evaluates the chief's checkpoints (checkpoint_dir) on "
            "validation_data and does not train")
    if strategy in CLUSTER_STRATEGIES:
        dropped = f" and its options {sorted(strategy_options)}" if strategy_options else ""
        note += (f"; strategy {strategy!r}{dropped} {'are' if dropped else 'is'} for the training tasks, so this task "
                 "takes the local rules of 'auto'")
    return note


def _runtime_initialised() -> bool:
    try:
        from tfaccel.compat.tf_runtime import runtime_initialised  # TensorFlow loads only when asked

        return runtime_initialised()
    except ImportError:
        return False


def describe_auto() -> Dict[str, Any]:
    """What ``strategy="auto"``, ``precision="auto"`` and ``jit_compile="auto"`` would pick here.

    Builds no strategy and does not initialise TensorFlow's runtime (so ``configure_devices`` stays possible):
    GPUs are read from the physical device list, virtual CPUs are only counted when the runtime is already up.

    Returns:
        ``{"strategy", "strategy_reason", "precision", "precision_reason", "jit_compile", "jit_reason"}``.
    """
    from tfaccel.devices import detect_devices
    from tfaccel.precision import resolve_precision
    from tfaccel.strategies._task import current_task
    from tfaccel.strategies.auto import choose_strategy
    from tfaccel.strategies.entries import sketch_backend
    from tfaccel.strategies.registry import count_logical_cpus
    from tfaccel.xla import resolve_jit

    devices = detect_devices(initialise=False)
    initialised = _runtime_initialised()
    name, reason = choose_strategy(devices=devices, task=current_task(),
                                   count_cpus=count_logical_cpus if initialised else None)
    if name == "default" and not initialised:
        reason += " (virtual CPUs are not counted before TensorFlow's runtime starts)"
    sketch = sketch_backend(strategy=name, devices=devices)
    jit, jit_reason = resolve_jit("auto", backend=sketch, devices=devices)
    policy, policy_reason = resolve_precision("auto", devices=devices)
    return {"strategy": name, "strategy_reason": reason, "precision": policy, "precision_reason": policy_reason,
            "jit_compile": jit, "jit_reason": jit_reason}
