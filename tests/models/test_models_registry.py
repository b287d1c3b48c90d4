"""tfaccel.models: built-in names and 'path/to/file.py:build_model' specs resolve to builders; errors say why."""

import sys
from pathlib import Path

import pytest

from tfaccel.errors import ConfigError
from tfaccel.models import MODEL_NAMES, build_model, get_model_builder, models_dir

REPO = Path(__file__).resolve().parents[2]


def test_model_names_are_the_documented_ones() -> None:
    assert MODEL_NAMES == ("mnist_cnn", "mlp", "resnet20", "resnet50", "transformer")


def test_builtin_files_are_found_in_the_checkout() -> None:
    assert models_dir() == REPO / "models"
    for name in MODEL_NAMES:
        assert callable(get_model_builder(name))


def test_builtin_name_and_file_spec_resolve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    builder = get_model_builder("mnist_cnn")
    assert builder.__name__ == "build_model"
    assert get_model_builder("mnist_cnn") is builder  # the file is loaded once
    monkeypatch.chdir(REPO)
    mlp = get_model_builder("models/mlp.py:build_model")
    assert mlp is get_model_builder("mlp")  # same file, same module
    # From another directory the relative path falls back to the folder holding models/.
    monkeypatch.chdir(tmp_path)
    assert get_model_builder("models/mlp.py:build_model") is mlp
    assert get_model_builder("models/resnet.py:build_resnet50") is get_model_builder("resnet50")


def test_no_top_level_models_package_is_imported() -> None:
    get_model_builder("mlp")
    assert "models" not in sys.modules or getattr(sys.modules["models"], "__file__", None) is None \
        or not str(sys.modules["models"].__file__).startswith(str(REPO / "models"))


def test_user_file_default_attribute_and_callable(tmp_path: Path) -> None:
    path = tmp_path / "my_model.py"
    path.write_text("import keras\n"
                    "def build_model(input_shape, num_classes):\n"
                    "    inputs = keras.Input(shape=input_shape)\n"
                    "    x = keras.layers.Flatten()(inputs)\n"
                    "    return keras.Model(inputs, keras.layers.Dense(num_classes, activation='softmax')(x))\n"
                    "def build_other(input_shape, num_classes):\n"
                    "    return build_model(input_shape, num_classes)\n")
    assert get_model_builder(str(path)).__name__ == "build_model"
    assert get_model_builder(f"{path}:build_other").__name__ == "build_other"
    model = build_model(str(path), input_shape=(3,), num_classes=2)
    assert model.output_shape == (None, 2)
    fn = lambda input_shape, num_classes: None  # noqa: E731
    assert get_model_builder(fn) is fn


def test_module_spec_resolves() -> None:
    assert get_model_builder("tfaccel.models:models_dir") is models_dir


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        get_model_builder("resnet18")
    message = str(info.value)
    assert "model: unknown value 'resnet18'" in message
    for name in MODEL_NAMES:
        assert repr(name) in message
    assert "path/to/file.py:build_model" in message


def test_empty_spec_is_rejected() -> None:
    with pytest.raises(ConfigError, match="model: expected a built-in name or 'path/to/file.py:build_model'; "
                                          "received ''"):
        get_model_builder("")


def test_missing_file_names_the_paths_tried(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model '.*nope\.py:build_model': file '.*nope\.py' not found "
                                          r"\(looked at .*\); give an existing \.py file"):
        get_model_builder(f"{tmp_path}/nope.py:build_model")


def test_missing_attribute_lists_builders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError, match=r"model 'models/resnet.py:build_resnet18': models/resnet.py has no "
                                          r"attribute 'build_resnet18'; builder functions found there: "
                                          r"'build_model', 'build_resnet20', 'build_resnet50', 'build_resnet_cifar'"):
        get_model_builder("models/resnet.py:build_resnet18")


def test_attribute_not_callable(tmp_path: Path) -> None:
    path = tmp_path / "const.py"
    path.write_text("build_model = 3\n")
    with pytest.raises(ConfigError, match=r"const.py:build_model is a int, not a callable"):
        get_model_builder(f"{path}:build_model")


def test_file_that_fails_to_import(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import not_a_module_tfaccel_xyz\n")
    with pytest.raises(ConfigError, match=r"importing .*broken.py failed: ModuleNotFoundError"):
        get_model_builder(str(path))
    bad = tmp_path / "syntax.py"
    bad.write_text("def (:\n")
    with pytest.raises(ConfigError, match=r"importing .*syntax.py failed: SyntaxError"):
        get_model_builder(str(bad))


def test_module_that_cannot_be_imported() -> None:
    with pytest.raises(ConfigError, match=r"model 'no_such_pkg_xyz.mod:build': cannot import module "
                                          r"'no_such_pkg_xyz.mod'"):
        get_model_builder("no_such_pkg_xyz.mod:build")


def test_unknown_builder_option_lists_accepted_ones() -> None:
    with pytest.raises(ConfigError, match=r"model 'mlp': unknown option\(s\) 'filters'; this builder accepts: "
                                          r"'hidden_units', 'dropout'"):
        build_model("mlp", input_shape=(4,), num_classes=2, filters=3)


def test_models_dir_missing_everywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tfaccel.models as registry

    monkeypatch.setattr(registry, "_candidate_model_dirs", lambda: [tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ConfigError, match=r"built-in models: the reference model files were not found; looked "
                                          r"in .*a, .*b\. Reinstall tfaccel"):
        models_dir()


def test_setup_cfg_ships_every_model_file() -> None:
    """A regular (non-editable) install puts models/*.py under <prefix>/share/tfaccel/models."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    entry = cfg["options.data_files"]["share/tfaccel/models"].split()
    assert entry == ["models/*.py"]
    assert REPO / "models" / "mnist_cnn.py" in list((REPO / "models").glob("*.py"))


def test_installed_layout_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a checkout next to the package, the files are found under <prefix>/share/tfaccel/models."""
    import shutil

    import tfaccel.models as registry

    installed = tmp_path / "share" / "tfaccel" / "models"
    installed.mkdir(parents=True)
    for path in (REPO / "models").glob("*.py"):
        shutil.copy(path, installed)
    monkeypatch.setattr(registry, "_candidate_model_dirs", lambda: [tmp_path / "nothing", installed])
    assert models_dir() == installed
    assert get_model_builder("mlp").__code__.co_filename == str(installed / "mlp.py")
    monkeypatch.chdir(tmp_path / "share")
    assert get_model_builder("models/transformer.py:build_model") is get_model_builder("transformer")
