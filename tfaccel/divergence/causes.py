"""The catalogue of reasons why one replica and N replicas train differently, each found from the facts.

Each cause reads the verdict (where the runs part and what parts there), the two traces and the model's
structure (:func:`model_structure`), and when it applies says what it saw and the fix. Several may apply;
they are listed most specific first.
"""

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional

import keras

from tfaccel.compat import keras_internals
from tfaccel.divergence.compare import EXAMPLES, Verdict
from tfaccel.divergence.loop import CustomLoop
from tfaccel.divergence.record import Trace

__all__ = ["Cause", "CAUSES", "FINDINGS", "FLOAT32_EXACT", "model_structure", "diagnose"]

_RANDOM_LAYERS = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
                  "GaussianDropout", "AlphaDropout")


@dataclasses.dataclass(frozen=True)
class Cause:
    """A likely cause: its catalogue name, what the doctor saw, and the fix."""

    name: str
    evidence: str
    fix: str


def _draws(layer: Any) -> bool:
    """A layer that draws random numbers in training (a Dropout of rate 0 draws nothing)."""
    kind = type(layer).__name__
    return (kind in _RANDOM_LAYERS or kind.startswith("Random")) and getattr(layer, "rate", None) != 0


def model_structure(model: Any) -> Dict[str, Any]:
    """What the causes need from the model itself (plain data, so a child process can send it); for a custom
    training loop, from the Keras model its step trains."""
    loop = isinstance(model, CustomLoop)
    keras_model = model.model if loop else model
    layers = keras_internals.flatten_layers(keras_model)
    return {
        "unsynchronized_batchnorm": [layer.name for layer in layers
                                     if isinstance(layer, keras.layers.BatchNormalization)
                                     and not getattr(layer, "synchronized", False)],
        "random_layers": list(dict.fromkeys(layer.name for layer in layers if _draws(layer))),
        "custom_train_step": loop or type(keras_model).train_step is not keras.Model.train_step,
        "custom_loop": loop,
        "loss_scale_optimizer": isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer),
        "dtype": str(getattr(keras_model, "dtype", "float32") or "float32"),
    }


@dataclasses.dataclass(frozen=True)
class _Facts:
    verdict: Verdict
    single: Trace
    many: Trace
    structure: Dict[str, Any]

    @property
    def replicas(self) -> int:
        return self.many.replicas

    def ratio(self, quantity: str) -> Optional[float]:
        """N-replica value / one-replica value of a scalar part at the first parting step, if there is one."""
        for part in self.verdict.parts:
            if part.quantity == quantity and part.single and part.replicas is not None:
                return float(part.replicas) / float(part.single)
        return None

    def variables_part(self) -> bool:
        return any(p.quantity.startswith("variable ") for p in self.verdict.parts)


def _near(value: Optional[float], target: float) -> bool:
    return value is not None and abs(value - target) <= 1e-3 * abs(target)


def _metric_scaled(f: _Facts) -> Optional[Cause]:
    logs = [p for p in f.verdict.parts if p.quantity.startswith("log ")]
    scaled = [p.quantity[4:] for p in logs if _near(f.ratio(p.quantity), 1.0 / f.replicas)]
    if not scaled or f.variables_part():
        return None
    return Cause("metric-fed-scaled-loss",
                 f"{', '.join(scaled)} on {f.replicas} replicas is 1/{f.replicas} of one replica's at step "
                 f"{f.verdict.first.step} while the weights are equal: a Keras Loss called inside a replica returns "
                 f"loss / num_replicas (so that summed gradients are right), and a metric fed that value reports it",
                 "in a custom train_step, update the metric with the unscaled loss (multiply by "
                 "tf.distribute.get_strategy().num_replicas_in_sync), or compute the loss with self.compute_loss "
                 "and let Keras' loss tracker report it")


def _uneven_batch(f: _Facts) -> Optional[Cause]:
    size = f.single.steps[f.verdict.first.step].batch_size
    if size % f.replicas == 0:
        return None
    return Cause("uneven-last-batch",
                 f"the runs part at step {f.verdict.first.step}, whose batch of {size} examples does not split "
                 f"evenly over {f.replicas} replicas: each replica averages its own part, so the parts weigh "
                 "equally however many examples they hold",
                 f"use a number of examples divisible by the global batch (or drop the last partial batch: "
                 f"dataset.batch(..., drop_remainder=True)), or a global batch divisible by {f.replicas}")


