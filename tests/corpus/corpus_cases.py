"""Every keras-io corpus case (``CASES``, in registration order), the differences found here and not fixed yet
(``OPEN``), and the intended refusals
(``REFUSES``): importing the case modules registers them."""

import corpus_guides  # noqa: F401  (registers its cases)
import corpus_guides_training  # noqa: F401  (registers its cases)
import corpus_examples  # noqa: F401  (registers its cases)
import corpus_examples_vision  # noqa: F401  (registers its cases)
from corpus_registry import CASES, OPEN, PATHS, REFUSES, SEED

__all__ = ["CASES", "OPEN", "PATHS", "REFUSES", "SEED"]
