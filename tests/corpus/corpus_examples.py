"""keras-io examples on structured data, text and timeseries (github.com/keras-team/keras-io, ``examples/*/*.py``)
as corpus cases: see corpus_registry."""

from typing import Any, Dict

import numpy as np

from corpus_registry import SEED, Runner, case, rng, seed_weights


def _heart(n: int) -> Dict[str, np.ndarray]:
    """Generated rows with the heart-disease columns the structured-data examples use."""
    g = rng()
    rows = {"age": g.integers(29, 77, n), "sex": g.integers(0, 2, n), "cp": g.integers(0, 5, n),
            "trestbps": g.integers(94, 200, n), "chol": g.integers(126, 564, n), "fbs": g.integers(0, 2, n),
            "restecg": g.integers(0, 3, n), "thalach": g.integers(71, 202, n), "exang": g.integers(0, 2, n),
            "oldpeak": g.uniform(0, 6.2, n).round(1), "slope": g.integers(1, 4, n), "ca": g.integers(0, 4, n),
            "thal": g.choice(np.array(["fixed", "normal", "reversible"]), n)}
    rows["target"] = ((rows["age"] > 55) ^ (rows["thal"] == "reversible")).astype("int64")
    return rows


@case("structured data: IntegerLookup / StringLookup in tf.data, Normalization in the model",
      "examples/structured_data/structured_data_classification_from_scratch.py",
      "lookups applied in the dataset pipeline (strings stay in tf.data), adapted Normalization layers in the "
      "model, a dict Dataset with validation_data")
def structured_data_from_scratch(run: Runner) -> Any:
    """The heart-disease classifier. Adaptation: 96 generated rows with the CSV's columns (not the downloaded
    CSV), 72 for training and 24 for validation, batch 16, 2 epochs (the example: 50); the datasets' shuffle
    is left out (one order on every path)."""
    import keras
    import tensorflow as tf
    from keras import layers

    rows = _heart(96)
    numeric = ["age", "trestbps", "chol", "thalach", "oldpeak", "slope"]
    vocabulary = {name: sorted(set(rows[name].tolist())) for name in ("sex", "cp", "fbs", "restecg", "exang",
                                                                        "ca", "thal")}

    def encode_categorical(features: Any, target: Any) -> Any:
        features = dict(features)
        for name, vocab in vocabulary.items():
            lookup = layers.StringLookup if name == "thal" else layers.IntegerLookup
            features[name] = lookup(vocabulary=vocab, mask_token=None, num_oov_indices=0,
                                    output_mode="binary")(features[name])
        return features, target

    def dataset(rows_slice: slice) -> Any:
        features = {k: v[rows_slice] for k, v in rows.items() if k != "target"}
        features = {k: (v.astype("float32") if k in numeric else v) for k, v in features.items()}
        return tf.data.Dataset.from_tensor_slices((features, rows["target"][rows_slice])).map(encode_categorical)

    train_ds, val_ds = dataset(slice(0, 72)).batch(16), dataset(slice(72, 96)).batch(16)
    with run.scope():
        inputs, encoded = {}, []
        for name in ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak",
                     "slope", "ca", "thal"]:
            if name in vocabulary:
                inputs[name] = layers.Input(name=name, shape=(len(vocabulary[name]),), dtype="int64")
                encoded.append(layers.Lambda(lambda t: keras.ops.cast(t, "float32"))(inputs[name]))
            else:
                inputs[name] = layers.Input(name=name, shape=(1,), dtype="float32")
                normalizer = layers.Normalization()
                normalizer.adapt(rows[name][:72].astype("float32")[:, None])
                encoded.append(normalizer(inputs[name]))
        h = layers.Dropout(0.5, seed=SEED)(layers.Dense(32, activation="relu")(layers.concatenate(encoded)))
        model = keras.Model(inputs, layers.Dense(1, activation="sigmoid")(h))
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    seed_weights(model)
    run.fit(model, train_ds, epochs=2, validation_data=val_ds)
    return model


@case("structured data: FeatureSpace (Normalization, IntegerLookup, StringLookup, crosses, CategoryEncoding)",
      "examples/structured_data/structured_data_classification_with_feature_space.py",
      "a FeatureSpace adapted on the data and mapped over the dataset (one-hot encodings and a hashed cross) feeds "
      "a Dense model")
