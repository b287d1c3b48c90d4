"""Child program of tests/training/test_per_output_losses.py: one task of a chief + 1 worker + 1 ps cluster.

The ps and worker tasks serve (ps_parity_job.serve_unless_chief). The chief trains a model with two outputs (loss weights, a
partial last batch, sample weights) with plain Keras ``model.fit`` on this process and with ``tfaccel.fit`` under
strategy="parameter_server", from the same initial weights; prints one JSON line with both histories.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ps_parity_job import data, serve_unless_chief  # noqa: E402


def build():
    import keras

    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    return keras.Model(inputs, {"cls": keras.layers.Dense(3, activation="softmax", name="cls")(hidden),
                                "reg": keras.layers.Dense(1, name="reg")(hidden)})


def compile_(model):
    import keras

    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                  loss={"cls": "categorical_crossentropy", "reg": "mse"}, loss_weights={"cls": 1.0, "reg": 0.5})


def main() -> int:
    done = serve_unless_chief()
    try:
        import keras
        import numpy as np

        import tfaccel

        x, labels, sw, _ = data()  # 100 examples: 6 batches of 16 and a partial batch of 4
        y = {"cls": labels, "reg": x[:, :1]}
        keras.utils.set_random_seed(0)
        initial = build().get_weights()
        fit_args = dict(x=x, y=y, sample_weight=sw, batch_size=16, epochs=3, shuffle=False, verbose=0)
        reference = build()
        reference.set_weights(initial)
        compile_(reference)
        expected = reference.fit(**fit_args).history
        expected_weights = reference.get_weights()  # read before joining the cluster resets the context
        with tfaccel.scope(strategy="parameter_server"):
            model = build()
            model.set_weights(initial)
            compile_(model)
        result = tfaccel.fit(model, seed=0, **fit_args)
        weights = [np.asarray(w) for w in result.model.get_weights()]
        print(json.dumps({"loop": result.details["loop"], "history": result.history, "expected": expected,
                          "max_weight_diff": max(float(np.max(np.abs(a - b)))
                                                 for a, b in zip(weights, expected_weights))}), flush=True)
    finally:
        open(done, "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
