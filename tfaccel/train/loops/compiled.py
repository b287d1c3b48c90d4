"""The compiled loop: each epoch's whole batches in one (XLA) ``tf.while_loop`` calling the model's own steps.

Data stays on the device; each epoch's order comes from (seed, epoch); ``model.train_step`` (Keras' or the user's)
runs every whole batch, and the partial last batch runs as its own step (no padding any layer sees). So loss,
``model.losses``, sample weights, metrics and the optimizer are Keras' own; the epoch around it mirrors Keras 3.15
``fit``/``evaluate`` (keras/src/backend/tensorflow/trainer.py). What it cannot mirror: :func:`compiled_blockers`.
"""

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat import keras_internals
from tfaccel.errors import ConfigError
from tfaccel.train.callback_hooks import batch_hook_reasons
from tfaccel.train.data import example_order
from tfaccel.train.decisions import write_record
from tfaccel.train.fit_context import FitContext
from tfaccel.train.loops.base import (Loop, LoopResult, evaluation_pass, pass_blockers, run_epochs, step_data,
                                      unknown_batch_size)

if TYPE_CHECKING:
    from tfaccel.train.xla_payback import XlaAuto

__all__ = ["CompiledLoop", "cached_pass", "compiled_blockers", "run_compiled"]

def compiled_blockers(model: Any, *, callbacks: Sequence[Any], steps_per_execution_given: bool = False) -> List[str]:
    """Why the compiled loop cannot run this job exactly like ``model.fit`` (an empty list: it can).

    Args:
        model: the user's compiled Keras model.
        callbacks: every callback of the job (the user's and tfaccel's).
        steps_per_execution_given: whether the user asked for ``steps_per_execution``.

    Returns:
        One short readable phrase per reason, e.g. ``"callback LambdaCallback has per-batch hooks (on_batch_end)"``.
    """
    blockers = []
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and strategy.num_replicas_in_sync != 1:
        blockers.append(f"the model's strategy has {strategy.num_replicas_in_sync} replicas (needs one)")
    if getattr(model, "run_eagerly", False):
        blockers.append("the model was compiled with run_eagerly=True")
    if steps_per_execution_given:
        blockers.append("steps_per_execution was given (the compiled loop runs whole epochs)")
    for cb in callbacks:
        blockers.extend(batch_hook_reasons(cb))
    return blockers


