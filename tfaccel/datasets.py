"""Dataset loaders that never download, and a TFRecord writer/reader for file-based auto-sharding.

:func:`load_dataset` returns ``(x, y)`` NumPy arrays: ``x`` float32 images scaled to [0, 1] (channels last) or
int32 token ids, ``y`` int32 class ids of shape ``(n,)``.

- ``"digits"``: scikit-learn's embedded 8x8 digits (1797 images, no internet needed), shape (8, 8, 1), split
  into train/test (80/20) by a seeded shuffle.
- ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"``: read from the Keras cache (``$KERAS_HOME/datasets``, else
  ``~/.keras/datasets``), in exactly the files and formats ``keras.datasets.*.load_data`` downloads, *only when
  the files are present*. Missing files are a ``ConfigError`` naming the expected path. tfaccel reads the files
  itself instead of calling ``keras.datasets.*.load_data`` because those call ``keras.utils.get_file``, which
  downloads when a file is missing *or its hash differs* (a subset, or a file Keras has not seen) and resolves
  ``KERAS_HOME`` once at import time; tfaccel must never download. CIFAR-10 batches are parsed with Keras' own
  ``load_batch`` (its restricted unpickler).
- ``"synthetic"``: seeded Gaussian features of any shape, labels from a fixed random linear map (learnable).
- ``"synthetic_text"``: seeded token ids; the label is the class most of the tokens vote for through a fixed
  random token -> class table (learnable by an embedding + pooling model such as the reference Transformer).

Example:
    >>> from tfaccel.datasets import load_dataset
    >>> x, y = load_dataset("digits", split="train")
    >>> x.shape[1:], x.dtype
    ((8, 8, 1), dtype('float32'))
"""

import gzip
import os
import pickle
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.log import get_logger

DATASET_NAMES: Tuple[str, ...] = ("digits", "mnist", "fashion_mnist", "cifar10", "synthetic", "synthetic_text")
"""Every name :func:`load_dataset` accepts (the one source of truth for CLI choices and docs)."""

SPLIT_NAMES: Tuple[str, ...] = ("train", "test")

# Options each dataset takes besides split / num_examples / seed; anything else is an error.
_OPTIONS: Dict[str, Tuple[str, ...]] = {
    "digits": (),
    "mnist": ("cache_dir",),
    "fashion_mnist": ("cache_dir",),
    "cifar10": ("cache_dir",),
    "synthetic": ("input_shape", "num_classes"),
    "synthetic_text": ("sequence_length", "vocab_size", "num_classes"),
}

_MNIST_FILE = "mnist.npz"
_FASHION_SUBDIR = "fashion-mnist"
_FASHION_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# Keras 3 get_file(fname="cifar-10-batches-py-target", extract=True) keeps the archive under "<fname>_archive"
# and extracts it to "<fname>/cifar-10-batches-py/"; older tf.keras used "cifar-10-batches-py/" directly.
_CIFAR_BATCH_DIRS = ("cifar-10-batches-py-target/cifar-10-batches-py", "cifar-10-batches-py")
_CIFAR_ARCHIVES = ("cifar-10-batches-py-target_archive", "cifar-10-python.tar.gz", "cifar-10-batches-py.tar.gz")
_CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}

_PREDOWNLOAD_HINT = ("Use dataset 'digits' (embedded, no download) or 'synthetic', or download the file once "
                     "on a machine with internet with keras.datasets.{loader}.load_data() and copy "
                     "~/.keras/datasets to this machine (or point KERAS_HOME at a folder holding datasets/)")


def keras_datasets_dir(cache_dir: Optional[str] = None) -> Path:
    """Returns the folder where Keras keeps downloaded datasets.

    Args:
        cache_dir: the Keras home to use instead of the default. Defaults to None: ``$KERAS_HOME`` if set, else
            ``~/.keras`` (``/tmp/.keras`` when the home folder is not writable, as Keras does).

    Returns:
        ``<keras home>/datasets``.
    """
    if cache_dir is None:
        cache_dir = os.environ.get("KERAS_HOME")
    if cache_dir is None:
        base = os.path.expanduser("~")
        if not os.access(base, os.W_OK):
            base = "/tmp"
        cache_dir = os.path.join(base, ".keras")
    return Path(cache_dir).expanduser() / "datasets"


def _missing(name: str, loader: str, expected: Sequence[Path]) -> ConfigError:
    return ConfigError(
        f"dataset {name!r}: not in the Keras cache and tfaccel never downloads; expected "
        + " or ".join(str(p) for p in expected) + ". " + _PREDOWNLOAD_HINT.format(loader=loader))