def _gradients_scaled_by_replicas(f: _Facts) -> Optional[float]:
    """The N/1 gradient norm ratio when it is N or 1/N on an evenly split batch, else None."""
    ratio = f.ratio("gradient norm")
    if f.single.steps[f.verdict.first.step].batch_size % f.replicas:
        return None  # an uneven batch changes the weighting too; that cause says so
    return ratio if _near(ratio, f.replicas) or _near(ratio, 1.0 / f.replicas) else None


def _loop_not_scaled(f: _Facts) -> Optional[Cause]:
    ratio = _gradients_scaled_by_replicas(f)
    if ratio is None or not f.structure.get("custom_loop"):
        return None
    return Cause("loop-loss-not-scaled",
                 f"the global gradient norm on {f.replicas} replicas is {ratio:.4g}x one replica's at step "
                 f"{f.verdict.first.step} in a custom training loop: each replica's loss is averaged over its own "
                 f"part of the batch (or summed), not divided by the global batch, and the replicas' gradients are "
                 "then summed",
                 "in the loop's step, tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH) "
                 "(a Keras loss with reduction=None gives the per-example loss), and reduce the step's returned "
                 "loss with strategy.reduce(SUM, ...)")


def _loss_per_replica(f: _Facts) -> Optional[Cause]:
    ratio = _gradients_scaled_by_replicas(f)
    if ratio is None or f.structure.get("custom_loop"):
        return None
    return Cause("loss-reduced-per-replica",
                 f"the global gradient norm on {f.replicas} replicas is {ratio:.4g}x one replica's at step "
                 f"{f.verdict.first.step}: the loss is reduced over each replica's batch, not the global batch",
                 "reduce a custom loss with SUM_OVER_BATCH_SIZE (or divide its sum by the GLOBAL batch size: "
                 "tf.nn.compute_average_loss(per_example_loss, global_batch_size=...)); in a custom train_step use "
                 "self.compute_loss, which scales by the number of replicas")


def _loss_scale(f: _Facts) -> Optional[Cause]:
    quantities = {p.quantity for p in f.verdict.parts}
    if not quantities & {"loss scale", "non-finite gradients", "optimizer iterations"}:
        return None
    a, b = f.single.steps[f.verdict.first.step], f.many.steps[f.verdict.first.step]
    return Cause("loss-scale-skips-on-one-path",
                 f"at step {f.verdict.first.step} the loss scale is {a.loss_scale} vs {b.loss_scale} and the "
                 f"non-finite gradients {a.nonfinite_grads} vs {b.nonfinite_grads}: the LossScaleOptimizer skipped "
                 "the update (non-finite gradients) on one run only",
                 "find where the non-finite gradients come from (`tfaccel doctor --nan`); common fixes: keep the "
                 "last layer and the loss in float32, clip or normalise inputs, lower the learning rate")


def _batchnorm(f: _Facts) -> Optional[Cause]:
    layers = f.structure.get("unsynchronized_batchnorm") or []
    if not layers:
        return None
    return Cause("batchnorm-per-replica",
                 f"BatchNormalization layers {', '.join(layers[:5])} normalise each replica's part of the batch with "
                 f"that part's statistics (1/{f.replicas} of the examples), one replica the whole batch's",
                 "keras.layers.BatchNormalization(..., synchronized=True) computes the statistics over the global "
                 "batch on every replica")


def _random(f: _Facts) -> Optional[Cause]:
    layers = f.structure.get("random_layers") or []
    if not layers:
        return None
    return Cause("random-ops-per-replica",
                 f"random layers {', '.join(layers[:5])} draw their numbers per replica (each replica draws for its "
                 "part of the batch from the same seed state), so the masks/noise differ from one replica's draw",
                 "expected for dropout/noise/augmentation: compare with them inactive (rate 0, or training=False "
                 "augmentation) to check the rest; to draw identically, draw outside the model (in the input "
                 "pipeline, seeded) before the batch is split")


def _replicas_disagree(f: _Facts) -> Optional[Cause]:
    spread = max((s.replica_spread for s in f.many.steps), default=0.0)
    if not spread:
        return None
    where = next(s.spread_variable for s in f.many.steps if s.replica_spread)
    return Cause("replicas-disagree",
                 f"the replicas' copies of {where} differ by {spread:.3g}: a variable updated in each replica "
                 "without aggregation (a non-trainable variable with aggregation NONE, or an ON_READ variable)",
                 "create such variables with aggregation='mean' (or synchronization='on_read' with the reduction "
                 "you mean), or update them with assign inside strategy.extended.update")


