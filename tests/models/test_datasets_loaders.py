"""tfaccel.datasets.load_dataset: embedded digits, synthetic data, and the Keras-cache loaders tested with small
files written in exactly the format keras.datasets downloads (never downloading)."""

import gzip
import io
import pickle
import shutil
import tarfile
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import pytest

from tfaccel.datasets import DATASET_NAMES, DIGITS_FILE, keras_datasets_dir, load_dataset
from tfaccel.errors import ConfigError


@pytest.fixture
def keras_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty Keras home in a temp folder (KERAS_HOME points at it)."""
    home = tmp_path / "keras_home"
    (home / "datasets").mkdir(parents=True)
    monkeypatch.setenv("KERAS_HOME", str(home))
    return home


def _images(n: int, shape: Tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def test_dataset_names() -> None:
    assert DATASET_NAMES == ("digits", "mnist", "fashion_mnist", "cifar10", "synthetic", "synthetic_text")


def test_digits_split_shapes_and_range() -> None:
    x, y = load_dataset("digits")
    x_test, y_test = load_dataset("digits", split="test")
    assert x.shape == (1438, 8, 8, 1) and x_test.shape == (359, 8, 8, 1)
    assert x.dtype == np.float32 and y.dtype == np.int32 and y.shape == (1438,)
    assert 0.0 <= x.min() and x.max() == 1.0
    assert set(np.unique(y)) == set(range(10))
    # fixed by the seed, disjoint, together the whole dataset
    again, _ = load_dataset("digits")
    np.testing.assert_array_equal(x, again)
    assert not np.array_equal(x, load_dataset("digits", seed=1)[0])
    rows = {r.tobytes() for r in x.reshape(len(x), -1)}
    assert len(x) + len(x_test) == 1797
    assert sum(r.tobytes() in rows for r in x_test.reshape(len(x_test), -1)) < 5  # the set has a few duplicates
    assert load_dataset("digits", num_examples=10)[0].shape == (10, 8, 8, 1)


def test_synthetic_any_shape_seeded_and_learnable() -> None:
    x, y = load_dataset("synthetic", input_shape=(6, 5), num_classes=3, num_examples=600, seed=4)
    assert x.shape == (600, 6, 5) and x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_array_equal(y, load_dataset("synthetic", input_shape=(6, 5), num_classes=3,
                                                  num_examples=600, seed=4)[1])
    x_test, y_test = load_dataset("synthetic", split="test", input_shape=(6, 5), num_classes=3,
                                  num_examples=600, seed=4)
    assert not np.array_equal(x, x_test)
    assert np.bincount(y, minlength=3).min() > 100
    # the labels come from one linear map shared by both splits: a linear least-squares fit on train transfers
    features = np.c_[x.reshape(600, -1), np.ones(600)]
    weights = np.linalg.lstsq(features, np.eye(3)[y], rcond=None)[0]
    predicted = np.argmax(np.c_[x_test.reshape(600, -1), np.ones(600)] @ weights, axis=1)
    assert (predicted == y_test).mean() > 0.85
    assert load_dataset("synthetic")[0].shape == (1024, 28, 28, 1)


def test_synthetic_text_tokens_and_labels() -> None:
    x, y = load_dataset("synthetic_text", sequence_length=20, vocab_size=50, num_classes=3, num_examples=300)
    assert x.shape == (300, 20) and x.dtype == np.int32 and 0 <= x.min() and x.max() < 50
    assert y.shape == (300,) and set(np.unique(y)) == {0, 1, 2}


def test_mnist_from_keras_cache(keras_home: Path) -> None:
    arrays = {"x_train": _images(12, (28, 28), 0), "y_train": np.arange(12, dtype=np.uint8) % 10,
              "x_test": _images(5, (28, 28), 1), "y_test": np.arange(5, dtype=np.uint8)}
    np.savez(keras_home / "datasets" / "mnist.npz", **arrays)
    x, y = load_dataset("mnist")
    assert x.shape == (12, 28, 28, 1) and x.dtype == np.float32 and y.dtype == np.int32
    np.testing.assert_allclose(x[..., 0] * 255.0, arrays["x_train"], atol=1e-4)
    np.testing.assert_array_equal(y, arrays["y_train"])
    x_test, y_test = load_dataset("mnist", split="test", num_examples=3)
    assert x_test.shape == (3, 28, 28, 1) and list(y_test) == [0, 1, 2]


def test_mnist_cache_dir_option(tmp_path: Path) -> None:
    (tmp_path / "datasets").mkdir()
    np.savez(tmp_path / "datasets" / "mnist.npz", x_train=_images(2, (28, 28), 0), y_train=np.zeros(2, np.uint8),
             x_test=_images(1, (28, 28), 0), y_test=np.zeros(1, np.uint8))
    assert load_dataset("mnist", cache_dir=str(tmp_path))[0].shape == (2, 28, 28, 1)


def _write_idx(path: Path, array: np.ndarray, header: int) -> None:
    with gzip.open(path, "wb") as f:
        f.write(b"\0" * header + array.tobytes())


def test_fashion_mnist_from_keras_cache(keras_home: Path) -> None:
    folder = keras_home / "datasets" / "fashion-mnist"
    folder.mkdir()
    x_train, y_train = _images(7, (28, 28), 2), np.arange(7, dtype=np.uint8)
    x_test, y_test = _images(3, (28, 28), 3), np.array([9, 8, 7], np.uint8)
    _write_idx(folder / "train-images-idx3-ubyte.gz", x_train, 16)
    _write_idx(folder / "train-labels-idx1-ubyte.gz", y_train, 8)
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", x_test, 16)
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", y_test, 8)
    x, y = load_dataset("fashion_mnist")
    assert x.shape == (7, 28, 28, 1)
    np.testing.assert_allclose(x[..., 0] * 255.0, x_train, atol=1e-4)
    np.testing.assert_array_equal(y, y_train)
    np.testing.assert_array_equal(load_dataset("fashion_mnist", split="test")[1], y_test)


def _cifar_archive(path: Path, n_per_batch: int = 4) -> Dict[str, Tuple[np.ndarray, list]]:
    """A CIFAR-10 python archive: cifar-10-batches-py/{data_batch_1..5,test_batch}, pickled dicts of bytes keys."""
    batches = {}
    with tarfile.open(path, "w:gz") as tar:
        for i, fname in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
            data = _images(n_per_batch, (3 * 32 * 32,), 10 + i)
            labels = [(i + j) % 10 for j in range(n_per_batch)]
            batches[fname] = (data, labels)
            payload = pickle.dumps({b"batch_label": fname.encode(), b"data": data, b"labels": labels}, protocol=4)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{fname}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return batches


def test_cifar10_from_keras3_archive(keras_home: Path) -> None:
    batches = _cifar_archive(keras_home / "datasets" / "cifar-10-batches-py-target_archive")
    x, y = load_dataset("cifar10")
    assert x.shape == (20, 32, 32, 3) and x.dtype == np.float32 and y.shape == (20,) and y.dtype == np.int32
    first = batches["data_batch_1"][0][0].reshape(3, 32, 32).transpose(1, 2, 0)
    np.testing.assert_allclose(x[0] * 255.0, first, atol=1e-4)
    assert list(y[:4]) == batches["data_batch_1"][1]
    # extracted where Keras 3 extracts it; the next load reads the folder
    assert (keras_home / "datasets" / "cifar-10-batches-py-target" / "cifar-10-batches-py" / "test_batch").is_file()
    x_test, y_test = load_dataset("cifar10", split="test")
    assert x_test.shape == (4, 32, 32, 3) and list(y_test) == batches["test_batch"][1]


def test_cifar10_from_original_tarball_name(keras_home: Path) -> None:
    _cifar_archive(keras_home / "datasets" / "cifar-10-python.tar.gz", n_per_batch=2)
    assert load_dataset("cifar10", num_examples=3)[0].shape == (3, 32, 32, 3)


def test_cifar10_extracts_on_a_python_without_tarfile_filters(keras_home: Path, monkeypatch) -> None:
    """Python before 3.11.4 (Debian 12's 3.11.2) has no ``filter=``: the same rule is checked by hand."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    _cifar_archive(keras_home / "datasets" / "cifar-10-python.tar.gz", n_per_batch=2)
    assert load_dataset("cifar10", num_examples=3)[0].shape == (3, 32, 32, 3)
    for name in ("cifar-10-python.tar.gz", "cifar-10-batches-py-target"):  # a fresh cache: an archive with a link
        path = keras_home / "datasets" / name
        path.unlink() if path.is_file() else shutil.rmtree(path)
    with tarfile.open(keras_home / "datasets" / "cifar-10-python.tar.gz", "w:gz") as tar:
        link = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(ConfigError, match=r"cannot extract .*refusing archive member 'cifar-10-batches-py/data_batch_1'"):
        load_dataset("cifar10")


@pytest.mark.parametrize("name, expected", [
    ("mnist", "datasets/mnist.npz"),
    ("fashion_mnist", "datasets/fashion-mnist/train-images-idx3-ubyte.gz"),
    ("cifar10", "datasets/cifar-10-batches-py-target_archive"),
])
def test_missing_cache_file_names_the_path_and_suggests_digits(keras_home: Path, name: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset(name)
    message = str(info.value)
    assert f"dataset {name!r}: not in the Keras cache and tfaccel never downloads; expected" in message
    assert str(keras_home / expected) in message
    assert "Use dataset 'digits'" in message and f"keras.datasets.{name}.load_data()" in message
    assert list((keras_home / "datasets").iterdir()) == []  # nothing was downloaded or created


def test_keras_datasets_dir_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KERAS_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert keras_datasets_dir() == tmp_path / ".keras" / "datasets"
    assert keras_datasets_dir("/x") == Path("/x/datasets")


def test_corrupt_cache_files(keras_home: Path) -> None:
    np.savez(keras_home / "datasets" / "mnist.npz", x_train=np.zeros((1, 28, 28), np.uint8))
    with pytest.raises(ConfigError, match=r"dataset 'mnist': .*mnist.npz has no array 'y_train'.*must hold "
                                          r"x_train, y_train, x_test, y_test"):
        load_dataset("mnist")
    folder = keras_home / "datasets" / "fashion-mnist"
    folder.mkdir()
    _write_idx(folder / "train-images-idx3-ubyte.gz", _images(2, (28, 28), 0), 16)
    _write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(3, np.uint8), 8)
    with pytest.raises(ConfigError, match=r"dataset 'fashion_mnist': .* holds 1568 pixels, not 28\*28 per each "
                                          r"of the 3 labels"):
        load_dataset("fashion_mnist")
    (keras_home / "datasets" / "cifar-10-python.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(ConfigError, match=r"dataset 'cifar10': cannot extract .*cifar-10-python.tar.gz"):
        load_dataset("cifar10")
    (keras_home / "datasets" / "cifar-10-python.tar.gz").unlink()
    with tarfile.open(keras_home / "datasets" / "cifar-10-python.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("readme.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ConfigError, match=r"does not contain cifar-10-batches-py/ with data_batch_1"):
        load_dataset("cifar10")
    batch_dir = keras_home / "datasets" / "cifar-10-batches-py"
    batch_dir.mkdir()
    for fname in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        (batch_dir / fname).write_bytes(pickle.dumps(print))  # a pickle Keras' restricted unpickler refuses
    with pytest.raises(ConfigError, match=r"dataset 'cifar10': cannot read .*data_batch_1: UnpicklingError: "
                                          r"Refusing to deserialize"):
        load_dataset("cifar10")


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"dataset: unknown value 'imagenet'; valid values are: 'digits', "
                                          r"'mnist', .*'synthetic_text'\. 'digits' is embedded"):
        load_dataset("imagenet")
    with pytest.raises(ConfigError, match=r"dataset 'digits' split: unknown value 'validation'; valid values "
                                          r"are: 'train', 'test'"):
        load_dataset("digits", split="validation")
    with pytest.raises(ConfigError, match=r"dataset 'mnist': unknown option\(s\) 'input_shape'; it accepts: "
                                          r"'cache_dir'"):
        load_dataset("mnist", input_shape=(28, 28, 1))
    with pytest.raises(ConfigError, match=r"dataset 'digits': unknown option\(s\) 'cache_dir'; it accepts: "
                                          r"no options"):
        load_dataset("digits", cache_dir="/x")
    with pytest.raises(ConfigError, match=r"dataset 'digits': num_examples must be a positive integer; "
                                          r"received num_examples=0"):
        load_dataset("digits", num_examples=0)
    with pytest.raises(ConfigError, match=r"dataset 'synthetic': num_classes must be a positive integer; "
                                          r"received num_classes=2.5"):
        load_dataset("synthetic", num_classes=2.5)
    with pytest.raises(ConfigError, match=r"dataset 'synthetic': input_shape entries must be a positive "
                                          r"integer; received input_shape entries=-1"):
        load_dataset("synthetic", input_shape=(4, -1))
    with pytest.raises(ConfigError, match=r"dataset 'synthetic': input_shape must have at least one dimension"):
        load_dataset("synthetic", input_shape=())
    with pytest.raises(ConfigError, match=r"dataset 'synthetic_text': vocab_size must be a positive integer"):
        load_dataset("synthetic_text", vocab_size=0)


def test_digits_are_scikit_learns_without_scikit_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped file holds the values and order of ``sklearn.datasets.load_digits()`` (their hashes, taken from
    scikit-learn 1.9.1), and loading it needs no scikit-learn."""
    import hashlib
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)  # any `import sklearn...` fails
    with np.load(DIGITS_FILE, allow_pickle=False) as data:
        images, target = data["images"], data["target"]
    x = (images.astype(np.float32) / 16.0)[..., None]
    assert hashlib.sha256(x.tobytes()).hexdigest() == \
        "9f578524b6cec1fc800cc52dfc87ebe56264983d490aa72a4bd928ba2570ec77"
    assert hashlib.sha256(target.astype(np.int32).tobytes()).hexdigest() == \
        "3a0e68456f9a3c609b399717dd9ca55bb9153be1bccf72e38e3319cb740c75cd"
    assert len(load_dataset("digits")[0]) + len(load_dataset("digits", split="test")[0]) == 1797
