"""A user's custom training loop as the doctor records it (``tfaccel doctor -- python ctl.py``).

A custom loop does not call ``fit``: it distributes a dataset with the strategy it runs under
(``strategy.experimental_distribute_dataset`` or ``strategy.distribute_datasets_from_function``) and calls
``strategy.run(step, args=(batch,))`` each step. Under the doctor, the strategy is the run's own
(``tf.distribute.get_strategy()`` in the script), and :class:`LoopCapture` takes what the loop distributes and the
step it runs the first time, then stops the script. The step's Keras model and optimizer are found through the
step function's globals and closure (a script's module-level ``model`` and ``optimizer``). :class:`CustomLoop`
then stands for the model in the doctor's recorder: its ``train_step`` is the user's step, its output summed over
the replicas as the loop's own ``strategy.reduce(SUM, ...)`` sums it.
"""

from typing import Any, Callable, Dict, List, NoReturn, Optional

import keras
import tensorflow as tf

from tfaccel.errors import ConfigError

__all__ = ["CustomLoop", "LoopCapture"]


class CustomLoop:
    """The user's per-replica step with the Keras model and optimizer it trains, shaped as the recorder's model."""

    def __init__(self, step_fn: Callable[..., Any], model: Any, optimizer: Any) -> None:
        self.step_fn, self.model, self.optimizer = step_fn, model, optimizer
        self.metrics: List[Any] = []

    @property
    def variables(self) -> List[Any]:
        """The model's variables (the optimizer's are made by the first step, alike in every run)."""
        return self.model.variables

    def train_step(self, batch: Any) -> Dict[str, Any]:
        """One step of the user's loop in a replica; each scalar it returns, summed over the replicas."""
        out = self.step_fn(batch)
        named = out if isinstance(out, dict) else {"loss": out}
        context = tf.distribute.get_replica_context()
        return {k: context.all_reduce(tf.distribute.ReduceOp.SUM, v) for k, v in named.items()
                if v is not None and len(tf.convert_to_tensor(v).shape) == 0}

    def get_metrics_result(self) -> Dict[str, Any]:
        """A custom loop's metrics are its own business: the logs are its step's outputs."""
        return {}


def _reachable(fn: Callable[..., Any]) -> List[Any]:
    """What a step function sees: its module's globals and its closure's cells."""
    fn = getattr(fn, "python_function", fn)  # a tf.function
    seen = list(getattr(fn, "__globals__", {}).values())
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            seen.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return seen


def _one(kind: str, found: List[Any]) -> Any:
    unique = list({id(x): x for x in found}.values())
    if len(unique) != 1:
        raise ConfigError(f"doctor: the custom loop's step function reaches {len(unique)} Keras {kind}s through its "
                          f"globals and closure; the doctor compares a loop that trains one {kind} (received "
                          f"{[type(x).__name__ for x in unique]})")
    return unique[0]


class LoopCapture:
    """Takes a custom loop's data and step from the strategy it runs under, and stops the script at its first step.

    ``stop(loop, data)`` is called with the :class:`CustomLoop` and the distributed dataset or ``dataset_fn``;
    it must raise (the script does not go on).
    """

    def __init__(self, strategy: Any, stop: Callable[[CustomLoop, Any], NoReturn]) -> None:
        self.strategy, self.stop = strategy, stop
        self.data: Optional[Any] = None
        self.originals = {name: getattr(strategy, name) for name in
                          ("run", "experimental_distribute_dataset", "distribute_datasets_from_function")}
        strategy.run = self._run
        strategy.experimental_distribute_dataset = self._distribute
        strategy.distribute_datasets_from_function = self._from_function

    def _distribute(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
        self.data = dataset
        return self.originals["experimental_distribute_dataset"](dataset, *args, **kwargs)

    def _from_function(self, dataset_fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.data = dataset_fn
        return self.originals["distribute_datasets_from_function"](dataset_fn, *args, **kwargs)

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NoReturn:
        if self.data is None:
            raise ConfigError("doctor: the custom loop called strategy.run before distributing a dataset; the doctor "
                              "feeds the loop's steps from strategy.experimental_distribute_dataset(dataset) or "
                              "strategy.distribute_datasets_from_function(dataset_fn)")
        seen = _reachable(fn)
        model = _one("model", [x for x in seen if isinstance(x, keras.Model)])
        optimizer = _one("optimizer", [x for x in seen if isinstance(x, keras.optimizers.Optimizer)])
        self.restore()
        self.stop(CustomLoop(fn, model, optimizer), self.data)

    def restore(self) -> None:
        """Gives the strategy its own methods back."""
        for name in self.originals:
            self.strategy.__dict__.pop(name, None)