class _Pass:
    """One pass over in-memory data with one of the model's step methods (``train_step`` or ``test_step``):
    the whole batches in one compiled ``tf.while_loop``, a partial last batch as a step of its own."""

    def __init__(self, model: Any, step: Callable[[Any], Any], data: Any, *, batch_size: int,
                 jit_compile: bool) -> None:
        self.num_examples = int(tf.nest.flatten(data)[0].shape[0])
        if self.num_examples == 0:
            raise ValueError("compiled loop: the data has 0 examples; pass at least one example (or a batch)")
        self.batch_size = batch_size
        self.whole = self.num_examples // batch_size
        self.num_batches = -(-self.num_examples // batch_size)
        self._data, self._strategy = data, model.distribute_strategy
        self.build_s = 0.0  # what tracing it cost (set by cached_pass): a later fit that reuses it pays nothing
        self.warm_s: Optional[float] = None  # what its first call (graph optimisation, XLA compile) cost: warm()

        def one_step(batch: Any) -> Any:
            out = self._strategy.run(step, args=(unknown_batch_size(batch),))
            return tf.nest.map_structure(tf.convert_to_tensor, out)

        self._one_step = one_step
        # No AutoGraph, as Keras fit traces its step (do_not_convert on one_step_on_data, keras/src/backend/tensorflow/
        # trainer.py): the loop needs none, and converting train_step made tracing a BERT 24% more Python calls.
        self._step = tf.function(one_step, jit_compile=jit_compile, autograph=False)
        self._loop = tf.function(self._whole_batches, jit_compile=jit_compile, autograph=False)
        # Tracing one step builds what the step creates lazily (optimizer slots, compiled metrics) outside the
        # while loop, as Keras' fit does on its first trace. With a partial last batch, that trace is the
        # partial step's own and the loop returns nothing; else the loop carries the last step's outputs.
        self._partial = self.num_examples % batch_size
        self._zeros = None
        with self._strategy.scope():
            if not self._partial and self._trace_loop_only(model, step, jit_compile):
                return
            self._build_state(model)
            first = self._step.get_concrete_function(self._gather(tf.range(self._partial or batch_size)))
        self._zeros = None if self._partial else tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype),
                                                                       first.structured_outputs)

    def _trace_loop_only(self, model: Any, step: Callable[[Any], Any], jit_compile: bool) -> bool:
        """Keras' own ``train_step``/``test_step`` and whole batches only: builds the model's state as Keras ``fit``
        does (its symbolic build) and traces the epoch loop alone, its carried outputs shaped like the model's
        metrics (the step is traced once, as in ``fit``; tracing one step first as well cost MobileNetV3Small
        ~10 s here). False where that does not apply or the trace fails (then the step is traced first)."""
        name = getattr(step, "__name__", "")
        if name not in ("train_step", "test_step") or getattr(type(model), name) is not getattr(keras.Model, name):
            return False
        keras_internals.symbolic_build(model, self._gather(tf.range(self.batch_size)))
        self._zeros = tf.nest.map_structure(lambda t: tf.zeros_like(tf.convert_to_tensor(t)),
                                            model.get_metrics_result())
        try:
            self._loop.get_concrete_function(tf.TensorSpec([self.whole * self.batch_size], tf.int32),
                                             tf.nest.map_structure(tf.TensorSpec.from_tensor, self._data),
                                             tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32))
        except (TypeError, ValueError):  # the step's outputs are not shaped like the metrics: trace a step first
            self._zeros, self._loop = None, tf.function(self._whole_batches, jit_compile=jit_compile, autograph=False)
            return False
        return True

    def _build_state(self, model: Any) -> None:
        """The model's state (optimizer slots, metrics) built before the step's first trace, as Keras ``fit`` does,
        where every layer is built: a first trace that created them would be traced again (3 traces, not Keras' 2).
        A model Keras cannot build that way (no ``call``) is left to build in its first trace."""
        if model.built and all(layer.built for layer in keras_internals.flatten_layers(model)):
            try:
                keras_internals.symbolic_build(model, self._gather(tf.range(self._partial or self.batch_size)))
            except (TypeError, ValueError, NotImplementedError, AttributeError):
                pass

    def _gather(self, idx: Any, data: Any = None) -> Any:
        return tf.nest.map_structure(lambda t: tf.gather(t, idx), self._data if data is None else data)

    def _whole_batches(self, order: Any, data: Any, start: Any, stop: Any) -> Any:
        """The loop's function: the data is an argument (not captured), so a later ``fit`` on other arrays of the
        same shapes runs the same traced loop (:func:`cached_pass`); it runs batches ``start`` to ``stop`` of
        ``order`` (tensors: the same trace for every value; none in :meth:`warm`)."""
        def body(i: Any, *last: Any) -> Any:
            # tf.slice, not order[i*b:(i+1)*b]: Python slicing inside the XLA loop ran 100x slower here.
            out = self._one_step(self._gather(tf.slice(order, [i * self.batch_size], [self.batch_size]), data))
            return (i + 1, out) if last else (i + 1,)

        carried = (start,) + (() if self._zeros is None else (self._zeros,))
        result = tf.while_loop(lambda i, *_: i < stop, body, carried, parallel_iterations=1)
        return result[1] if self._zeros is not None else None

    def run(self, order: np.ndarray, *, start: int = 0, stop: Optional[int] = None, partial: bool = True) -> Any:
        """Runs the whole batches ``start`` to ``stop`` (defaults to all) of ``order`` (int32 example indices), then
        the partial last batch where ``partial``; returns the last step's outputs (None where none ran)."""
        stop = self.whole if stop is None else stop
        last = None
        with self._strategy.scope():
            split = self.whole * self.batch_size
            if stop > start:
                last = self._loop(tf.constant(order[:split]), self._data, tf.constant(start), tf.constant(stop))
            if self._partial and partial:
                last = self._step(self._gather(tf.constant(order[split:])))
        for value in tf.nest.flatten(last):
            if value is not None:
                value.numpy()  # waits for the device, so the epoch's time is the work's time
        return last

    def warm(self) -> float:
        """The loop's first call with 0 batches: it pays the graph optimisation and, with XLA, the one real
        compilation, and trains nothing (no step runs, no variable changes). Seconds it took, measured once: a
        pass reused by a later ``fit`` returns what its first call cost."""
        if self.warm_s is None:
            start = time.perf_counter()
            if self.whole:
                with self._strategy.scope():
                    zero = tf.constant(0)
                    out = self._loop(tf.zeros([self.whole * self.batch_size], tf.int32), self._data, zero, zero)
                for value in tf.nest.flatten(out):
                    if value is not None:  # a loop traced after a step carries no outputs (a partial batch)
                        value.numpy()
            self.warm_s = time.perf_counter() - start
        return self.warm_s

    def rebind(self, data: Any) -> "_Pass":
        """This pass over other arrays of the same shapes and dtypes (a later ``fit`` call); returns itself."""
        self._data = data
        return self

    def release(self) -> None:
        """Lets go of the data once the ``fit`` call is over (a cached pass must not keep the arrays alive)."""
        self._data = None


