"""``jit_compile="auto"`` on one CPU device: XLA only where measured figures show it pays back over *this* job.

XLA's compilation is paid before its first step; what it saves is paid back step by step. Whether it pays
depends on the model and on how many steps the job runs (a KerasHub BERT job of 72 steps lost 2.3x to its
compilation; its later epochs ran 1.7x faster). So ``"auto"`` counts both, with figures measured on the user's
own model, never a rule extrapolated from another model:

* **Start**: without XLA, unless the decision cache (:mod:`tfaccel.train.decisions`) holds figures measured
  on this model, devices and batch (a run before this one) that predict a shorter job with XLA:
  ``overhead + expected steps x seconds per step`` of each, the job's steps known from its arrays.
* **Epoch boundaries** (the compiled loop): the no-XLA epochs are real training steps; after two of them the
  no-XLA step time is measured. XLA is tried only when the remaining steps could pay back an estimated compile
  ``PAYBACK_MARGIN`` times over at the assumed ``PRIOR_SPEEDUP``; the compile estimate is
  ``PRIOR_COMPILE_PER_OVERHEAD`` x the no-XLA overhead measured in this job. A short job never tries it. After
  two XLA epochs the XLA step time is measured: XLA stays only where its steps are faster, and both figures go
  to the decision cache, so the next run of the same job decides before its first step and pays nothing.
* **Convolutions on CPUs**: XLA:CPU's convolutions were measured far slower than TensorFlow's oneDNN kernels
  (``CONV_CPU_PRIOR``), so for a model with convolution layers the prior is a slow-down, and XLA is tried only
  where the trial itself (its compilation and two epochs at that slow-down) costs at most ``TRIAL_SHARE`` of the
  remaining job: a long job measures XLA on the user's own model once (then the cache decides), a short one
  never pays for finding out.
* **Random layers**: XLA draws random numbers (Dropout masks, noise) with another kernel than TensorFlow's, so a
  job that switched mid-way would match neither Keras with ``jit_compile=False`` nor with True. A model with a
  layer that draws random numbers in training never switches: XLA is on from the first step (cached figures
  say it pays) or not at all.

Every switch happens between epochs and runs the same ``train_step``: the job trains what Keras trains with
``jit_compile=False`` for the epochs before the switch and ``jit_compile=True`` after it.
"""

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import keras

from tfaccel.compat.keras_internals import flatten_layers
from tfaccel.train.data import batches_per_epoch
from tfaccel.train.decisions import job_key, read_record
from tfaccel.xla import has_convolutions

__all__ = ["Figures", "Prior", "XlaAuto", "PRIOR_COMPILE_PER_OVERHEAD", "PRIOR_SPEEDUP", "PAYBACK_MARGIN",
           "DENSE_PRIOR", "CONV_CPU_PRIOR", "TRIAL_SHARE", "TRIAL_EPOCHS", "random_layers", "figures_from_epochs",
           "start_choice", "try_choice", "steps_to_try", "job_decision"]

# Measured here (bench jobs, one CPU device, 2-core machine): XLA's extra start-up over the no-XLA compiled loop
# was 0.6-1.3x the no-XLA overhead (BertTextClassifier, GPT2CausalLM); 3x leaves room for larger graphs.
PRIOR_COMPILE_PER_OVERHEAD = 3.0
# Steady speed-up assumed before XLA is measured on the model (measured: 1.7x BERT, 1.7-2.9x GPT-2, 1.2x an MLP).
PRIOR_SPEEDUP = 1.5
# The remaining steps must pay the estimated compile back this many times over before XLA is tried.
PAYBACK_MARGIN = 2.0
# Where XLA is expected to be slower, its trial (compile + TRIAL_EPOCHS epochs) may cost at most this share of the
# remaining job.
TRIAL_SHARE = 0.05
# Epochs run with XLA before its steady step time is known (the first pays its compilation).
TRIAL_EPOCHS = 2


@dataclasses.dataclass(frozen=True)
class Prior:
    """What XLA is assumed to do to a model's steps before it is measured on that model.

    Attributes:
        speedup: steady seconds per step without XLA / with it (below 1: XLA expected slower).
        source: what the figure was measured on.
    """

    speedup: float
    source: str


