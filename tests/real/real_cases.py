"""The real-model parity cases: the suite's "test" jobs (tfaccel.real_suite), each with its stated rule.

A case trains one step (the first batch, one epoch), then the whole job (``epochs`` epochs over ``examples``,
``shuffle=False``); a ``one_batch`` case (the CNNs, whose tracing is the cost) trains ``epochs`` epochs of the first
batch in one fit, whose first epoch is the first step. Both start from initial weights drawn after ``keras.utils.set_random_seed(SEED)`` (the same in every
process: the test checks their digest). The rule, per model: the weights after the first step and the first epoch's
history at the parity tolerance (rel 1e-5 / abs 1e-5), the last epoch's history within ``last_epoch_rel``
(float-level differences between graph compositions grow over steps, most through BatchNormalization).
A MUTANT is a model that differs from the suite's in one way (another learning rate, a dropped regulariser): the
rule must tell it apart from the suite's model, or the parity tests could not catch tfaccel training another model.
"""

import dataclasses
from typing import Any, Callable, Dict, Tuple

from tfaccel.real_suite import get_real_model

SEED = 1234
SIZE = "test"


def _adamw(rate: float) -> Any:
    """AdamW as BERT is fine-tuned (decay on the kernels and embeddings only, the global norm clipped to 1), its decay
    0.1 (BERT's is 0.01) so that a decay applied to an excluded LayerNorm or bias shows at the first step."""
    import keras

    optimizer = keras.optimizers.AdamW(rate, weight_decay=0.1, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


def _sgd(rate: float) -> Any:
    """SGD with Nesterov momentum, each gradient clipped to norm 1, the rate decayed every 4 steps."""
    import keras

    schedule = keras.optimizers.schedules.ExponentialDecay(50 * rate, decay_steps=4, decay_rate=0.9)
    return keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True, clipnorm=1.0)


def _lamb(rate: float) -> Any:
    """LAMB (layer-wise trust ratios: each update scaled by its whole variable's norm)."""
    import keras

    return keras.optimizers.Lamb(rate)


# name -> a fresh optimizer at the suite's learning rate, for the cases that train with another one than the model
# file's Adam
OPTIMIZERS: Dict[str, Callable[[float], Any]] = {"adamw": _adamw, "sgd": _sgd, "lamb": _lamb}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: str
    last_epoch_rel: float
    overrides: Dict[str, Any] = dataclasses.field(default_factory=dict)
    learning_rate_factor: float = 1.0
    one_batch: bool = False  # one fit over one batch (its first epoch is the first step): one trace, not two
    every_path: bool = True  # False: the one-device path only
    multi_process: bool = True  # False: not on the multi_worker and Horovod paths (its ZeRO case runs there)
    shard: bool = False  # tfaccel.fit(shard_optimizer_state=True)
    optimizer: str = ""  # a key of OPTIMIZERS: compiled with it instead of the model file's Adam

    @property
    def reference(self) -> str:
        """The plain Keras case this one is compared with: the same model and optimizer."""
        return f"{self.model}:{self.optimizer}" if self.optimizer else self.model

    @property
    def batch_size(self) -> int:
        return get_real_model(self.model).job(SIZE).batch_size

    @property
    def epochs(self) -> int:
        return get_real_model(self.model).job(SIZE).epochs

    @property
    def input_shape(self) -> Any:
        """One example's shape as the builder takes it (None: the builder's default)."""
        return get_real_model(self.model).job(SIZE).model_options.get("input_shape")

    def fresh_optimizer(self) -> Any:
        """A new optimizer of this case's (``optimizer``, at the suite's rate); None for the model file's Adam."""
        return OPTIMIZERS[self.optimizer](self.learning_rate) if self.optimizer else None

    @property
    def learning_rate(self) -> float:
        return get_real_model(self.model).learning_rate * self.learning_rate_factor

    def build(self) -> Any:
        return get_real_model(self.model).build(SIZE, learning_rate=self.learning_rate,
                                                optimizer=self.fresh_optimizer(), **self.overrides)

    def data(self) -> Tuple[Any, Any]:
        return get_real_model(self.model).data(SIZE, seed=SEED)

    def first_batch(self) -> Tuple[Any, Any]:
        x, y = get_real_model(self.model).data(SIZE, num_examples=self.batch_size, seed=SEED + 1)
        return x, y


# The stated last-epoch tolerance per model (relative, on every history value).
CASES: Dict[str, Case] = {c.name: c for c in [
    Case("bert_classifier", "bert_classifier", 1e-4),
    # GPT-2 trains on the multi-process paths in its ZeRO case (gpt2_causal_lm:zero_sgd); BERT is the transformer
    # those paths train unsharded (CI's time: each case there costs two processes' traces).
    Case("gpt2_causal_lm", "gpt2_causal_lm", 1e-4, multi_process=False),
    # ResNet50 (175 layers) costs the most to trace, in every process of every path (~1.3x MobileNetV3Small); the
    # mirrored path runs the same code for every CNN, and MobileNetV3Small (BatchNormalization, Dropout,
    # depthwise convolutions) covers it. CI's time is spent on ResNet50 where it is its own: one device.
    Case("resnet50", "resnet50", 1e-3, one_batch=True, every_path=False),
    # MobileNetV3Small is the CNN of the single-process paths (one device, mirrored); on the multi-process paths, each
    # of whose processes traces it (15-22 s of its wall each, 2026-11-30), BatchNormalization and Dropout under
    # per-replica semantics are the toy parity suite's case ("BatchNorm + Dropout, partial last batch"), and the
    # layers themselves run the same code as under mirrored. CI's time goes to the transformers and the recommender
    # there.
    Case("mobilenet_v3_small", "mobilenet_v3_small", 1e-3, one_batch=True, multi_process=False),
    Case("recommender", "recommender", 1e-4),
]}

# Each differs from its model in one way; its name is "<model>:<what>".
MUTANTS: Dict[str, Case] = {c.name: c for c in [
    Case("recommender:no_l2", "recommender", 1e-4, overrides={"l2": 0.0}),
    Case("recommender:lr_x1.05", "recommender", 1e-4, learning_rate_factor=1.05),
]}


# The suite's model compiled with another optimizer ("<model>:<optimizer>"): the plain Keras references of the
# ZeRO cases below that train with it.
OTHER_OPTIMIZERS: Dict[str, Case] = {c.name: c for c in [
    Case(f"{model}:{optimizer}", model, 1e-4, optimizer=optimizer)
    for model, optimizer in (("bert_classifier", "adamw"), ("gpt2_causal_lm", "sgd"), ("recommender", "lamb"))
]}

# The suite's model trained by tfaccel with its optimizer state sharded (ZeRO-1), "<model>:zero_<optimizer>": BERT
# with AdamW (decay exclusions, the global norm over sharded and unsharded gradients), GPT-2 with SGD (Nesterov
# momentum, per-variable clipnorm, a schedule), the recommender's dense part with LAMB. CI's time: each case costs 5
# processes' traces; Adam and RMSprop are sharded in the toy cases on every path at 2 and 4 replicas, Adam on BERT
# and GPT-2 in the bench's --real-zero rows. The Embedding tables (token, segment, user, item) stay unsharded.
ZERO: Dict[str, Case] = {c.name: c for c in [
    Case(f"{c.model}:zero_{c.optimizer}", c.model, 1e-4, shard=True, optimizer=c.optimizer)
    for c in OTHER_OPTIMIZERS.values()
]}


def case(name: str) -> Case:
    return CASES.get(name) or MUTANTS.get(name) or OTHER_OPTIMIZERS.get(name) or ZERO[name]


