"""The keras-io corpus: what a case is, the runner it trains through, and the helpers every case shares.

A case is a keras-io guide or example written as a function of a ``Runner``: where the script builds and compiles
it writes ``with run.scope():`` and where it calls ``model.fit(...)`` it calls ``run.fit(model, ...)``. The same
function then is the plain Keras script (``Runner("keras")``: the strategy's scope, ``model.fit``) and the README's
3-line change (``Runner("tfaccel")``: ``tfaccel.scope()``, ``tfaccel.fit``). Every case names its source (a path
in github.com/keras-team/keras-io) and its adaptation in its docstring: small data generated from a seeded NumPy
generator (nothing is downloaded), tiny sizes and epochs, and initial weights set from a seeded NumPy generator
(``seed_weights``) so that every path starts from the same weights; every fit gets ``shuffle=False`` (a case's
own value aside): with ``shuffle=True`` Keras and tfaccel each draw a permutation of their own (tfaccel's order
is a function of ``(seed, epoch)``, documented in docs/guides/your-script.md), so histories are only comparable
in one order.
"""

import contextlib
import dataclasses
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

SEED = 1234
PATHS = ("default", "mirrored", "multi_worker")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    run: Callable[["Runner"], Any]  # trains the case through the runner and returns the model
    source: str  # a path in keras-team/keras-io
    proves: str
    reference: str = "keras"  # multi-replica paths: "keras" (plain fit, 2 replicas) or "one_device"

    @property
    def adaptation(self) -> str:
        doc = (self.run.__doc__ or "").split("Adaptation:", 1)
        return " ".join(doc[1].split()) if len(doc) == 2 else ""


CASES: Dict[str, Case] = {}
# Differences found here and not fixed yet: (path, case) -> why (each reported to the lead).
OPEN: Dict[Tuple[str, str], str] = {}
# Intended refusals: (path, case) -> a phrase of the ConfigError tfaccel raises before training.
REFUSES: Dict[Tuple[str, str], str] = {}


def case(name: str, source: str, proves: str, *, reference: str = "keras",
         open_difference: Optional[Dict[str, str]] = None,
         refuses: Optional[Dict[str, str]] = None) -> Callable:
    """Registers a case function under ``name``."""
    def register(run: Callable[["Runner"], Any]) -> Callable[["Runner"], Any]:
        assert "Adaptation:" in (run.__doc__ or ""), f"{name}: the docstring must say how the source was adapted"
        CASES[name] = Case(name, run, source, proves, reference)
        for path, why in (open_difference or {}).items():
            OPEN[(path, name)] = why
        for path, phrase in (refuses or {}).items():
            REFUSES[(path, name)] = phrase
        return run
    return register


class Runner:
    """Plain Keras (``kind="keras"``: ``strategy.scope()`` and ``model.fit``) or tfaccel (``kind="tfaccel"``:
    ``tfaccel.scope()`` and ``tfaccel.fit``), as a case's script calls them; keeps every fit's history."""

    def __init__(self, kind: str, out: str, *, strategy: Any = None, jit: Optional[bool] = None) -> None:
        self.kind, self.out, self.strategy, self.jit = kind, out, strategy, jit
        self.history: Dict[str, List[float]] = {}
        self.fits = 0
        self.loops: List[str] = []
        self.plan_strategy: Optional[str] = None
        self.extras: Dict[str, Any] = {}  # what else a case records for comparison (callback log lines, dtypes)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        if self.kind == "keras":
            with self.strategy.scope():
                yield
            return
        import tfaccel

        with tfaccel.scope() as plan:  # the README's change: everything "auto"
            self.plan_strategy = plan.strategy
            yield

    def fit(self, model: Any, *args: Any, **kwargs: Any) -> Dict[str, List[float]]:
        kwargs.setdefault("shuffle", False)  # one example order for every path (see the module docstring)
        if self.kind == "keras":
            if self.jit is not None:  # the XLA setting tfaccel's plan chose (see parity_program's keras_one_xla)
                model.jit_compile = self.jit
            history = model.fit(*args, verbose=0, **kwargs).history
        else:
            import tfaccel

            result = tfaccel.fit(model, *args, verbose=0, **kwargs)
            history = result.history
            self.loops.append(str(result.details.get("loop")))
        self.fits += 1
        prefix = "" if self.fits == 1 else f"fit{self.fits}:"
        self.history.update({prefix + k: [float(v) for v in vals] for k, vals in history.items()})
        return history

    def path(self, name: str) -> str:
        os.makedirs(self.out, exist_ok=True)
        return os.path.join(self.out, name)


# ---------------------------------------------------------------------------------------------- shared helpers
def rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)


_KEPT = ("mean", "variance", "count")  # statistics a preprocessing layer adapted from the data


def seed_weights(model: Any) -> Any:
    """Every float weight from a seeded NumPy generator (the same in every process and under every strategy);
    BatchNormalization's moving statistics at Keras' initial values, adapted statistics (Normalization) and
    integer state (seed generators, lookup counts) as they are."""
    generator = np.random.default_rng(99)
    values = []
    for w in model.weights:
        path = getattr(w, "path", w.name)
        last = path.rsplit("/", 1)[-1]
        current = np.asarray(w.numpy() if hasattr(w, "numpy") else w)
        if "moving_variance" in path:
            values.append(np.ones(w.shape, current.dtype))
        elif "moving_mean" in path:
            values.append(np.zeros(w.shape, current.dtype))
        elif last in _KEPT or current.dtype.kind not in "f":
            values.append(current)
        else:
            scale = 0.3 if len(w.shape) < 2 else float(np.sqrt(2.0 / max(1, int(np.prod(w.shape[:-1])))))
            values.append((scale * generator.normal(size=w.shape)).astype(current.dtype))
    model.set_weights(values)
    return model


def classes(n: int, features: int, k: int, seed: int = 7) -> Tuple[np.ndarray, np.ndarray]:
    """``n`` examples of ``features`` float features whose label (0..k-1) depends on them (a learnable task)."""
    g = rng(seed)
    x = g.normal(size=(n, features)).astype("float32")
    w = g.normal(size=(features, k))
    return x, np.argmax(x @ w + 0.5 * g.normal(size=(n, k)), axis=1).astype("int32")


def images(n: int, size: int, channels: int, k: int, seed: int = 7) -> Tuple[np.ndarray, np.ndarray]:
    """``n`` images in [0, 1) of ``size``x``size``x``channels`` and labels 0..k-1 (brighter quadrants per class)."""
    g = rng(seed)
    y = g.integers(0, k, size=n).astype("int32")
    x = g.uniform(size=(n, size, size, channels)).astype("float32") * 0.5
    half = size // 2
    for i, label in enumerate(y):
        r, c = divmod(int(label) % 4, 2)
        x[i, r * half:(r + 1) * half, c * half:(c + 1) * half] += 0.5
    return x, y