DENSE_PRIOR = Prior(PRIOR_SPEEDUP, "XLA measured 1.7x faster per step on a KerasHub BERT, 1.7-2.9x on a GPT-2, "
                                   "1.2x on an MLP (one CPU device)")
# tfaccel bench's MNIST CNN (Conv2D 32 3x3 -> MaxPool -> Dense 64 -> Dense 10, batch 32, 2-core CPU, side by side
# in one run): 3.4k examples/s with XLA vs 12.1k without.
CONV_CPU_PRIOR = Prior(3.4 / 12.1, "convolutions on CPU: XLA measured 3.6x slower than TensorFlow's own kernels "
                                   "on a CNN (3.4k vs 12.1k examples/s)")


@dataclasses.dataclass(frozen=True)
class Figures:
    """What one setting (XLA on or off) costs on this model and batch.

    Attributes:
        overhead_s: seconds a job pays besides its steps (tracing, XLA compilation, the first call).
        step_s: steady seconds per training step.
    """

    overhead_s: float
    step_s: float

    def seconds(self, steps: int) -> float:
        """Predicted time to train ``steps`` steps from the start."""
        return self.overhead_s + steps * self.step_s

    def as_dict(self) -> Dict[str, float]:
        """The figures rounded for the plan and the cache."""
        return {"overhead_s": round(self.overhead_s, 4), "step_s": round(self.step_s, 6)}


def figures_from_epochs(setup_s: float, epoch_seconds: List[float], steps_per_epoch: int) -> Optional[Figures]:
    """Figures from one setting's epochs in a row (the first pays its tracing/compile, with ``setup_s`` before
    it); None with fewer than two epochs (no steady epoch yet)."""
    if len(epoch_seconds) < 2 or steps_per_epoch < 1:
        return None
    step = min(epoch_seconds[1:]) / steps_per_epoch
    return Figures(max(0.0, setup_s + epoch_seconds[0] - step * steps_per_epoch), step)


def start_choice(record: Optional[Dict[str, Any]], expected_steps: int) -> Tuple[bool, str]:
    """(XLA from the first step?, why) from a decision-cache record of this job, or None without one."""
    if not record:
        return False, ("auto: XLA off to start (no figures measured for this model yet); the compiled loop measures "
                       "its steps and tries XLA only where the remaining steps can pay its compilation back")
    off, on = (Figures(**record[k]) for k in ("jit_off", "jit_on"))
    t_off, t_on = off.seconds(expected_steps), on.seconds(expected_steps)
    verdict = "on" if t_on < t_off else "off"
    return t_on < t_off, (f"auto: XLA {verdict} from cached figures of this model: {expected_steps} steps predicted "
                          f"{t_on:.1f}s with XLA (overhead {on.overhead_s:.1f}s + {on.step_s * 1e3:.2f} ms/step) vs "
                          f"{t_off:.1f}s without ({off.overhead_s:.1f}s + {off.step_s * 1e3:.2f} ms/step)")


def try_choice(off: Figures, remaining_steps: int, *, prior: Prior = DENSE_PRIOR,
               steps_per_epoch: int = 0) -> Tuple[bool, Dict[str, float]]:
    """(try XLA now?, the figures of the test) for the remaining steps of a job measured without XLA.

    With a prior speed-up above 1 the saving it predicts must pay the estimated compile back ``PAYBACK_MARGIN``
    times; with a prior slow-down the trial (compile + ``TRIAL_EPOCHS`` epochs of ``steps_per_epoch`` at that
    slow-down) may cost at most ``TRIAL_SHARE`` of the remaining steps' time.
    """
    compile_estimate = PRIOR_COMPILE_PER_OVERHEAD * off.overhead_s
    test = {"remaining_steps": remaining_steps, "compile_estimate_s": round(compile_estimate, 3)}
    if prior.speedup > 1:
        saving = remaining_steps * off.step_s * (1 - 1 / prior.speedup)
        return saving >= PAYBACK_MARGIN * compile_estimate, {**test, "saving_estimate_s": round(saving, 3)}
    trial = _trial_cost(off, prior, steps_per_epoch)
    return trial <= TRIAL_SHARE * remaining_steps * off.step_s, {**test, "trial_cost_estimate_s": round(trial, 3)}


