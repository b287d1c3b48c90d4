"""The two error paths that no real run reaches here, triggered by substituting the failing call."""

import pytest

from tfaccel.cluster import ClusterSpec, TaskInfo
from tfaccel.compat import keras_mwms
from tfaccel.devices import DeviceInfo
from tfaccel.errors import DeviceError


def test_parameter_server_connection_failure_is_explained(monkeypatch, clean_tf_config):
    import tensorflow as tf

    from tfaccel.strategies.builtin import make_parameter_server

    def refuse(*args, **kwargs):
        raise RuntimeError("Deadline Exceeded")

    monkeypatch.setattr(tf.distribute.experimental, "ParameterServerStrategy", refuse)
    spec = ClusterSpec.from_dict({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]})
    with pytest.raises(DeviceError, match=r"parameter_server: could not connect to the cluster \(Deadline Exceeded\)\. "
                                          r"Check that every worker and ps task is running its server"):
        make_parameter_server(devices=DeviceInfo(), task=TaskInfo(spec, "chief", 0))


def test_compat_fix_declines_when_keras_trainer_cannot_be_imported(monkeypatch):
    def missing():
        raise ImportError("No module named 'keras.src.backend.tensorflow.trainer'")

    monkeypatch.setattr(keras_mwms, "_trainer_module", missing)
    reason = keras_mwms.why_not_needed()
    assert reason == ("keras.src.backend.tensorflow.trainer cannot be imported (No module named "
                      "'keras.src.backend.tensorflow.trainer'); not patching")
    assert keras_mwms.is_needed() is False