def _evaluate(model: Any, val_pass: _Pass, cb_list: Any) -> Dict[str, Any]:
    """Keras' ``evaluate`` as ``fit`` calls it (``evaluation_pass``), all batches in one compiled call."""
    return evaluation_pass(model, cb_list, lambda: val_pass.run(np.arange(val_pass.num_examples, dtype=np.int32)))


_CACHE_ATTR = "_tfaccel_compiled_passes"


def _identity(model: Any, step_name: str, data: Any, batch_size: int, jit: bool) -> Tuple[Tuple[Any, ...], Any]:
    """(what the traced pass depends on, as objects compared by identity; the shapes/settings, as a hashable key)."""
    step = getattr(model, step_name)
    objects = (getattr(step, "__func__", step), model.distribute_strategy, model.optimizer,
               *keras_internals.compile_objects(model), *model.trainable_variables)
    shapes = tuple((tuple(t.shape), t.dtype.name) for t in tf.nest.flatten(data))
    return objects, (step_name, bool(jit), int(batch_size), str(tf.nest.map_structure(lambda _: 0, data)), shapes)


def cached_pass(model: Any, step_name: str, data: Any, *, batch_size: int, jit: bool) -> _Pass:
    """The model's pass for this step, data shapes, batch size and XLA setting: traced once, as Keras ``fit`` traces
    its train function once, and reused by later ``fit`` calls on the same compiled model (rebound to their
    data). A new ``compile``, optimizer, loss, strategy or set of trainable variables traces a new one."""
    objects, key = _identity(model, step_name, data, batch_size, jit)
    cache = model.__dict__.get(_CACHE_ATTR)
    if cache is None:
        cache = {}
        object.__setattr__(model, _CACHE_ATTR, cache)  # not tracked by Keras: no weight, no saved state
    kept = cache.get(key)
    if kept is not None and len(kept[0]) == len(objects) and all(a is b for a, b in zip(kept[0], objects)):
        return kept[1].rebind(data)
    start = time.perf_counter()
    made = _Pass(model, getattr(model, step_name), data, batch_size=batch_size, jit_compile=jit)
    made.build_s = time.perf_counter() - start
    cache[key] = (objects, made)
    return made