def _load_mnist(split: str, cache_dir: Optional[str]) -> Tuple[np.ndarray, np.ndarray]:
    path = keras_datasets_dir(cache_dir) / _MNIST_FILE
    if not path.is_file():
        raise _missing("mnist", "mnist", [path])
    with np.load(path, allow_pickle=False) as data:
        missing = [k for k in (f"x_{split}", f"y_{split}") if k not in data.files]
        if missing:
            raise ConfigError(f"dataset 'mnist': {path} has no array {missing[0]!r} (it has {data.files}); it must "
                              "hold x_train, y_train, x_test, y_test as keras.datasets.mnist writes it. Delete it "
                              "and fetch it again")
        return data[f"x_{split}"], data[f"y_{split}"]


def _read_idx(path: Path, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def _load_fashion_mnist(split: str, cache_dir: Optional[str]) -> Tuple[np.ndarray, np.ndarray]:
    folder = keras_datasets_dir(cache_dir) / _FASHION_SUBDIR
    paths = [folder / f for f in _FASHION_FILES[split]]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise _missing("fashion_mnist", "fashion_mnist", missing)
    labels = _read_idx(paths[1], 8)
    images = _read_idx(paths[0], 16)
    if images.size != labels.size * 28 * 28:
        raise ConfigError(f"dataset 'fashion_mnist': {paths[0]} holds {images.size} pixels, not 28*28 per each of "
                          f"the {labels.size} labels in {paths[1]}; delete both files and fetch them again")
    return images.reshape(len(labels), 28, 28), labels


def _cifar_batch_dir(datasets_dir: Path) -> Optional[Path]:
    for sub in _CIFAR_BATCH_DIRS:
        folder = datasets_dir / sub
        if all((folder / f).is_file() for files in _CIFAR_FILES.values() for f in files):
            return folder
    return None


def _load_cifar10(split: str, cache_dir: Optional[str]) -> Tuple[np.ndarray, np.ndarray]:
    from keras.src.datasets.cifar import load_batch  # Keras' own parser (restricted unpickler)

    datasets_dir = keras_datasets_dir(cache_dir)
    folder = _cifar_batch_dir(datasets_dir)
    if folder is None:
        archive = next((datasets_dir / a for a in _CIFAR_ARCHIVES if (datasets_dir / a).is_file()), None)
        if archive is None:
            raise _missing("cifar10", "cifar10", [datasets_dir / _CIFAR_BATCH_DIRS[0]]
                           + [datasets_dir / a for a in _CIFAR_ARCHIVES])
        target = datasets_dir / "cifar-10-batches-py-target"  # where Keras 3 extracts it too
        get_logger().info("extracting %s to %s", archive, target)
        try:
            with tarfile.open(archive, "r:*") as tar:
                tar.extractall(target, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise ConfigError(f"dataset 'cifar10': cannot extract {archive}: {exc}; delete it and fetch the "
                              "CIFAR-10 python archive again") from exc
        folder = _cifar_batch_dir(datasets_dir)
        if folder is None:
            raise ConfigError(f"dataset 'cifar10': {archive} does not contain cifar-10-batches-py/ with "
                              f"{', '.join(_CIFAR_FILES['train'] + _CIFAR_FILES['test'])}; delete it and fetch "
                              "the CIFAR-10 python archive again")
    xs, ys = [], []
    for fname in _CIFAR_FILES[split]:
        try:
            data, labels = load_batch(str(folder / fname))
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as exc:
            raise ConfigError(f"dataset 'cifar10': cannot read {folder / fname}: {type(exc).__name__}: {exc}; "
                              f"delete {folder} and fetch the CIFAR-10 python archive again") from exc
        xs.append(np.asarray(data, np.uint8))
        ys.append(np.asarray(labels, np.uint8))
    return np.concatenate(xs).transpose(0, 2, 3, 1), np.concatenate(ys)


def _load_digits(split: str, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ConfigError("dataset 'digits': needs scikit-learn; install it with pip install 'tfaccel[data]' "
                          "or use dataset 'synthetic'") from exc
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[..., None]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = len(y) // 5
    idx = order[n_test:] if split == "train" else order[:n_test]
    return x[idx], y[idx]


def _split_offset(split: str) -> int:
    return 0 if split == "train" else 1


def _synthetic(split: str, seed: int, num_examples: int, input_shape: Sequence[int],
               num_classes: int) -> Tuple[np.ndarray, np.ndarray]:
    dim = int(np.prod(input_shape))
    weights = np.random.default_rng([seed, 7]).standard_normal((dim, num_classes)).astype(np.float32)
    x = np.random.default_rng([seed, _split_offset(split)]).standard_normal(
        (num_examples, dim)).astype(np.float32)
    y = np.argmax(x @ weights, axis=1).astype(np.int32)
    return x.reshape((num_examples, *input_shape)), y


def _synthetic_text(split: str, seed: int, num_examples: int, sequence_length: int, vocab_size: int,
                    num_classes: int) -> Tuple[np.ndarray, np.ndarray]:
    token_class = np.random.default_rng([seed, 7]).integers(0, num_classes, size=vocab_size)
    x = np.random.default_rng([seed, _split_offset(split)]).integers(
        0, vocab_size, size=(num_examples, sequence_length)).astype(np.int32)
    votes = np.zeros((num_examples, num_classes), np.int32)
    np.add.at(votes, (np.arange(num_examples)[:, None], token_class[x]), 1)
    return x, np.argmax(votes, axis=1).astype(np.int32)


def _positive_int(name: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"dataset {name!r}: {field} must be a positive integer; received {field}={value!r}")
    return int(value)


def load_dataset(name: str, *, split: str = "train", num_examples: Optional[int] = None, seed: int = 0,
                 **options: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Loads a dataset as NumPy arrays, without ever downloading.

    Args:
        name: one of :data:`DATASET_NAMES`.
        split: ``"train"`` or ``"test"``. Defaults to ``"train"``.
        num_examples: keep only the first ``num_examples`` examples (for the synthetic datasets: how many to
            make). Defaults to None: all (synthetic: 1024).
        seed: seed of the digits train/test split and of the synthetic data; the label map of the synthetic
            datasets depends only on it, so train and test share it. Defaults to 0.
        **options: per dataset. ``mnist``/``fashion_mnist``/``cifar10``: ``cache_dir`` (the Keras home, default
            ``$KERAS_HOME`` or ``~/.keras``). ``synthetic``: ``input_shape`` (default (28, 28, 1)),
            ``num_classes`` (default 10). ``synthetic_text``: ``sequence_length`` (default 64), ``vocab_size``
            (default 1000), ``num_classes`` (default 2).

    Returns:
        ``(x, y)``: ``x`` float32 in [0, 1] with a channel axis (images), float32 (synthetic) or int32 token ids
        (synthetic_text); ``y`` int32 class ids of shape ``(n,)``.

    Raises:
        ConfigError: unknown name, split or option; a bad option value; the Keras cache lacks the files (the
            message names the expected path and suggests ``"digits"`` or pre-downloading).

    Example:
        >>> x, y = load_dataset("synthetic", input_shape=(4,), num_classes=3, num_examples=8)
        >>> x.shape, y.shape
        ((8, 4), (8,))
    """
    if name not in DATASET_NAMES:
        raise invalid_choice("dataset", name, DATASET_NAMES,
                             hint="'digits' is embedded and needs no download")
    if split not in SPLIT_NAMES:
        raise invalid_choice(f"dataset {name!r} split", split, SPLIT_NAMES)
    unknown = sorted(set(options) - set(_OPTIONS[name]))
    if unknown:
        raise ConfigError(f"dataset {name!r}: unknown option(s) {', '.join(repr(u) for u in unknown)}; "
                          f"it accepts: {', '.join(repr(o) for o in _OPTIONS[name]) or 'no options'} "
                          "(besides split, num_examples, seed)")
    if num_examples is not None:
        num_examples = _positive_int(name, "num_examples", num_examples)
    if name == "synthetic":
        input_shape = tuple(options.get("input_shape", (28, 28, 1)))
        for d in input_shape:
            _positive_int(name, "input_shape entries", d)
        if not input_shape:
            raise ConfigError("dataset 'synthetic': input_shape must have at least one dimension; received ()")
        return _synthetic(split, seed, num_examples or 1024, input_shape,
                          _positive_int(name, "num_classes", options.get("num_classes", 10)))
    if name == "synthetic_text":
        return _synthetic_text(split, seed, num_examples or 1024,
                               _positive_int(name, "sequence_length", options.get("sequence_length", 64)),
                               _positive_int(name, "vocab_size", options.get("vocab_size", 1000)),
                               _positive_int(name, "num_classes", options.get("num_classes", 2)))
    if name == "digits":
        x, y = _load_digits(split, seed)
    else:
        loader = {"mnist": _load_mnist, "fashion_mnist": _load_fashion_mnist, "cifar10": _load_cifar10}[name]
        raw_x, raw_y = loader(split, options.get("cache_dir"))
        x = raw_x.astype(np.float32) / 255.0
        if x.ndim == 3:
            x = x[..., None]
        y = np.asarray(raw_y).reshape(-1).astype(np.int32)
    if num_examples is not None:
        x, y = x[:num_examples], y[:num_examples]
    return x, y


def _list_feature(values: np.ndarray, tf: Any) -> Any:
    """A float list, or an int64 list when ``values`` are integers."""
    if np.issubdtype(values.dtype, np.integer):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values.astype(np.int64)))
    return tf.train.Feature(float_list=tf.train.FloatList(value=values.astype(np.float32)))


def _example(x: np.ndarray, y: int, tf: Any) -> bytes:
    feature_y = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)]))
    return tf.train.Example(features=tf.train.Features(
        feature={"x": _list_feature(x.reshape(-1), tf), "y": feature_y})).SerializeToString()


def _block(x: np.ndarray, y: np.ndarray, k: int, tf: Any) -> bytes:
    """One record of up to ``k`` examples: ``x`` and ``y`` zero-padded to ``k`` rows, ``n`` the real count."""
    n = len(x)
    xs = np.zeros((k,) + x.shape[1:], x.dtype)
    xs[:n] = x
    ys = np.zeros(k, np.int64)
    ys[:n] = y
    feature = {"x": _list_feature(xs.reshape(-1), tf),
               "y": tf.train.Feature(int64_list=tf.train.Int64List(value=ys)),
               "n": tf.train.Feature(int64_list=tf.train.Int64List(value=[n]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _check_examples_per_record(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{where}: examples_per_record must be a positive integer (1: one example per record, "
                          f"k > 1: blocks of k examples, e.g. 64); received examples_per_record={value!r}")
    return int(value)


def write_tfrecords(x: np.ndarray, y: np.ndarray, directory: str, *, num_shards: int = 4,
                    prefix: str = "data", examples_per_record: int = 1) -> List[str]:
    """Writes ``(x, y)`` as ``num_shards`` TFRecord files, record ``i`` going to shard ``i % num_shards``.

    Each record is a ``tf.train.Example`` with ``"x"`` (the flattened example: a float list, or an int64 list
    when ``x`` is an integer array) and ``"y"`` (one int64). With ``examples_per_record=k > 1`` record ``i``
    is a block of examples ``i*k .. i*k+k-1``: ``"x"`` holds ``k`` flattened examples, ``"y"`` ``k`` labels (the
    last block zero-padded) and ``"n"`` how many are real. Blocks cost tf.data one record per ``k`` examples
    (reading, interleaving and parsing are per record). Read them back with :func:`tfrecord_dataset` and the
    same ``examples_per_record``: both formats give back the same examples in the same order.

    Args:
        x: examples, first axis the example index.
        y: integer labels, one per example.
        directory: folder to write to (created if missing).
        num_shards: number of files. Defaults to 4.
        prefix: file name prefix; files are ``<prefix>-00000-of-00004.tfrecord``. Defaults to ``"data"``.
        examples_per_record: examples per record. Defaults to 1.

    Returns:
        The paths written, in shard order.

    Raises:
        ConfigError: ``x`` and ``y`` differ in length, ``examples_per_record`` is not a positive integer, or
            ``num_shards`` is not in [1, number of records].

    Example:
        >>> paths = write_tfrecords(x, y, "/tmp/digits", num_shards=4)  # doctest: +SKIP
    """
    import tensorflow as tf

    x, y = np.asarray(x), np.asarray(y).reshape(-1)
    if len(x) != len(y):
        raise ConfigError(f"write_tfrecords: x has {len(x)} examples but y has {len(y)} labels; give one label "
                          "per example")
    k = _check_examples_per_record("write_tfrecords", examples_per_record)
    records = -(-len(x) // k)
    if (isinstance(num_shards, bool) or not isinstance(num_shards, (int, np.integer))
            or not 1 <= num_shards <= max(1, records)):
        raise ConfigError(f"write_tfrecords: num_shards must be an integer from 1 to the number of records "
                          f"({records}: {len(x)} examples, {k} per record); received num_shards={num_shards!r}")
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"{prefix}-{i:05d}-of-{num_shards:05d}.tfrecord") for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    try:
        for i in range(records):
            record = _example(x[i], y[i], tf) if k == 1 else _block(x[i * k:(i + 1) * k], y[i * k:(i + 1) * k], k, tf)
            writers[i % num_shards].write(record)
    finally:
        for writer in writers:
            writer.close()
    return paths


def tfrecord_dataset(pattern: str, *, feature_shape: Sequence[int], dtype: str = "float32",
                     shuffle_files: bool = False, seed: Optional[int] = None,
                     num_parallel_reads: Optional[int] = None, batch_size: Optional[int] = None,
                     input_context: Any = None, examples_per_record: int = 1) -> Any:
    """Reads TFRecord files written by :func:`write_tfrecords` as a ``tf.data.Dataset`` of (x, y).

    The dataset starts from ``tf.data.Dataset.list_files`` and interleaves one ``TFRecordDataset`` per file, so
    ``tf.data`` auto-sharding with ``AutoShardPolicy.FILE`` (or ``AUTO``) gives each worker whole files. Records
    are parsed in parallel (``AUTOTUNE``); with ``batch_size``, a whole batch at a time (``tf.io.parse_example``,
    several times cheaper per example than parsing records one by one) and the batches are prefetched.

    Args:
        pattern: a glob matching the files, e.g. ``"/data/digits/data-*.tfrecord"``.
        feature_shape: shape of one example (x), without the batch dimension.
        dtype: ``"float32"`` or ``"int32"`` (token ids), as written. Defaults to ``"float32"``.
        shuffle_files: shuffle the file order each epoch. Defaults to False (deterministic order).
        seed: seed of the file shuffle. Defaults to None.
        num_parallel_reads: files interleaved at once. Defaults to None: every matched file (at most 64), so
            with ``shuffle_files=False`` the examples come back in the order :func:`write_tfrecords` wrote them.
        input_context: a ``tf.distribute.InputContext``: read only the files of input pipeline
            ``input_pipeline_id`` of ``num_input_pipelines`` (file ``i`` of the sorted list goes to pipeline
            ``i % num_input_pipelines``), e.g. the one ``tfaccel.fit`` gives a ``dataset_fn`` under
            ``parameter_server`` (one pipeline per worker). Defaults to None: every file.
        batch_size: batch the records (the last batch may be smaller), parse each batch at once and prefetch.
            Defaults to None: unbatched examples, not prefetched.
        examples_per_record: as given to :func:`write_tfrecords`. With ``k > 1`` whole blocks are parsed at once
            (``tf.io.parse_example`` over ``max(1, batch_size // k)`` records, in parallel), their padding
            dropped, and the examples regrouped into batches of ``batch_size`` (``Dataset.rebatch``), or
            unbatched. The examples and their order are those of the one-per-record format. Defaults to 1.

    Returns:
        A ``tf.data.Dataset`` of ``(x, y)`` with ``x`` of ``feature_shape`` and ``dtype`` and ``y`` int32 scalars
        (with ``batch_size``: batches of them).

    Raises:
        ConfigError: no file matches ``pattern``, ``dtype`` is not supported, ``batch_size`` or
            ``examples_per_record`` is not a positive integer or differs from what the first file holds, or fewer
            files than ``input_context`` has input pipelines.

    Example:
        >>> ds = tfrecord_dataset("/tmp/digits/data-*.tfrecord", feature_shape=(8, 8, 1))  # doctest: +SKIP
    """
    import tensorflow as tf

    if dtype not in ("float32", "int32"):
        raise invalid_choice("tfrecord_dataset dtype", dtype, ("float32", "int32"))
    k = _check_examples_per_record("tfrecord_dataset", examples_per_record)
    matched = tf.io.gfile.glob(pattern)
    if not matched:
        raise ConfigError(f"tfrecord_dataset: no file matches pattern {pattern!r}; write the files with "
                          "tfaccel.datasets.write_tfrecords(x, y, directory) and pass '<directory>/*.tfrecord'")
    written = _written_examples_per_record(sorted(matched)[0])
    if written is not None and written != k:
        raise ConfigError(f"tfrecord_dataset: examples_per_record={k} but {sorted(matched)[0]!r} holds {written} "
                          f"examples per record (as written by write_tfrecords); pass examples_per_record={written}")
    pipelines = input_context.num_input_pipelines if input_context is not None else 1
    if len(matched) < pipelines:
        raise ConfigError(f"tfrecord_dataset: {len(matched)} files match {pattern!r} but input_context has "
                          f"{pipelines} input pipelines (one per worker), so some would read nothing; write at least "
                          f"{pipelines} shards (write_tfrecords(..., num_shards={pipelines}))")
    feature_shape = tuple(int(d) for d in feature_shape)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                                   or batch_size < 1):
        raise ConfigError(f"tfrecord_dataset: batch_size must be a positive integer or None (unbatched); received "
                          f"batch_size={batch_size!r}")
    # One file per interleave slot (round robin, one record each), so unshuffled files give back the order
    # write_tfrecords wrote; tf.data FILE auto-sharding rewrites `files` and each worker reads whole files.
    cycle = num_parallel_reads or min(len(matched), 64)
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    if pipelines > 1:  # whole files per pipeline, chosen before any shuffling so that pipelines never share one
        files = files.shard(pipelines, input_context.input_pipeline_id)
    if shuffle_files:
        files = files.shuffle(len(matched), seed=seed, reshuffle_each_iteration=True)
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=cycle, block_length=1,
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if k > 1:
        return _parse_blocks(records, feature_shape, dtype, k, batch_size)
    return _parse_records(records, feature_shape, dtype, batch_size)


def _written_examples_per_record(path: str) -> Optional[int]:
    """Examples per record of the first record of ``path`` (1, or k for a block), None when it has none.

    Read with Python file IO (a TFRecord is: uint64 length, uint32 CRC, the bytes, uint32 CRC), not a tf.data
    iterator, so it also works while TensorFlow traces the caller (``create_per_worker_dataset`` traces the
    dataset function: iterating a dataset there fails).
    """
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as fh:
        header = fh.read(12)
        if len(header) < 12:
            return None
        record = fh.read(int.from_bytes(header[:8], "little"))
    features = tf.train.Example.FromString(record).features.feature
    return len(features["y"].int64_list.value) if "n" in features else 1


def _x_spec(feature_shape: Tuple[int, ...], dtype: str, rows: int) -> Any:
    import tensorflow as tf

    size = int(np.prod(feature_shape)) if feature_shape else 1
    return tf.io.FixedLenFeature([rows * size], tf.int64 if dtype == "int32" else tf.float32)


def _parse_records(records: Any, feature_shape: Tuple[int, ...], dtype: str, batch_size: Optional[int]) -> Any:
    """One example per record: parsed one by one (unbatched) or a batch of records at a time, prefetched."""
    import tensorflow as tf

    spec = {"x": _x_spec(feature_shape, dtype, 1), "y": tf.io.FixedLenFeature([1], tf.int64)}

    def parse(record: Any) -> Tuple[Any, Any]:
        parsed = tf.io.parse_single_example(record, spec)
        x = tf.reshape(tf.cast(parsed["x"], dtype), feature_shape)
        return x, tf.cast(parsed["y"][0], tf.int32)

    def parse_batch(records: Any) -> Tuple[Any, Any]:
        parsed = tf.io.parse_example(records, spec)
        x = tf.reshape(tf.cast(parsed["x"], dtype), (-1,) + feature_shape)
        return x, tf.cast(parsed["y"][:, 0], tf.int32)

    if batch_size is None:
        return records.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return records.batch(batch_size).map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _parse_blocks(records: Any, feature_shape: Tuple[int, ...], dtype: str, k: int,
                  batch_size: Optional[int]) -> Any:
    """Blocks of ``k`` examples: parsed several records at a time, padding dropped, regrouped into batches."""
    import tensorflow as tf

    spec = {"x": _x_spec(feature_shape, dtype, k), "y": tf.io.FixedLenFeature([k], tf.int64),
            "n": tf.io.FixedLenFeature([1], tf.int64)}

    def parse_blocks(blocks: Any) -> Tuple[Any, Any]:
        parsed = tf.io.parse_example(blocks, spec)
        real = tf.reshape(tf.sequence_mask(parsed["n"][:, 0], k), [-1])  # drops the last block's padding
        x = tf.boolean_mask(tf.reshape(tf.cast(parsed["x"], dtype), (-1,) + feature_shape), real)
        return x, tf.boolean_mask(tf.cast(tf.reshape(parsed["y"], [-1]), tf.int32), real)

    per_call = max(1, (batch_size or k) // k)
    examples = records.batch(per_call).map(parse_blocks, num_parallel_calls=tf.data.AUTOTUNE)
    if batch_size is None:
        return examples.unbatch()
    return examples.rebatch(batch_size).prefetch(tf.data.AUTOTUNE)
