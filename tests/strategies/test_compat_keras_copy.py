"""tfaccel.compat.keras_copy: Keras' clone_model still unties a layer shared with a nested model and drops a
Functional subclass's class (Keras 3.15.1), and copy_model keeps both."""

import keras

from tfaccel.compat.keras_copy import copy_model


def test_copy_model_keeps_a_functional_subclass_and_its_shared_layer():
    class Tied(keras.Model):  # a Functional subclass built from a nested model, as KerasHub's tasks are
        def __init__(self, backbone, **kwargs):
            ids = keras.Input((4,), dtype="int32")
            out = keras.layers.Add()([backbone(ids), backbone.get_layer("table")(ids)])  # the table used twice
            super().__init__(ids, out, **kwargs)
            self.backbone = backbone

        def get_config(self):
            return {"backbone": keras.saving.serialize_keras_object(self.backbone), "name": self.name}

        @classmethod
        def from_config(cls, config):
            return cls(keras.saving.deserialize_keras_object(config.pop("backbone")), **config)

    ids = keras.Input((4,), dtype="int32")
    model = Tied(keras.Model(ids, keras.layers.Embedding(10, 3, name="table")(ids)), name="tied")
    model.compile(optimizer="sgd", loss="mse")
    assert len(keras.models.clone_model(model).trainable_variables) == 2  # Keras' clone: the table untied
    copy = copy_model(model)
    assert type(copy) is Tied and copy.name == "tied" and len(copy.trainable_variables) == 1 and not copy.compiled
    plain = copy_model(model.backbone)
    assert type(plain) is type(model.backbone) and len(plain.trainable_variables) == 1