class _Settings:
    """The train and validation passes of each XLA setting, built on first use (a switch builds the other's)."""

    def __init__(self, model: Any, data: Any, val_data: Any, *, batch_size: int,
                 validation_batch_size: Optional[int]) -> None:
        self._model, self._data, self._val_data = model, data, val_data
        self._batch_size, self._val_batch_size = batch_size, validation_batch_size or batch_size
        self._built: Dict[bool, Tuple[_Pass, Optional[_Pass]]] = {}
        self.spent = {"trace_s": 0.0, "first_call_s": 0.0}  # what this fit call paid (0 for passes reused)
        self.num_examples = int(tf.nest.flatten(data)[0].shape[0])
        self.whole, self.partial = divmod(self.num_examples, batch_size)
        self.num_batches = self.whole + bool(self.partial)

    def get(self, jit: bool) -> Tuple[_Pass, Optional[_Pass], float]:
        """(train pass, validation pass or None, seconds spent building them now: 0 where built before). A pass is
        traced and then warmed (:meth:`_Pass.warm`), so no epoch pays a compilation."""
        if jit in self._built:
            return self._built[jit] + (0.0,)
        start = time.perf_counter()
        model = self._model
        train = cached_pass(model, "train_step", self._data, batch_size=self._batch_size, jit=jit)
        val = None if self._val_data is None else cached_pass(model, "test_step", self._val_data,
                                                              batch_size=self._val_batch_size, jit=jit)
        traced = time.perf_counter()
        for one in (train, val):
            if one is not None:
                one.warm()
        self._built[jit] = (train, val)
        self.spent["trace_s"] += traced - start
        self.spent["first_call_s"] += time.perf_counter() - traced
        return train, val, time.perf_counter() - start

    def costs(self, jit: bool) -> Dict[str, float]:
        """What building this setting's passes costs a job that finds none traced: ``trace_s`` (tracing) and
        ``first_call_s`` (graph optimisation; with XLA, its compilation), also where this call reused passes an
        earlier one built (``jit_compile="auto"`` counts them as the setting's overhead all the same)."""
        passes = [one for one in self._built.get(jit, ()) if one is not None]
        return {"trace_s": sum(one.build_s for one in passes), "first_call_s": sum(one.warm_s or 0.0 for one in passes)}

    def release(self) -> None:
        """Every pass lets go of this call's data (the traced passes stay cached on the model)."""
        for passes in self._built.values():
            for one in passes:
                if one is not None:
                    one.release()


def _auto_epoch(settings: _Settings, auto: "XlaAuto", model: Any, epoch: int, order: np.ndarray,
                pending: Dict[bool, float]) -> Any:
    """One epoch under ``jit_compile="auto"``: chunks of whole batches, each run with the setting ``auto`` decides
    before it (a setting built now pays its tracing and real compile, timed apart from the chunk's steps), then
    the partial last batch. Returns the last step's outputs."""
    done, out, train = 0, None, None
    while True:
        jit, stop = auto.next_chunk(epoch, done, settings.whole)
        model.jit_compile = jit  # what Keras would compile with from this step on
        train, _, built = settings.get(jit)
        costs = settings.costs(jit)
        setup = pending.pop(jit, 0.0) + (max(built, sum(costs.values())) if built else 0.0)
        start = time.perf_counter()
        last = train.run(order, start=done, stop=stop, partial=False)
        auto.record(jit, time.perf_counter() - start, stop - done, setup, costs=costs)
        out, done = (out if last is None else last), stop
        if done >= settings.whole:
            break
    if settings.partial:
        out = train.run(order, start=done, stop=done)
    return out