def structured_data_feature_space(run: Runner) -> Any:
    """The heart-disease classifier with keras.utils.FeatureSpace. Adaptation: 96 generated rows (not the
    downloaded CSV), 72 / 24, batch 16, 2 epochs (the example: 20); the datasets' shuffle left out."""
    import keras
    import tensorflow as tf
    from keras import layers
    from keras.utils import FeatureSpace

    rows = _heart(96)
    features = {k: v for k, v in rows.items() if k != "target"}
    features["oldpeak"] = features["oldpeak"].astype("float32")
    data = tf.data.Dataset.from_tensor_slices((features, rows["target"]))
    feature_space = FeatureSpace(
        features={"sex": "integer_categorical", "cp": "integer_categorical", "fbs": "integer_categorical",
                  "restecg": "integer_categorical", "exang": "integer_categorical", "ca": "integer_categorical",
                  "thal": "string_categorical", "age": "float_discretized", "trestbps": "float_normalized",
                  "chol": "float_normalized", "thalach": "float_normalized", "oldpeak": "float_normalized",
                  "slope": "float_normalized"},
        crosses=[FeatureSpace.cross(feature_names=("sex", "age"), crossing_dim=64),
                 FeatureSpace.cross(feature_names=("thal", "ca"), crossing_dim=16)],
        output_mode="concat")
    feature_space.adapt(data.take(72).map(lambda x, _: x).batch(16))
    train_ds = data.take(72).batch(16).map(lambda x, y: (feature_space(x), y))
    val_ds = data.skip(72).batch(16).map(lambda x, y: (feature_space(x), y))
    width = int(next(iter(train_ds))[0].shape[-1])
    with run.scope():
        encoded_features = keras.Input(shape=(width,))
        h = layers.Dropout(0.5, seed=SEED)(layers.Dense(32, activation="relu")(encoded_features))
        model = keras.Model(encoded_features, layers.Dense(1, activation="sigmoid")(h))
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    seed_weights(model)
    run.fit(model, train_ds, epochs=2, validation_data=val_ds)
    return model


@case("wide & deep: StringLookup + Embedding inside the model on string inputs",
      "examples/structured_data/wide_deep_cross_networks.py",
      "string features go into the model as tensors; StringLookup (one-hot and int + Embedding), BatchNorm and "
      "Dropout in the model", reference="one_device",
      open_difference={p: "trains (under mirrored through tfaccel.compat.keras_mwms); history equal to one device, "
                          "final weights 1.8e-05 apart (the rule: 1e-05), the synchronized BatchNorm's cross-replica "
                          "sums in another order" for p in ("mirrored", "multi_worker")})
def wide_and_deep(run: Runner) -> Any:
    """"Experiment 2: Wide & Deep model". Adaptation: two string features (vocabularies of 3 and 4) and two
    numeric ones, 96 generated rows as a Dataset of batch 32 (not the UCI covertype CSV), 3 classes, hidden units
    [8, 8], 2 epochs; plain Keras cannot run the model under MirroredStrategy, so the multi-replica paths are
    compared with one device, and for that BatchNormalization is synchronized (statistics of the global batch, as
    on one device) and Dropout's rate 0.1 is 0 (per-replica mask streams are not one device's)."""
    import math

    import keras
    import tensorflow as tf
    from keras import layers

    g = rng()
    vocabulary = {"soil": ["a", "b", "c"], "area": ["n", "e", "s", "w"]}
    rows = {"soil": g.choice(np.array(vocabulary["soil"]), 96), "area": g.choice(np.array(vocabulary["area"]), 96),
            "elevation": g.normal(size=96).astype("float32"), "slope": g.normal(size=96).astype("float32")}
    target = ((rows["soil"] == "a").astype(int) + (rows["elevation"] > 0)).astype("int64")
    train_dataset = tf.data.Dataset.from_tensor_slices((rows, target)).batch(32)

    def encode_inputs(inputs: Dict[str, Any], use_embedding: bool = False) -> Any:
        encoded_features = []
        for name in inputs:
            if name in vocabulary:
                lookup = layers.StringLookup(vocabulary=vocabulary[name], mask_token=None, num_oov_indices=0,
                                             output_mode="int" if use_embedding else "binary")
                if use_embedding:
                    embedding = layers.Embedding(input_dim=len(vocabulary[name]),
                                                 output_dim=int(math.sqrt(len(vocabulary[name]))))
                    encoded_features.append(embedding(lookup(inputs[name])))
                else:
                    encoded_features.append(lookup(keras.ops.expand_dims(inputs[name], -1)))
            else:
                encoded_features.append(keras.ops.expand_dims(inputs[name], -1))
        return layers.concatenate(encoded_features)

    with run.scope():
        inputs = {name: layers.Input(name=name, shape=(), dtype="string" if name in vocabulary else "float32")
                  for name in rows}
        wide = layers.BatchNormalization(synchronized=True)(encode_inputs(inputs))
        deep = encode_inputs(inputs, use_embedding=True)
        for units in [8, 8]:
            deep = layers.Dense(units)(deep)
            deep = layers.Dropout(0.0, seed=SEED)(layers.ReLU()(layers.BatchNormalization(synchronized=True)(deep)))
        outputs = layers.Dense(units=3, activation="softmax")(layers.concatenate([wide, deep]))
        model = keras.Model(inputs=inputs, outputs=outputs)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001),
                      loss=keras.losses.SparseCategoricalCrossentropy(),
                      metrics=[keras.metrics.SparseCategoricalAccuracy()])
    seed_weights(model)
    run.fit(model, train_dataset, epochs=2)
    return model


