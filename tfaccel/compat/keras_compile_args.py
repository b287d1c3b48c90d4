"""What the user passed to ``model.compile(jit_compile=...)``: Keras keeps only the resolved value.

Keras 3 ``Trainer.compile`` (``keras/src/trainers/trainer.py``, 3.15.1) turns ``jit_compile="auto"`` into True or
False before storing it (``model.jit_compile`` and the compile config), so an explicit
``compile(jit_compile=True)`` cannot be told from ``"auto"`` afterwards. tfaccel must tell them apart: an explicit
choice at compile stands, ``"auto"`` is tfaccel's to decide. ``remember_compile_arguments()`` wraps the one
``compile`` every Keras model runs (a subclass's own ``compile`` reaches it through ``super().compile``) and
records the argument as it was received, per model, without touching the model.
"""

import functools
import inspect
import weakref
from typing import Any, Callable, Union

import keras

__all__ = ["remember_compile_arguments", "compile_jit_request"]

_REQUESTED: "weakref.WeakKeyDictionary[Any, Union[str, bool]]" = weakref.WeakKeyDictionary()
_MARK = "_tfaccel_records_jit_compile"


def _compile_owner() -> type:
    """The class whose ``compile`` every Keras model runs (Keras 3.15: ``keras.src.trainers.trainer.Trainer``)."""
    return next(cls for cls in keras.Model.__mro__ if "compile" in vars(cls))


def _recording(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 (Keras' name)
        bound = signature.bind(self, *args, **kwargs)
        requested = bound.arguments.get("jit_compile", "auto")
        result = original(self, *args, **kwargs)
        _REQUESTED[self] = requested  # Keras models are weakly referenceable
        return result

    setattr(compile, _MARK, True)
    return compile


def remember_compile_arguments() -> None:
    """Records ``jit_compile`` as each later ``model.compile`` call receives it (idempotent)."""
    owner = _compile_owner()
    if not getattr(vars(owner)["compile"], _MARK, False):
        owner.compile = _recording(vars(owner)["compile"])


def compile_jit_request(model: Any) -> Union[str, bool]:
    """``jit_compile`` as passed to the model's latest ``compile`` since ``remember_compile_arguments()``: True or
    False where the user chose, else ``"auto"`` (not passed, passed as ``"auto"``, or compiled before recording)."""
    try:
        requested = _REQUESTED.get(model, "auto")
    except TypeError:  # not weakly referenceable: never recorded
        return "auto"
    return requested if isinstance(requested, bool) else "auto"