def run_compiled(model: Any, *, x: Any, y: Any, sample_weight: Any, batch_size: int, epochs: int,
                 initial_epoch: int, shuffle: Any, seed: Optional[int], validation: Any,
                 validation_batch_size: Optional[int], validation_freq: Union[int, List[int]], jit_compile: bool,
                 callbacks: List[Any], verbose: Any, xla_auto: Optional["XlaAuto"] = None) -> LoopResult:
    """Trains ``model`` as Keras ``fit`` would, each epoch's whole batches in one compiled call.

    Args:
        model: the user's compiled Keras model (one replica). x: an array, a dict or a list of arrays; y: an array
            or None; sample_weight: None or an array (class weights folded in). validation: None or
            (x, y, sample_weight). batch_size, epochs, initial_epoch, validation_batch_size, validation_freq,
            verbose: as in Keras ``fit``. shuffle: Keras' ``shuffle``; each epoch's order is ``example_order``'s.
        jit_compile: compile the steps and the epoch loop with XLA (the first epoch's setting under ``xla_auto``).
        callbacks: epoch-level callbacks (:func:`compiled_blockers` returned [] for them).
        xla_auto: ``jit_compile="auto"``'s decision before each chunk of steps (``tfaccel.train.xla_payback``);
            None: the setting stays ``jit_compile``. ``model.jit_compile`` follows the setting the steps run with.

    Returns:
        Keras' history, the training seconds of each epoch (validation and callbacks excluded), the steps run.

    Raises:
        ValueError: the model is not compiled, the data is empty, or validation_freq is not an int or a list.
    """
    if not getattr(model, "compiled", False):
        raise ValueError("compiled loop: the model is not compiled; call model.compile(optimizer=..., loss=...) "
                         "before training it")
    start = time.perf_counter()
    data = step_data(x, y, sample_weight, constants=True)
    val_data = None if validation is None else step_data(*(tuple(validation) + (None,))[:3], constants=True)
    to_device = time.perf_counter() - start
    settings = _Settings(model, data, val_data, batch_size=batch_size, validation_batch_size=validation_batch_size)
    train, _, setup = settings.get(bool(jit_compile))
    # Building a setting's passes counts as that setting's overhead: what a fresh job pays, also where an earlier fit
    # call built them (this call then pays nothing, but the figures must describe the job, not this call).
    pending = {bool(jit_compile): max(setup, sum(settings.costs(bool(jit_compile)).values()))}
    before_epochs = dict(settings.spent)

    def train_epoch(epoch: int, _: Any) -> Tuple[Any, int]:
        order = example_order(settings.num_examples, seed, epoch, shuffle)
        if xla_auto is None:
            return settings.get(bool(jit_compile))[0].run(order), settings.num_batches
        return _auto_epoch(settings, xla_auto, model, epoch, order, pending), settings.num_batches

    def validate(cb_list: Any) -> Dict[str, Any]:
        return _evaluate(model, settings.get(bool(model.jit_compile))[1], cb_list)

    try:
        result = run_epochs(model, callbacks=callbacks, verbose=verbose, epochs=epochs, initial_epoch=initial_epoch,
                            steps_per_epoch=train.num_batches, train_epoch=train_epoch,
                            validate=None if validation is None else validate, validation_freq=validation_freq)
        later = sum(settings.spent.values()) - sum(before_epochs.values())  # a switch built a setting mid-epoch
        result.details["phases"] = {"to_device_s": to_device, **settings.spent,
                                    "epochs_s": sum(result.epoch_seconds) - later}
        return result
    finally:
        settings.release()


class CompiledLoop(Loop):
    """One replica, array data, epoch-level callbacks: each epoch's whole batches in one compiled call."""

    name = "compiled"
    own = True

    def serves(self, ctx: "FitContext") -> bool:
        return ctx.backend.num_replicas_in_sync == 1 and ctx.backend.traits.single_device

    def blockers(self, ctx: "FitContext") -> List[str]:
        data, request, backend = ctx.data, ctx.request, ctx.backend
        blockers = [] if self.serves(ctx) else [
            f"{backend.describe()} with {backend.num_replicas_in_sync} replica(s)"]
        if data.kind != "arrays":
            blockers.append(f"data is {data.what}, not in-memory arrays")
        else:
            if data.validation is not None and data.validation[1] is None and data.validation[2] is None:
                blockers.append("validation_data is not arrays")
            blockers += pass_blockers(data, request.validation.steps)
        if request.backups.backup_freq:
            blockers.append("backup_freq asks for step-level backups")
        blockers += compiled_blockers(ctx.model, callbacks=ctx.user_callbacks,
                                      steps_per_execution_given=request.loop.steps_per_execution != "auto")
        if request.loop.loop == "compiled" and blockers:
            raise ConfigError("loop='compiled' cannot train this job exactly like Keras fit: " + "; ".join(blockers) +
                              ". Use loop='auto' (Keras fit then trains it)")
        return blockers

    def describe(self, ctx: "FitContext", rejected: List[Tuple[Loop, List[str]]]) -> str:
        return "compiled whole-epoch loop running the model's train_step (one replica, array data)"

    def run(self, ctx: "FitContext") -> LoopResult:
        data, validation, auto = ctx.data, ctx.request.validation, ctx.xla_auto
        result = run_compiled(ctx.model, x=data.x, y=data.y, sample_weight=data.sample_weight,
                              batch_size=data.batch_size, epochs=ctx.request.epochs, initial_epoch=ctx.start_epoch,
                              shuffle=data.shuffle, seed=data.seed, validation=data.validation,
                              validation_batch_size=validation.batch_size, validation_freq=validation.freq,
                              jit_compile=bool(ctx.model.jit_compile), callbacks=ctx.loop_callbacks(),
                              verbose=ctx.verbose, xla_auto=auto)
        if auto is not None:
            record = auto.cache_record()
            result.details["xla_auto"] = {**auto.details(), "cache": write_record(auto.key, record) if record else
                                          "nothing written (both settings were not measured in this job)"}
        return result
