"""Reference model registry: built-in names and ``path/to/file.py:build_model`` specs -> model builders.

The reference models live as plain Keras files in the repository's ``models/`` folder (no distribution code in
them). They are *not* installed as a top-level ``models`` package: the files are loaded by path with importlib
under a private module name. They are found

1. next to the ``tfaccel`` package, in a checkout or an editable install (``<repo>/models``), or
2. under ``<prefix>/share/tfaccel/models`` after a regular ``pip install`` (``setup.cfg`` ships them there
   through ``[options.data_files]``).

A model spec is one of:

- a built-in name from :data:`MODEL_NAMES` (``"mnist_cnn"``, ``"mlp"``, ``"resnet20"``, ``"resnet50"``,
  ``"transformer"``);
- ``"path/to/file.py"`` or ``"path/to/file.py:attribute"`` (attribute defaults to ``build_model``); a
  relative path is tried against the working directory first, then against the folder holding the built-in
  ``models/`` folder, so ``"models/mlp.py:build_model"`` works from a checkout and after ``pip install``;
- ``"package.module:attribute"`` for an importable module;
- a callable, returned unchanged.

Every builder is called as ``builder(input_shape=..., num_classes=..., **size_options)`` and returns an
uncompiled ``keras.Model`` whose output is float32 class probabilities (softmax), also under mixed policies.

Example:
    >>> from tfaccel.models import get_model_builder
    >>> build = get_model_builder("mlp")
    >>> model = build(input_shape=(8, 8, 1), num_classes=10, hidden_units=(16,))  # doctest: +SKIP
"""

import hashlib
import importlib
import importlib.util
import keyword
import site
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from tfaccel.errors import ConfigError, invalid_choice

# Built-in name -> (file in models/, builder attribute). The one source of truth for the names.
_BUILTIN: Dict[str, Tuple[str, str]] = {
    "mnist_cnn": ("mnist_cnn.py", "build_model"),
    "mlp": ("mlp.py", "build_model"),
    "resnet20": ("resnet.py", "build_resnet20"),
    "resnet50": ("resnet.py", "build_resnet50"),
    "transformer": ("transformer.py", "build_model"),
}

MODEL_NAMES: Tuple[str, ...] = tuple(_BUILTIN)
"""Built-in reference model names, usable wherever a model spec is accepted."""

_DEFAULT_ATTRIBUTE = "build_model"
_MODULE_PREFIX = "_tfaccel_model_file_"

ModelBuilder = Callable[..., Any]


def _candidate_model_dirs() -> List[Path]:
    """Folders where the built-in model files may be, in search order (checkout first, then installed data)."""
    candidates = [Path(__file__).resolve().parent.parent / "models"]
    data_roots = [sys.prefix, sysconfig.get_path("data")]
    user_base = getattr(site, "USER_BASE", None)
    if user_base:
        data_roots.append(user_base)
    for root in data_roots:
        if root:
            candidates.append(Path(root) / "share" / "tfaccel" / "models")
    unique: List[Path] = []
    for path in candidates:
        if path not in unique:
            unique.append(path)
    return unique


def models_dir() -> Path:
    """Returns the folder that holds the built-in reference model files.

    Returns:
        The first of ``<repo>/models`` (checkout or editable install) and ``<prefix>/share/tfaccel/models``
        (regular install) that holds ``mnist_cnn.py``.

    Raises:
        ConfigError: none of the places holds the model files (a broken install).
    """
    candidates = _candidate_model_dirs()
    for path in candidates:
        if (path / _BUILTIN["mnist_cnn"][0]).is_file():
            return path
    raise ConfigError(
        "built-in models: the reference model files were not found; looked in "
        + ", ".join(str(p) for p in candidates)
        + ". Reinstall tfaccel (pip install .) from a checkout that has the models/ folder, "
        "or pass a model file as 'path/to/file.py:build_model'")


