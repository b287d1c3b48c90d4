"""``jit_compile="auto"`` on one CPU device: XLA only where measured figures show it pays back over *this* job.

XLA's compilation is paid before its first step; what it saves is paid back step by step. Whether it pays
depends on the model and on how many steps the job runs (a KerasHub BERT job of 72 steps lost 2.3x to its
compilation; its later epochs ran 1.7x faster). So ``"auto"`` counts both, with figures measured on the user's
own model, never a rule extrapolated from another model:

* **Start**: without XLA, unless the decision cache (:mod:`tfaccel.train.decisions`) holds figures measured
  on this model, devices and batch (a run before this one) that predict a shorter job with XLA:
  ``overhead + expected steps x seconds per step`` of each, the job's steps known from its arrays.
* **Measured, not guessed**: the compiled loop builds a setting's passes and calls them once with 0 steps before
  they train (tracing, then the graph optimisation or XLA's one real compilation, each timed; no step runs, so
  nothing trained changes), so its steps are measured clean on a short first chunk of ``measure_steps`` steps.
  After that chunk without XLA, XLA is tried only where the remaining steps could pay an estimated compile back
  ``PAYBACK_MARGIN`` times at the assumed ``PRIOR_SPEEDUP`` (the estimate, ``PRIOR_COMPILE_PER_OVERHEAD`` x the
  no-XLA overhead measured in this job, is only the price of finding out: trying pays the real compile, timed).
  After a chunk with XLA its step is measured: XLA stays only where its steps are faster, and both settings'
  figures (the measured compile in XLA's overhead) go to the decision cache, so the next run of the same job
  decides before its first step and pays nothing. A switch may fall inside the first epoch.
* **Convolutions on CPUs**: XLA:CPU's convolutions were measured far slower than TensorFlow's oneDNN kernels
  (``CONV_CPU_PRIOR``), so for a model with convolution layers the prior is a slow-down, and XLA is tried only
  where the trial itself (its compile and a chunk at that slow-down) costs at most ``TRIAL_SHARE`` of the
  remaining job; once measured (the cache), the model's own figures replace the prior.
* **Random layers**: XLA draws random numbers (Dropout masks, noise) with another kernel than TensorFlow's, so a
  job that switched mid-way would match neither Keras with ``jit_compile=False`` nor with True. A model with a
  layer that draws random numbers in training never switches: XLA is on from the first step (cached figures
  say it pays) or not at all.

Every switch runs the same ``train_step``: the job trains what Keras trains with ``jit_compile=False`` for the
steps before the switch and ``jit_compile=True`` after it.
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
           "DENSE_PRIOR", "CONV_CPU_PRIOR", "TRIAL_SHARE", "MEASURE_SHARE", "MEASURE_MIN_STEPS",
           "MEASURE_MIN_SECONDS", "random_layers",
           "figures_from_chunks", "start_choice", "try_choice", "steps_to_try", "job_decision"]

# Measured here (one CPU device, 2-core machine): XLA's tracing and compilation over the no-XLA overhead (tracing and
# first call) was 2-3x on the bench MLP (2.2 s compile on a loaded machine), 0.6-1.3x on a BertTextClassifier and
# GPT2CausalLM. Only the price of trying: the compile is then measured.
PRIOR_COMPILE_PER_OVERHEAD = 3.0
# Steady speed-up assumed before XLA is measured on the model (measured: 1.7x BERT, 1.7-2.9x GPT-2, 1.6x an MLP).
PRIOR_SPEEDUP = 1.5
# The remaining steps must pay the estimated compile back this many times over before XLA is tried: 1, the
# break-even, so that a job that stays without XLA is never far slower than the same job with it
# (tests/training/test_xla_payback.py checks the bound on each model family's measured figures).
PAYBACK_MARGIN = 1.0
# Where XLA is expected to be slower, its trial (compile + a measuring chunk) may cost at most this share of the
# remaining job.
TRIAL_SHARE = 0.05
# Steps a setting runs before its step time counts as measured: this share of the job's steps, at least
# MEASURE_MIN_STEPS, and at least MEASURE_MIN_SECONDS of them (or an epoch): on a shared machine a chunk of a few
# milliseconds measured a CNN's step 4.7x faster than its epochs ran (2026-11-28, load 14).
MEASURE_SHARE = 0.02
MEASURE_MIN_STEPS = 8
MEASURE_MIN_SECONDS = 0.25


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
                                   "1.2-1.6x on an MLP (one CPU device)")
# tfaccel bench's MNIST CNN (Conv2D 32 3x3 -> MaxPool -> Dense 64 -> Dense 10, batch 32, 2-core CPU, side by side
# in one run): 3.4k examples/s with XLA vs 12.1k without.
CONV_CPU_PRIOR = Prior(3.4 / 12.1, "convolutions on CPU: XLA measured 3.6x slower than TensorFlow's own kernels "
                                   "on a CNN (3.4k vs 12.1k examples/s)")


@dataclasses.dataclass(frozen=True)
class Figures:
    """What one setting (XLA on or off) costs on this model and batch.

    Attributes:
        overhead_s: seconds a job pays besides its steps (tracing, the first call: XLA's compilation).
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


def figures_from_chunks(setup_s: float, chunks: List[Tuple[float, int]]) -> Optional[Figures]:
    """Figures from one setting's runs, each ``(seconds, steps)``, after ``setup_s`` (building its passes and their
    first call, so no run pays a compilation); the step is their seconds over their steps (an average, not the
    fastest run: a short run on a shared machine can be a lucky one). None before any step ran."""
    steps = sum(n for _, n in chunks)
    return Figures(setup_s, sum(seconds for seconds, _ in chunks) / steps) if steps else None


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
               trial_steps: int = 0) -> Tuple[bool, Dict[str, float]]:
    """(try XLA now?, the figures of the test) for the remaining steps of a job measured without XLA.

    With a prior speed-up above 1 the saving it predicts must pay the estimated compile back ``PAYBACK_MARGIN``
    times; with a prior slow-down the trial (compile + ``trial_steps`` at that slow-down) may cost at most
    ``TRIAL_SHARE`` of the remaining steps' time.
    """
    compile_estimate = PRIOR_COMPILE_PER_OVERHEAD * off.overhead_s
    test = {"remaining_steps": remaining_steps, "compile_estimate_s": round(compile_estimate, 3)}
    if prior.speedup > 1:
        saving = remaining_steps * off.step_s * (1 - 1 / prior.speedup)
        return saving >= PAYBACK_MARGIN * compile_estimate, {**test, "saving_estimate_s": round(saving, 3)}
    trial = _trial_cost(off, prior, trial_steps)
    return trial <= TRIAL_SHARE * remaining_steps * off.step_s, {**test, "trial_cost_estimate_s": round(trial, 3)}