def _reviews(n: int) -> tuple:
    g = rng()
    good, bad, filler = ["great", "fun", "moving", "superb"], ["dull", "awful", "boring", "bad"], ["the", "film",
                                                                                                   "plot", "was"]
    labels = g.integers(0, 2, n)
    texts = [" ".join(g.choice(filler + (good if label else bad), 8)) for label in labels]
    return np.array(texts), labels.astype("float32")[:, None]


@case("text classification: TextVectorization in tf.data, Embedding + Conv1D",
      "examples/nlp/text_classification_from_scratch.py",
      "a TextVectorization adapted on the texts and mapped over the dataset feeds an Embedding / Conv1D / "
      "GlobalMaxPooling model, with validation_data")
def text_classification(run: Runner) -> Any:
    """IMDB sentiment "Option 2: apply it to the text dataset to obtain a dataset of word indices". Adaptation:
    96 generated 8-word reviews (not IMDB), vocabulary 20, sequence 8, embedding 8, Conv1D 8 filters, batch 16,
    2 epochs (the example: 3)."""
    import keras
    import tensorflow as tf
    from keras import layers

    texts, labels = _reviews(96)
    vectorize_layer = layers.TextVectorization(max_tokens=20, output_mode="int", output_sequence_length=8)
    vectorize_layer.adapt(texts[:64])

    def vectorize_text(text: Any, label: Any) -> Any:
        return vectorize_layer(tf.expand_dims(text, -1)), label

    train_ds = tf.data.Dataset.from_tensor_slices((texts[:64], labels[:64])).batch(16).map(vectorize_text)
    val_ds = tf.data.Dataset.from_tensor_slices((texts[64:], labels[64:])).batch(16).map(vectorize_text)
    with run.scope():
        inputs = keras.Input(shape=(None,), dtype="int64")
        h = layers.Dropout(0.5, seed=SEED)(layers.Embedding(20, 8)(inputs))
        h = layers.Conv1D(8, 3, padding="valid", activation="relu", strides=1)(h)
        h = layers.Conv1D(8, 3, padding="valid", activation="relu", strides=1)(h)
        h = layers.Dropout(0.5, seed=SEED)(layers.Dense(8, activation="relu")(layers.GlobalMaxPooling1D()(h)))
        model = keras.Model(inputs, layers.Dense(1, activation="sigmoid", name="predictions")(h))
        model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    seed_weights(model)
    run.fit(model, train_ds, validation_data=val_ds, epochs=2)
    return model


@case("preprocessing layers: TextVectorization multi_hot bigrams in tf.data", "guides/preprocessing_layers.py",
      "\"Encoding text as a dense matrix of N-grams with multi-hot encoding\": an adapted TextVectorization "
      "(ngrams=2) mapped over a dataset of strings, a Dense model on the encodings")
