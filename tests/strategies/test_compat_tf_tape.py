"""compat/tf_tape.py: TensorFlow's private ``stop_recording`` still stops every tape."""

import tensorflow as tf

from tfaccel.compat.tf_tape import stop_recording


def test_an_op_inside_stop_recording_is_not_recorded() -> None:
    x = tf.Variable(3.0)
    with tf.GradientTape(persistent=True) as tape:
        with stop_recording():
            hidden = x * 2.0
        seen = x * 2.0
    assert tape.gradient(hidden, x) is None
    assert float(tape.gradient(seen, x)) == 2.0