def _load_file(path: Path, spec: str) -> ModuleType:
    """Imports a Python file under a private module name derived from its absolute path (cached)."""
    path = path.resolve()
    name = _MODULE_PREFIX + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module = sys.modules.get(name)
    if module is not None:
        return module
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"model {spec!r}: cannot load {path} as a Python file; give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before exec, as `import` does (dataclasses and pickling look it up)
    try:
        module_spec.loader.exec_module(module)
    except (ImportError, SyntaxError) as exc:
        del sys.modules[name]
        raise ConfigError(f"model {spec!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _resolve_path(file_part: str, spec: str) -> Path:
    """Finds a model file: as given (absolute or relative to the working directory), then next to models/."""
    given = Path(file_part).expanduser()
    tried = [given.resolve()]
    if given.is_file():
        return given
    if not given.is_absolute():
        try:
            root = models_dir().parent
        except ConfigError:
            root = None
        if root is not None:
            alt = root / given
            tried.append(alt)
            if alt.is_file():
                return alt
    raise ConfigError(
        f"model {spec!r}: file {file_part!r} not found (looked at {', '.join(str(p) for p in tried)}); "
        f"give an existing .py file as 'path/to/file.py:build_model' or a built-in name: "
        f"{', '.join(repr(n) for n in MODEL_NAMES)}")


def _split_spec(spec: str) -> Tuple[str, Optional[str]]:
    """Splits ``"target:attribute"`` on the last colon when what follows is an identifier."""
    target, sep, attribute = spec.rpartition(":")
    if sep and attribute.isidentifier() and target:
        return target, attribute
    return spec, None


def _attribute(module: ModuleType, attribute: str, spec: str, where: str) -> ModelBuilder:
    if not hasattr(module, attribute):
        found = sorted(n for n, v in vars(module).items() if callable(v) and n.startswith("build"))
        raise ConfigError(
            f"model {spec!r}: {where} has no attribute {attribute!r}; builder functions found there: "
            f"{', '.join(repr(n) for n in found) or 'none'}. Use '{where}:<function>' with one of them")
    builder = getattr(module, attribute)
    if not callable(builder):
        raise ConfigError(
            f"model {spec!r}: {where}:{attribute} is a {type(builder).__name__}, not a callable; it must be a "
            "function build_model(input_shape=..., num_classes=..., **options) -> keras.Model")
    return builder


def get_model_builder(spec: Union[str, ModelBuilder]) -> ModelBuilder:
    """Returns the model builder a spec names.

    Args:
        spec: a built-in name (see :data:`MODEL_NAMES`), ``"path/to/file.py[:attribute]"``,
            ``"package.module:attribute"``, or a callable (returned unchanged).

    Returns:
        A callable ``builder(input_shape=..., num_classes=..., **options) -> keras.Model``.

    Raises:
        ConfigError: the name is unknown (the message lists the built-in names), the file does not exist or
            fails to import, or the attribute is missing or not callable.

    Example:
        >>> get_model_builder("models/mlp.py:build_model").__name__  # doctest: +SKIP
        'build_model'
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"model: expected a built-in name or 'path/to/file.py:build_model'; received {spec!r}. "
            f"Built-in names: {', '.join(repr(n) for n in MODEL_NAMES)}")
    spec = spec.strip()
    if spec in _BUILTIN:
        filename, attribute = _BUILTIN[spec]
        path = models_dir() / filename
        return _attribute(_load_file(path, spec), attribute, spec, str(path))
    target, attribute = _split_spec(spec)
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = _resolve_path(target, spec)
        return _attribute(_load_file(path, spec), attribute or _DEFAULT_ATTRIBUTE, spec, target)
    is_module_path = attribute is not None and all(
        part.isidentifier() and not keyword.iskeyword(part) for part in target.split("."))
    if is_module_path:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(
                f"model {spec!r}: cannot import module {target!r} ({exc}); give a built-in name "
                f"({', '.join(repr(n) for n in MODEL_NAMES)}) or 'path/to/file.py:build_model'") from exc
        return _attribute(module, attribute, spec, target)
    raise invalid_choice("model", spec, MODEL_NAMES,
                         hint="Or give a model file as 'path/to/file.py:build_model' "
                              "(or an importable 'package.module:function')")


def build_model(spec: Union[str, ModelBuilder], *, input_shape: Tuple[int, ...], num_classes: int,
                **options: Any) -> Any:
    """Builds an uncompiled model from a spec (see :func:`get_model_builder`).

    Args:
        spec: a built-in name, ``"path/to/file.py[:attribute]"``, ``"package.module:attribute"`` or a callable.
        input_shape: shape of one example, without the batch dimension.
        num_classes: number of classes.
        **options: size options passed to the builder (e.g. ``hidden_units=(32,)``); an option the builder does
            not take is a ``ConfigError``.

    Returns:
        The uncompiled ``keras.Model``.

    Raises:
        ConfigError: the spec cannot be resolved, or an option is not accepted by the builder.

    Example:
        >>> model = build_model("mlp", input_shape=(8, 8, 1), num_classes=10)  # doctest: +SKIP
    """
    builder = get_model_builder(spec)
    _check_options(builder, spec, options)
    return builder(input_shape=tuple(input_shape), num_classes=int(num_classes), **options)


def _check_options(builder: ModelBuilder, spec: Union[str, ModelBuilder], options: Dict[str, Any]) -> None:
    """Rejects options the builder does not accept, listing the ones it does."""
    import inspect

    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items()
                if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                and n not in ("input_shape", "num_classes")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        name = spec if isinstance(spec, str) else getattr(spec, "__name__", repr(spec))
        raise ConfigError(
            f"model {name!r}: unknown option(s) {', '.join(repr(u) for u in unknown)}; this builder accepts: "
            f"{', '.join(repr(a) for a in accepted) or 'no options'}")