def preprocessing_multi_hot(run: Runner) -> Any:
    """The guide's multi-hot bigram example. Adaptation: 64 generated 8-word texts (not the guide's 4 poem lines),
    batch 16, 2 epochs (the guide: 1)."""
    import keras
    import tensorflow as tf
    from keras import layers

    texts, labels = _reviews(64)
    text_vectorizer = layers.TextVectorization(output_mode="multi_hot", ngrams=2)
    text_vectorizer.adapt(texts)
    train_dataset = tf.data.Dataset.from_tensor_slices((texts, labels)).batch(16)
    train_dataset = train_dataset.map(lambda x, y: (text_vectorizer(x), y))
    with run.scope():
        inputs = keras.Input(shape=(text_vectorizer.vocabulary_size(),))
        model = keras.Model(inputs, layers.Dense(1)(inputs))
        model.compile(optimizer="rmsprop", loss="mse")
    seed_weights(model)
    run.fit(model, train_dataset, epochs=2)
    return model


@case("timeseries classification: Conv1D + BatchNorm, three callbacks",
      "examples/timeseries/timeseries_classification_from_scratch.py",
      "a fully convolutional network with BatchNormalization, ModelCheckpoint(save_best_only), ReduceLROnPlateau "
      "and EarlyStopping on val_loss, and validation_split")
def timeseries_classification(run: Runner) -> Any:
    """FordA classification. Adaptation: 80 generated series of 32 steps (not FordA's 500), 2 classes by
    frequency, filters 8 (not 64), batch 16, 3 epochs (the example: 500), patience 1 / 2 (not 20 / 50)."""
    import keras

    g = rng()
    y = g.integers(0, 2, 80)
    t = np.arange(32)[None, :]
    x = (np.sin((1 + y[:, None]) * t / 3.0) + 0.3 * g.normal(size=(80, 32))).astype("float32")[..., None]
    with run.scope():
        input_layer = keras.layers.Input((32, 1))
        h = input_layer
        for _ in range(3):
            h = keras.layers.Conv1D(filters=8, kernel_size=3, padding="same")(h)
            h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
        gap = keras.layers.GlobalAveragePooling1D()(h)
        model = keras.models.Model(inputs=input_layer, outputs=keras.layers.Dense(2, activation="softmax")(gap))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["sparse_categorical_accuracy"])
    seed_weights(model)
    callbacks = [keras.callbacks.ModelCheckpoint(run.path("best_model.keras"), save_best_only=True,
                                                 monitor="val_loss"),
                 keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1, min_lr=0.0001),
                 keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, verbose=0)]
    run.fit(model, x, y, batch_size=16, epochs=3, callbacks=callbacks, validation_split=0.2)
    return model


@case("timeseries forecasting: timeseries_dataset_from_array + LSTM",
      "examples/timeseries/timeseries_weather_forecasting.py",
      "windows from keras.utils.timeseries_dataset_from_array into an LSTM, EarlyStopping and a weights-only "
      "ModelCheckpoint on val_loss")
def timeseries_forecasting(run: Runner) -> Any:
    """Jena climate forecasting. Adaptation: 400 generated steps of 3 features (not the Jena CSV), past 24 /
    sampling_rate 6 / future 6, batch 16, LSTM 8 units (not 32), 2 epochs (the example: 10)."""
    import keras

    g = rng()
    series = np.cumsum(g.normal(size=(400, 3)), axis=0).astype("float32")
    series = (series - series.mean(0)) / series.std(0)
    past, future, step, split = 24, 6, 6, 300

    def windows(start: int, stop: int) -> Any:
        return keras.utils.timeseries_dataset_from_array(
            series[start:stop - past - future], series[start + past + future:stop, :1],
            sequence_length=past // step, sampling_rate=step, batch_size=16)

    dataset_train, dataset_val = windows(0, split), windows(split, 400)
    with run.scope():
        inputs = keras.layers.Input(shape=(past // step, 3))
        model = keras.Model(inputs=inputs, outputs=keras.layers.Dense(1)(keras.layers.LSTM(8)(inputs)))
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001), loss="mse")
    seed_weights(model)
    callbacks = [keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0, patience=5),
                 keras.callbacks.ModelCheckpoint(monitor="val_loss", filepath=run.path("model_checkpoint.weights.h5"),
                                                 verbose=0, save_weights_only=True, save_best_only=True)]
    run.fit(model, dataset_train, epochs=2, validation_data=dataset_val, callbacks=callbacks)
    return model