def _trial_cost(off: Figures, prior: Prior, steps_per_epoch: int) -> float:
    """What trying XLA costs where it is expected slower: its compile, and its trial epochs' extra time."""
    extra_per_step = off.step_s * (1 / prior.speedup - 1)
    return PRIOR_COMPILE_PER_OVERHEAD * off.overhead_s + TRIAL_EPOCHS * steps_per_epoch * extra_per_step


def steps_to_try(off: Figures, *, prior: Prior = DENSE_PRIOR, steps_per_epoch: int = 0) -> int:
    """The fewest remaining steps for which a job measured at ``off`` tries XLA (``try_choice``'s threshold)."""
    if off.step_s <= 0:
        return 0
    if prior.speedup > 1:
        need = PAYBACK_MARGIN * PRIOR_COMPILE_PER_OVERHEAD * off.overhead_s / (off.step_s * (1 - 1 / prior.speedup))
    else:
        need = _trial_cost(off, prior, steps_per_epoch) / (TRIAL_SHARE * off.step_s)
    steps = max(0, math.ceil(need - 1e-9))
    while steps > 0 and try_choice(off, steps - 1, prior=prior, steps_per_epoch=steps_per_epoch)[0]:
        steps -= 1  # float rounding: the threshold is try_choice's own
    while not try_choice(off, steps, prior=prior, steps_per_epoch=steps_per_epoch)[0]:
        steps += 1
    return steps


def random_layers(model: Any) -> List[str]:
    """The names of the model's layers that draw random numbers in training (a Keras ``SeedGenerator``), but
    a Dropout-type layer with rate 0 (it draws nothing)."""
    found = []
    for layer in flatten_layers(model):
        if float(getattr(layer, "rate", 1.0) or 0.0) == 0.0 and hasattr(layer, "rate"):
            continue
        if any(isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values()):
            found.append(layer.name)
    return found


