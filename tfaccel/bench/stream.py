"""P6: the same model trained from TFRecord files against training from memory.

The bench writes the data as TFRecord shards (``tfaccel.datasets.write_tfrecords``) and trains a fresh model
with ``tfaccel.compile_and_fit`` from four inputs, every one timed by :class:`tfaccel.bench.timing.Stopwatch`,
in a random order each round:

* ``in_memory``: the arrays as a cached, prefetched ``tf.data`` dataset (the fastest in-memory input Keras' fit
  takes);
* ``streamed``: ``tfaccel.datasets.tfrecord_dataset`` over files of ``config.stream_examples_per_record``
  examples per record (files listed and shuffled, read interleaved, by one thread as the files are local, whole
  blocks parsed in parallel and regrouped into batches, prefetched, all AUTOTUNE; whole files per worker under FILE
  sharding);
* ``naive_stream``: files of one example per record read one after another, one record parsed at a time, no
  prefetch;
* ``in_memory_compiled``: the arrays themselves, which tfaccel trains with its compiled whole-epoch loop.

The first three go through the same loop (Keras fit, ``steps_per_execution`` 64 given, tfaccel's XLA decision),
so ``p6_stream = streamed / in_memory`` and ``p6_naive_stream = naive_stream / in_memory`` measure the input
pipeline alone. A dataset cannot use the compiled loop (it holds the whole epoch's data on the device), so
``p6_stream_of_compiled = streamed / in_memory_compiled`` says what moving the data to files costs a tfaccel job.
"""

import os
import tempfile
import time
from typing import Any, Callable, Dict, List

import tensorflow as tf

from tfaccel.bench.config import BenchConfig, contender_rows, summary
from tfaccel.bench.speed import builder, model_data
from tfaccel.bench.timing import Stopwatch, run_rounds
from tfaccel.datasets import tfrecord_dataset, write_tfrecords
from tfaccel.train.api import compile_and_fit

__all__ = ["STREAM_CONTENDERS", "STREAM_STEPS_PER_EXECUTION", "measure_stream", "naive_tfrecord_dataset"]

STREAM_CONTENDERS = ("in_memory", "streamed", "naive_stream", "in_memory_compiled")
STREAM_STEPS_PER_EXECUTION = 64

Train = Callable[[Any], Dict[str, Any]]


def naive_tfrecord_dataset(files: List[str], *, feature_shape: tuple, batch_size: int) -> Any:
    """The files read one after another, each record parsed on its own, batched, nothing prefetched."""
    size = 1
    for d in feature_shape:
        size *= int(d)
    spec = {"x": tf.io.FixedLenFeature([size], tf.float32), "y": tf.io.FixedLenFeature([1], tf.int64)}

    def parse(record: Any) -> tuple:
        parsed = tf.io.parse_single_example(record, spec)
        return tf.reshape(parsed["x"], feature_shape), tf.cast(parsed["y"][0], tf.int32)

    return tf.data.TFRecordDataset(files).map(parse).batch(batch_size)


def _fit(build: Callable, data: Any, config: BenchConfig, *, given_spe: bool) -> Train:
    def train(timer: Any) -> Dict[str, Any]:
        # Datasets: shuffle=False (the streamed files are shuffled by the pipeline, the cached batches once).
        options = {"steps_per_execution": STREAM_STEPS_PER_EXECUTION, "shuffle": False} if given_spe else {}
        train_data = data() if callable(data) else data
        batch = None if given_spe else config.batch  # datasets come batched
        result = compile_and_fit(build, train_data, epochs=config.epochs, global_batch_size=batch,
                                 strategy="default", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                                 verbose=0, seed=0, callbacks=[timer], **options)
        return {k: str(v) for k, v in result.details.items() if k != "seed"}

    return train


def _contenders(x: Any, y: Any, pattern: str, files: List[str], config: BenchConfig) -> tuple:
    """({contender: train}, {input name: () -> dataset}) of P6."""
    build, b = builder(config.stream_model), config.batch

    def in_memory() -> Any:
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(b).cache().prefetch(
            tf.data.AUTOTUNE)

    def streamed() -> Any:
        return tfrecord_dataset(pattern, feature_shape=x.shape[1:], shuffle_files=True, seed=0, batch_size=b,
                                examples_per_record=config.stream_examples_per_record)

    def naive() -> Any:
        return naive_tfrecord_dataset(files, feature_shape=x.shape[1:], batch_size=b)

    inputs = {"in_memory": in_memory, "streamed": streamed, "naive_stream": naive}
    trains = {name: _fit(build, make, config, given_spe=True) for name, make in inputs.items()}
    return {**trains, "in_memory_compiled": _fit(build, (x, y), config, given_spe=False)}, inputs


def _input_alone(make: Callable[[], Any]) -> Dict[str, float]:
    """One epoch of an input pipeline with no training: wall and process-CPU milliseconds (after a warm-up pass).

    Iterating from Python adds the same per-batch cost to every input; compare the inputs with each other.
    """
    ds = make()
    for _ in ds:
        pass
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in ds:
        pass
    return {"wall_ms": 1000 * (time.perf_counter() - wall), "cpu_ms": 1000 * (time.process_time() - cpu)}


def measure_stream(config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    """P6 over ``config.repeats`` rounds: ratios per round, the files written once to a temporary folder."""
    x, y = model_data(config.stream_examples)
    with tempfile.TemporaryDirectory(prefix="tfaccel-bench-stream-") as tmp:
        files = write_tfrecords(x, y, os.path.join(tmp, "naive"), num_shards=config.stream_shards)
        write_tfrecords(x, y, os.path.join(tmp, "blocks"), num_shards=config.stream_shards,
                        examples_per_record=config.stream_examples_per_record)
        contenders, inputs = _contenders(x, y, os.path.join(tmp, "blocks", "*.tfrecord"), files, config)
        rounds = run_rounds(contenders, stopwatch=stopwatch, config=config, group="stream",
                            examples_per_epoch=len(x))
        inputs_alone = {name: _input_alone(make) for name, make in inputs.items()}
    eps = [{c: r["timings"][c]["examples_per_sec"] for c in contenders} for r in rounds]
    return {"p6_stream": summary([e["streamed"] / e["in_memory"] for e in eps]),
            "p6_naive_stream": summary([e["naive_stream"] / e["in_memory"] for e in eps]),
            "p6_stream_of_compiled": summary([e["streamed"] / e["in_memory_compiled"] for e in eps]),
            "examples_per_sec": contender_rows(rounds, "examples_per_sec"),
            "time_to_train": contender_rows(rounds, "time_to_train"),
            "cpu_per_wall": contender_rows(rounds, "cpu_per_wall"), "input_alone": inputs_alone,
            "order": [r["order"] for r in rounds], "model": config.stream_model, "shards": config.stream_shards,
            "examples_per_record": config.stream_examples_per_record,
            "global_batch_size": config.batch,
            "details": {c: rounds[-1]["timings"][c]["details"] for c in contenders}}
