"""``stop_recording``: TensorFlow's guard that keeps an outer ``GradientTape`` from recording ops.

``tf.recompute_grad`` uses it so that an eager outer tape does not keep a recomputed block's tensors; TensorFlow
2.21 has no public spelling of it (``tensorflow.python.eager.record.stop_recording``, seen on TF 2.21.0). The
recomputation of ``tfaccel.memory`` uses it the same way. tests/strategies/test_compat_tf_tape.py fails if it moves.
"""

from typing import Any

from tensorflow.python.eager import record

__all__ = ["stop_recording"]


def stop_recording() -> Any:
    """A context manager inside which no ``GradientTape`` records."""
    return record.stop_recording()
