"""The usual input of each built-in model, used by the memory estimate and its measurement child alike."""

from typing import Dict, Tuple

__all__ = ["DEFAULT_SHAPES"]

# Built-in model name -> (input shape, number of classes) used when the caller gives none.
DEFAULT_SHAPES: Dict[str, Tuple[Tuple[int, ...], int]] = {
    "mnist_cnn": ((28, 28, 1), 10), "mlp": ((28, 28, 1), 10), "resnet20": ((32, 32, 3), 10),
    "resnet50": ((224, 224, 3), 1000), "transformer": ((128,), 2),
}
