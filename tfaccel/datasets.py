"""Dataset loaders that never download, and (from ``tfaccel.tfrecords``) a TFRecord writer/reader for file-based
auto-sharding.

:func:`load_dataset` returns ``(x, y)`` NumPy arrays: ``x`` float32 images scaled to [0, 1] (channels last) or
int32 token ids, ``y`` int32 class ids of shape ``(n,)``.

- ``"digits"``: the 8x8 handwritten digits scikit-learn's ``load_digits`` gives (1797 images, UCI's CC BY 4.0
  data set; shipped in ``tfaccel/data/digits.npz``, see its NOTICE.md: no download and no scikit-learn needed),
  shape (8, 8, 1), split into train/test (80/20) by a seeded shuffle.
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
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.log import get_logger
from tfaccel.tfrecords import tfrecord_dataset, write_tfrecords  # noqa: F401 - part of this module's API

DATASET_NAMES: Tuple[str, ...] = ("digits", "mnist", "fashion_mnist", "cifar10", "synthetic", "synthetic_text")
"""Every name :func:`load_dataset` accepts (the one source of truth for CLI choices and docs)."""

SPLIT_NAMES: Tuple[str, ...] = ("train", "test")

DIGITS_FILE = Path(__file__).resolve().parent / "data" / "digits.npz"
"""The digits images (uint8, 0-16) and labels, as scikit-learn's ``load_digits`` returns them."""

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
    from tfaccel.compat.keras_internals import load_cifar_batch as load_batch  # Keras' own (restricted unpickler)

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
                _extract_data(tar, target)
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
    with np.load(DIGITS_FILE, allow_pickle=False) as data:
        x = (data["images"].astype(np.float32) / 16.0)[..., None]
        y = data["target"].astype(np.int32)
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
    if name in ("synthetic", "synthetic_text"):
        return _make_synthetic(name, split, seed, num_examples or 1024, options)
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


def _make_synthetic(name: str, split: str, seed: int, num_examples: int,
                    options: Dict[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
    """load_dataset's "synthetic" and "synthetic_text", their options checked."""
    if name == "synthetic_text":
        return _synthetic_text(split, seed, num_examples,
                               _positive_int(name, "sequence_length", options.get("sequence_length", 64)),
                               _positive_int(name, "vocab_size", options.get("vocab_size", 1000)),
                               _positive_int(name, "num_classes", options.get("num_classes", 2)))
    input_shape = tuple(options.get("input_shape", (28, 28, 1)))
    for d in input_shape:
        _positive_int(name, "input_shape entries", d)
    if not input_shape:
        raise ConfigError("dataset 'synthetic': input_shape must have at least one dimension; received ()")
    return _synthetic(split, seed, num_examples, input_shape,
                      _positive_int(name, "num_classes", options.get("num_classes", 10)))


def _extract_data(tar: tarfile.TarFile, target: Path) -> None:
    """Extracts an archive's plain files and folders only, inside ``target`` (``tarfile``'s "data" filter; Python
    before 3.11.4 has no filter, so the same rule is checked here: no link, device, absolute path or "..")."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(target, filter="data")
        return
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if not (member.isfile() or member.isdir()) or Path(member.name).is_absolute() or ".." in parts:
            raise tarfile.TarError(f"refusing archive member {member.name!r} (not a plain file or folder inside the "
                                   "archive)")
    tar.extractall(target)
