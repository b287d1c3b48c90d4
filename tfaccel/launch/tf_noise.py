"""TensorFlow's start-up noise in a task's output: the lines ``tfaccel launch`` leaves out of what it echoes.

Every TensorFlow process writes the same banners when it starts (absl's "before InitializeLog" warning and
oneDNN's notice, twice each on TF 2.21: ``TF_CPP_MIN_LOG_LEVEL`` does not reach them), and every
MultiWorkerMirroredStrategy job logs ``Using CollectiveAllReduceStrategy eagerly has significant overhead``
(tfaccel runs its steps in ``tf.function``s; the warning comes from TensorFlow's own set-up calls). They say
nothing about the user's job. The launcher still keeps them in each task's captured output (a failure's tail
shows them), and echoes them when ``TFACCEL_TF_LOGS=1`` is in its environment (``tfaccel launch --tf-logs``).
"""

import os
import re

__all__ = ["TF_LOGS_ENV", "TF_NOISE", "is_tf_noise", "show_tf_logs"]

TF_LOGS_ENV = "TFACCEL_TF_LOGS"

TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:. ]+\d+ port\.cc:\d+\] oneDNN custom operations are on\."
    r"|I\d{4} [\d:. ]+\d+ cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow"
    r"|WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly has significant overhead)")


def is_tf_noise(line: str) -> bool:
    """Whether ``line`` (one line of a task's output) is one of TensorFlow's start-up banners or warnings above."""
    return TF_NOISE.match(line) is not None


def show_tf_logs() -> bool:
    """Whether the launcher echoes TensorFlow's start-up noise (``TFACCEL_TF_LOGS=1``)."""
    return os.environ.get(TF_LOGS_ENV, "") not in ("", "0")