class XlaAuto:
    """The compiled loop's XLA decision at each epoch boundary (see the module doc), with its figures.

    Args:
        steps_per_epoch: training steps of an epoch. epochs: the job's last epoch (exclusive).
        start: XLA from the first step. may_switch: whether the loop may try XLA between epochs.
        reason: why it starts the way it does. key: the decision-cache key (None: nothing is cached).
        prior: what XLA is assumed to do to this model's steps until it is measured (``DENSE_PRIOR``, or
            ``CONV_CPU_PRIOR`` for a model with convolutions).
    """

    def __init__(self, *, steps_per_epoch: int, epochs: int, start: bool, may_switch: bool, reason: str,
                 key: Optional[Dict[str, Any]] = None, prior: Prior = DENSE_PRIOR) -> None:
        self.steps_per_epoch, self.epochs, self.jit = steps_per_epoch, epochs, start
        self.may_switch, self.reason, self.key, self.prior = may_switch, reason, key, prior
        self._runs: Dict[bool, Tuple[float, List[float]]] = {}  # jit -> (setup seconds, epoch seconds in a row)
        self.events: List[str] = []

    def setting_for(self, epoch: int) -> bool:
        """XLA for ``epoch`` (0-based)? Decided from what the epochs before it measured."""
        if not self.may_switch:
            return self.jit
        off, on = self.figures(False), self.figures(True)
        remaining = (self.epochs - epoch) * self.steps_per_epoch
        if not self.jit and on is None and off is not None and remaining > 0:
            go, test = try_choice(off, remaining, prior=self.prior, steps_per_epoch=self.steps_per_epoch)
            if go:
                self.jit = True
                self.events.append(f"epoch {epoch + 1}: XLA tried ({test})")
        elif self.jit and on is not None and off is not None:
            self.may_switch = False
            if on.step_s >= off.step_s:
                self.jit = False
                self.events.append(f"epoch {epoch + 1}: XLA off again ({on.step_s * 1e3:.2f} ms/step with XLA, "
                                   f"{off.step_s * 1e3:.2f} without)")
            else:
                self.events.append(f"epoch {epoch + 1}: XLA kept ({on.step_s * 1e3:.2f} ms/step with XLA, "
                                   f"{off.step_s * 1e3:.2f} without)")
        return self.jit

    def record(self, jit: bool, seconds: float, setup_s: float = 0.0) -> None:
        """One epoch run with setting ``jit`` (``setup_s``: building that setting's functions, before it)."""
        setup, epochs = self._runs.get(jit, (setup_s, []))
        self._runs[jit] = (setup, epochs + [seconds])

    def figures(self, jit: bool) -> Optional[Figures]:
        """The figures measured in this job for one setting (None: fewer than two epochs of it)."""
        setup, epochs = self._runs.get(jit, (0.0, []))
        return figures_from_epochs(setup, epochs, self.steps_per_epoch)

    def cache_record(self) -> Optional[Dict[str, Any]]:
        """The record for the decision cache: both settings measured in this job, else None."""
        off, on = self.figures(False), self.figures(True)
        if off is None or on is None:
            return None
        return {"jit_off": off.as_dict(), "jit_on": on.as_dict()}

    def details(self) -> Dict[str, Any]:
        """What ``FitResult.details["xla_auto"]`` shows: the start, each switch, the figures measured, the prior,
        and (once measured without XLA) from how many remaining steps XLA would be tried."""
        measured = {("jit_on" if jit else "jit_off"): (f.as_dict() if f else "fewer than 2 epochs")
                    for jit in self._runs for f in [self.figures(jit)]}
        shown: Dict[str, Any] = {"start": self.reason, "events": list(self.events), "measured": measured,
                                 "expected_steps": self.epochs * self.steps_per_epoch,
                                 "prior": {"speedup": round(self.prior.speedup, 3), "source": self.prior.source}}
        off = self.figures(False)
        if off is not None:
            shown["try_from_steps"] = steps_to_try(off, prior=self.prior, steps_per_epoch=self.steps_per_epoch)
        return shown


def job_decision(model: Any, *, backend: Any, data: Any, epochs: int, loop_name: str
                 ) -> Tuple[bool, str, Optional[XlaAuto]]:
    """``"auto"``'s XLA setting for this job on one CPU device, before its first step.

    Args:
        model: the user's compiled model. backend: the job's ``Backend``. data: the prepared ``FitData``.
        epochs: the job's ``epochs``. loop_name: the loop that trains it.

    Returns:
        (XLA on?, why, the compiled loop's decider between epochs or None for another loop).
    """
    steps = batches_per_epoch(data)
    prior = CONV_CPU_PRIOR if has_convolutions(model) else DENSE_PRIOR
    if loop_name != "compiled" or not steps:
        return False, (f"auto: XLA off (the {loop_name} loop cannot measure what XLA's compilation costs against "
                       f"what it saves on this job{_prior_note(prior)}; pass jit_compile=True to use it)"), None
    key = job_key(model, backend=backend, batch_size=data.batch_size, loop=loop_name)
    record = read_record(key)
    start, reason = start_choice(record, epochs * steps)
    randoms = random_layers(model)
    if record is None:
        reason += _prior_note(prior)
        if randoms:
            reason += (f"; never switched mid-job: {', '.join(randoms[:3])}{' ...' if len(randoms) > 3 else ''} "
                       "draw random numbers, which XLA draws with another kernel")
    auto = XlaAuto(steps_per_epoch=steps, epochs=epochs, start=start, may_switch=record is None and not randoms,
                   reason=reason, key=key, prior=prior)
    return start, reason, auto


def _prior_note(prior: Prior) -> str:
    """The plan's words for a slow-down prior (nothing for the default one)."""
    if prior.speedup > 1:
        return ""
    return (f"; {prior.source}, so XLA is tried only where its trial costs at most {TRIAL_SHARE:.0%} of the "
            "remaining job")
