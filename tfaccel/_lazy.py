"""Deferred loading, in one place: module-level lazy exports (a public name imported from its module on first use,
PEP 562) and optional dependencies."""

import importlib
from types import ModuleType
from typing import Any, Dict, List, Mapping


def lazy_exports(package: str, namespace: Dict[str, Any], names: Mapping[str, str],
                 public: List[str]) -> tuple:
    """Returns ``(__getattr__, __dir__)`` for ``package`` that load ``names`` (public name -> module) lazily.

    A loaded value is cached in ``namespace`` so later lookups skip ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list:
        return sorted(public)

    return __getattr__, __dir__


def optional_module(name: str) -> ModuleType:
    """Imports the optional dependency ``name`` (Horovod, matplotlib) where it is used, so that tfaccel imports
    without it; raises ``ImportError`` as ``import`` would. Every other import of the library stands at the top of
    its module (the light modules that must not load TensorFlow defer theirs and say why)."""
    return importlib.import_module(name)