def _duplicates(examples: List[str]) -> int:
    return len(examples) - len(set(examples))


def _data_differs(f: _Facts) -> Optional[Cause]:
    first = f.verdict.first
    if first.quantity != EXAMPLES:
        return None
    one, many = f.single.steps[first.step].examples, f.many.steps[first.step].examples
    where = f"at step {first.step} the {f.replicas} replicas trained on {len(many)} examples and one replica on {len(one)}"
    fix = ("in the dataset_fn, shard first (dataset.shard(input_context.num_input_pipelines, "
           "input_context.input_pipeline_id)), shuffle with a fixed seed, and batch by "
           "input_context.get_per_replica_batch_size(global_batch_size)")
    if _duplicates(many) > _duplicates(one):
        return Cause("data-sharding-or-order", f"{where}; {_duplicates(many)} of the {len(many)} are repeats: every "
                     "input pipeline reads the same examples (a dataset_fn that does not call input_context.shard)", fix)
    if len(many) != len(one):
        return Cause("data-sharding-or-order", f"{where}: each pipeline batches by another size than its share of the "
                     "global batch (batch by input_context.get_per_replica_batch_size)", fix)
    return Cause("data-sharding-or-order", f"{where}; {first.difference:g} of them are other ones: the pipelines order "
                 "or shuffle the examples differently (an unseeded shuffle, or a shuffle before shard)", fix)


FLOAT32_EXACT = 2.0 ** 24
"""Past 2**24 a float32 no longer holds every whole number: adding a batch's count or total is rounded."""


def _overflow_in(trace: Trace) -> Optional[str]:
    """What overflows in one run's metric accumulators, now or (at the recorded rate) within one epoch."""
    last = trace.steps[-1].metric_states if trace.steps else {}
    for name, value in last.items():
        if not math.isfinite(value):
            return f"{name} is not finite after {len(trace.steps)} steps"
    if not trace.steps_per_epoch or not last:
        return None
    name, value = max(last.items(), key=lambda item: item[1])
    projected = value * trace.steps_per_epoch / len(trace.steps)
    if projected < FLOAT32_EXACT:
        return None
    at = math.ceil(FLOAT32_EXACT / (value / len(trace.steps)))
    return (f"{name} grows by {value / len(trace.steps):.4g} a step: at that rate it passes 2**24 = 16,777,216 "
            f"(float32 stops adding exactly) at about step {at:,} of an epoch of {trace.steps_per_epoch:,} steps")


def _metric_overflow(f: _Facts) -> Optional[Cause]:
    found = [(t.replicas, _overflow_in(t)) for t in (f.single, f.many)]
    found = [(n, what) for n, what in found if what]
    if not found:
        return None
    return Cause("metric-accumulator-overflow",
                 "; ".join(f"{n} replica{'s' if n > 1 else ''}: {what}" for n, what in found) +
                 ": Keras' metrics (and the loss tracker) add every batch of an epoch into float32 totals and counts",
                 "reset the metrics more often (shorter epochs: steps_per_epoch), keep the metric's values small "
                 "(normalise the targets), or build the metric with dtype='float64' (a Mean(dtype=...))")


CAUSES: List[Callable[[_Facts], Optional[Cause]]] = [
    _data_differs, _metric_scaled, _uneven_batch, _loop_not_scaled, _loss_per_replica, _loss_scale, _batchnorm, _random,
    _replicas_disagree, _metric_overflow]
"""The catalogue, most specific first."""

FINDINGS: List[Callable[[_Facts], Optional[Cause]]] = [_metric_overflow]
"""The causes that are a run's own problem: checked when the runs are equal too."""


def diagnose(verdict: Verdict, single: Trace, many: Trace, structure: Dict[str, Any]) -> List[Cause]:
    """The catalogued causes that explain where the runs part, and the problems a run has of its own (such as a
    metric accumulator overflowing), which are looked for when the runs do not part too."""
    facts = _Facts(verdict, single, many, structure)
    checks = FINDINGS if verdict.equal else CAUSES
    return [cause for cause in (check(facts) for check in checks) if cause is not None]
