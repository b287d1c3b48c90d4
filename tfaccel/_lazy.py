"""Module-level lazy exports: a public name is imported from its module on first use (PEP 562)."""

import importlib
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
