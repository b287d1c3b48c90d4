"""``FitRequest``: the arguments of one ``tfaccel.fit`` call, checked once (on construction), before anything is built.

Keras' ``fit`` arguments keep their names; tfaccel's options are grouped (validation, backups and checkpoints,
learning-rate scaling, the loop). Every check of an argument on its own lives here; checks that need the model,
the data or the backend run where those are known (``tfaccel.train.data``, the loops' ``blockers``).
"""

import dataclasses
from typing import Any, Dict, Optional, Tuple, Union

from tfaccel.errors import ConfigError, invalid_choice

__all__ = ["FitRequest", "ValidationOptions", "BackupOptions", "LearningRateScaling", "LoopOptions", "check_int",
           "VERBOSE_CHOICES", "LOOP_CHOICES", "LR_SCALING", "OPTIMIZER_NAMES", "SHARD_CHOICES"]

VERBOSE_CHOICES = ("auto", 0, 1, 2)
LOOP_CHOICES = ("auto", "keras", "compiled")
LR_SCALING = ("linear", "sqrt", "none")
# shard_optimizer_state: "auto" shards where tfaccel memory's estimate of a replica exceeds its device (train/zero.py).
SHARD_CHOICES = (False, True, "auto")
# The optimizers named by a string (compile_and_fit, tfaccel fit, tfaccel memory).
OPTIMIZER_NAMES = ("adam", "adamw", "sgd", "rmsprop", "adagrad", "adamax", "nadam", "lion")


def check_int(name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    """A whole number >= ``minimum`` (or None where ``optional``), else a ConfigError naming ``name``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be {'None or ' if optional else ''}a whole number >= {minimum}; "
                          f"received {value!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class ValidationOptions:
    """Keras' validation arguments: ``validation_data``, ``_split``, ``_steps``, ``_batch_size``, ``_freq``."""

    data: Any = dataclasses.field(default=None, repr=False)
    split: float = 0.0
    steps: Optional[int] = None
    batch_size: Optional[int] = None
    freq: Any = 1


@dataclasses.dataclass(frozen=True)
class BackupOptions:
    """What a job writes besides training: backups to resume from, checkpoints, TensorBoard logs."""

    backup_dir: Optional[str] = None
    backup_freq: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    tensorboard_dir: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class LearningRateScaling:
    """``scale_learning_rate`` ("linear", "sqrt" or None), its ``base_batch_size`` and ``warmup_epochs``."""

    rule: Optional[str] = None
    base_batch_size: Optional[int] = None
    warmup_epochs: float = 0


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """Which loop (``"auto"``, ``"keras"``, ``"compiled"``), steps per execution, gradient accumulation, and whether
    the optimizer state is sharded over the replicas (``tfaccel.train.zero``)."""

    loop: str = "auto"
    steps_per_execution: Union[str, int] = "auto"
    gradient_accumulation_steps: int = 1
    shard_optimizer_state: Union[bool, str] = False


@dataclasses.dataclass(frozen=True, eq=False)
class FitRequest:
    """One ``fit`` call's arguments, checked on construction (a ``ConfigError`` names the bad one).

    Attributes:
        x, y, batch_size, epochs, verbose, shuffle, class_weight, sample_weight, initial_epoch, steps_per_epoch:
            Keras ``fit``'s, with Keras' meaning. callbacks: the user's callbacks (a tuple).
        seed: the seed of the example order (None: drawn where tfaccel orders the examples).
        validation, backups, learning_rate, loop: tfaccel's grouped options. recompute: as ``fit``'s.
    """

    x: Any = dataclasses.field(default=None, repr=False)
    y: Any = dataclasses.field(default=None, repr=False)
    batch_size: Optional[int] = None
    epochs: int = 1
    verbose: Union[str, int] = "auto"
    callbacks: Tuple[Any, ...] = ()
    shuffle: Any = True
    class_weight: Optional[Dict[int, float]] = None
    sample_weight: Any = dataclasses.field(default=None, repr=False)
    initial_epoch: int = 0
    steps_per_epoch: Optional[int] = None
    seed: Optional[int] = None
    validation: ValidationOptions = ValidationOptions()
    backups: BackupOptions = BackupOptions()
    learning_rate: LearningRateScaling = LearningRateScaling()
    loop: LoopOptions = LoopOptions()
    recompute: Any = None

    def __post_init__(self) -> None:
        check_int("epochs", self.epochs, 1)
        check_int("initial_epoch", self.initial_epoch, 0)
        check_int("gradient_accumulation_steps", self.loop.gradient_accumulation_steps, 1)
        check_int("steps_per_epoch", self.steps_per_epoch, 1, optional=True)
        check_int("backup_freq", self.backups.backup_freq, 1, optional=True)
        spe = self.loop.steps_per_execution
        if spe != "auto" and (isinstance(spe, bool) or not isinstance(spe, int) or spe < 1):
            raise ConfigError(f"steps_per_execution must be 'auto' or a whole number >= 1; received {spe!r}")
        warmup = self.learning_rate.warmup_epochs
        if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or warmup < 0:
            raise ConfigError(f"warmup_epochs must be a number >= 0; received {warmup!r}")
        if self.verbose not in VERBOSE_CHOICES or isinstance(self.verbose, bool):
            raise invalid_choice("verbose", self.verbose, [str(v) for v in VERBOSE_CHOICES])
        if self.loop.loop not in LOOP_CHOICES:
            raise invalid_choice("loop", self.loop.loop, LOOP_CHOICES)
        shard = self.loop.shard_optimizer_state
        if not any(shard is c or (isinstance(c, str) and shard == c) for c in SHARD_CHOICES):
            raise invalid_choice("shard_optimizer_state", shard, [str(c) for c in SHARD_CHOICES])
        callbacks = self.callbacks
        if callbacks is not None and (isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, (list, tuple))):
            raise ConfigError(f"callbacks must be a list of keras callbacks; received {type(callbacks).__name__}")
        object.__setattr__(self, "callbacks", tuple(callbacks or ()))

    @classmethod
    def from_fit(cls, model: Any = None, **arguments: Any) -> "FitRequest":
        """The request for ``tfaccel.fit``'s keyword arguments, by their names in ``fit`` (``model`` is ignored).

        Raises:
            ConfigError: a bad argument, named, with what was received.
        """
        given = dict(arguments)
        groups = {"validation": (ValidationOptions, {"validation_data": "data", "validation_split": "split",
                                                     "validation_steps": "steps",
                                                     "validation_batch_size": "batch_size",
                                                     "validation_freq": "freq"}),
                  "loop": (LoopOptions, {"loop": "loop", "steps_per_execution": "steps_per_execution",
                                         "gradient_accumulation_steps": "gradient_accumulation_steps",
                                         "shard_optimizer_state": "shard_optimizer_state"}),
                  "backups": (BackupOptions, {k: k for k in ("backup_dir", "backup_freq", "checkpoint_dir",
                                                             "tensorboard_dir")}),
                  "learning_rate": (LearningRateScaling, {"scale_learning_rate": "rule",
                                                          "base_batch_size": "base_batch_size",
                                                          "warmup_epochs": "warmup_epochs"})}
        grouped = {}
        for group, (kind, names) in groups.items():
            grouped[group] = kind(**{field: given.pop(name) for name, field in names.items() if name in given})
        return cls(**given, **grouped)