def _trial_cost(off: Figures, prior: Prior, trial_steps: int) -> float:
    """What trying XLA costs where it is expected slower: its compile, and its measuring steps' extra time."""
    return PRIOR_COMPILE_PER_OVERHEAD * off.overhead_s + trial_steps * off.step_s * (1 / prior.speedup - 1)


def steps_to_try(off: Figures, *, prior: Prior = DENSE_PRIOR, trial_steps: int = 0) -> int:
    """The fewest remaining steps for which a job measured at ``off`` tries XLA (``try_choice``'s threshold)."""
    if off.step_s <= 0:
        return 0
    if prior.speedup > 1:
        need = PAYBACK_MARGIN * PRIOR_COMPILE_PER_OVERHEAD * off.overhead_s / (off.step_s * (1 - 1 / prior.speedup))
    else:
        need = _trial_cost(off, prior, trial_steps) / (TRIAL_SHARE * off.step_s)
    steps = max(0, math.ceil(need - 1e-9))
    while steps > 0 and try_choice(off, steps - 1, prior=prior, trial_steps=trial_steps)[0]:
        steps -= 1  # float rounding: the threshold is try_choice's own
    while not try_choice(off, steps, prior=prior, trial_steps=trial_steps)[0]:
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
    """The compiled loop's XLA decision before each chunk of steps (see the module doc), with its figures.

    Args:
        steps_per_epoch: training steps of an epoch. epochs: the job's last epoch (exclusive).
        start: XLA from the first step. may_switch: whether the loop may try XLA during the job.
        reason: why it starts the way it does. key: the decision-cache key (None: nothing is cached).
        prior: what XLA is assumed to do to this model's steps until it is measured (``DENSE_PRIOR``, or
            ``CONV_CPU_PRIOR`` for a model with convolutions).
    """

    def __init__(self, *, steps_per_epoch: int, epochs: int, start: bool, may_switch: bool, reason: str,
                 key: Optional[Dict[str, Any]] = None, prior: Prior = DENSE_PRIOR) -> None:
        self.steps_per_epoch, self.epochs, self.jit = steps_per_epoch, epochs, start
        self.may_switch, self.reason, self.key, self.prior = may_switch, reason, key, prior
        self.measure_steps = max(MEASURE_MIN_STEPS, math.ceil(MEASURE_SHARE * epochs * steps_per_epoch))
        self._runs: Dict[bool, Tuple[float, List[Tuple[float, int]]]] = {}  # jit -> (setup s, [(seconds, steps)])
        self._costs: Dict[bool, Dict[str, float]] = {}  # jit -> what building it cost (tracing, first call)
        self.events: List[str] = []

    def next_chunk(self, epoch: int, done: int, whole: int) -> Tuple[bool, int]:
        """(XLA?, the batch to run to) for the next part of 0-based ``epoch``, ``done`` of its ``whole`` batches
        run: a setting not measured yet runs a measuring chunk, then the decision is taken again."""
        if not self.may_switch:
            return self.jit, whole
        self._decide(f"epoch {epoch + 1}, step {done + 1}", (self.epochs - epoch) * self.steps_per_epoch - done)
        if self.may_switch and self.figures(self.jit) is None:  # a measuring chunk, doubling what ran so far
            ran = sum(n for _, n in self._runs.get(self.jit, (0.0, []))[1])
            return self.jit, min(whole, done + max(self.measure_steps, ran))
        return self.jit, whole

    def _decide(self, where: str, remaining: int) -> None:
        off, on = self.figures(False), self.figures(True)
        if not self.jit and on is None and off is not None and remaining > 0:
            go, test = try_choice(off, remaining, prior=self.prior, trial_steps=self.measure_steps)
            if go:
                self.jit = True
                self.events.append(f"{where}: XLA tried ({test})")
        elif self.jit and on is not None and off is not None:
            self.may_switch = False
            kept = on.step_s < off.step_s
            self.jit = kept
            self.events.append(f"{where}: XLA {'kept' if kept else 'off again'} ({on.step_s * 1e3:.3f} ms/step with "
                               f"XLA, {off.step_s * 1e3:.3f} without; compile {on.overhead_s:.2f}s measured)")

    def record(self, jit: bool, seconds: float, steps: int, setup_s: float = 0.0,
               costs: Optional[Dict[str, float]] = None) -> None:
        """``steps`` run in ``seconds`` with setting ``jit`` (``setup_s``: building and first-calling that setting's
        passes, before its first run; ``costs``: its parts, ``trace_s`` and ``first_call_s``, the latter XLA's
        real compilation where ``jit``)."""
        setup, chunks = self._runs.get(jit, (setup_s, []))
        self._runs[jit] = (setup, chunks + [(seconds, steps)])
        if costs:
            self._costs[jit] = {name: round(value, 4) for name, value in costs.items()}

    def figures(self, jit: bool) -> Optional[Figures]:
        """The figures measured in this job for one setting; None until its runs cover ``measure_steps`` steps and
        ``MEASURE_MIN_SECONDS`` seconds, or an epoch."""
        setup, chunks = self._runs.get(jit, (0.0, []))
        steps, seconds = sum(n for _, n in chunks), sum(t for t, _ in chunks)
        if steps < min(self.measure_steps, self.steps_per_epoch) or (
                seconds < MEASURE_MIN_SECONDS and steps < self.steps_per_epoch):
            return None
        return figures_from_chunks(setup, chunks)

    def cache_record(self) -> Optional[Dict[str, Any]]:
        """The record for the decision cache: both settings measured in this job, else None."""
        off, on = self.figures(False), self.figures(True)
        if off is None or on is None:
            return None
        return {"jit_off": off.as_dict(), "jit_on": on.as_dict()}

    def details(self) -> Dict[str, Any]:
        """What ``FitResult.details["xla_auto"]`` shows: the start, each switch, the figures measured (with each
        setting's tracing and first-call seconds: XLA's is its real compilation), the prior, and (once measured
        without XLA) from how many remaining steps XLA would be tried."""
        measured = {("jit_on" if jit else "jit_off"): {**(f.as_dict() if f else {}), **self._costs.get(jit, {})}
                    for jit in self._runs for f in [self.figures(jit)]}
        shown: Dict[str, Any] = {"start": self.reason, "events": list(self.events), "measured": measured,
                                 "expected_steps": self.epochs * self.steps_per_epoch,
                                 "measure_steps": self.measure_steps,
                                 "prior": {"speedup": round(self.prior.speedup, 3), "source": self.prior.source}}
        off = self.figures(False)
        if off is not None:
            shown["try_from_steps"] = steps_to_try(off, prior=self.prior, trial_steps=self.measure_steps)
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
