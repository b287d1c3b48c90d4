"""Every touch of Keras / TensorFlow internals: version-guarded fixes for upstream bugs, and accessors.

Each fix module here fixes one upstream problem, names the upstream issues, says on which versions it was
seen, and offers ``is_needed()``, ``apply()``, ``remove()`` and ``is_applied()``. A fix can be switched off
with the environment variable ``TFACCEL_DISABLE_COMPAT`` (comma-separated fix names, or ``all``), so that
a test can check the upstream failure still happens (and tell us when a fix can be retired).
``keras_internals`` holds the small accessors of internals that are no fix (Keras' validation split, its
reduction of step outputs, ...) and ``keras_optimizer`` the optimizer subclass tfaccel swaps in; each names
the versions it was checked on and has a test that fails when the internal moves. Outside this package,
tfaccel reads no ``keras.src``, no ``tf.__internal__`` and no private attribute of a Keras object.
"""

import os
from typing import Any, Dict, Mapping, Optional, Tuple

VersionWindow = Tuple[Tuple[int, int], Tuple[int, int]]  # [low, high) of (major, minor)

__all__ = ["DISABLE_ENV", "VersionWindow", "is_disabled", "switched_off", "major_minor", "outside_versions", "gate",
           "ClassSwap"]

DISABLE_ENV = "TFACCEL_DISABLE_COMPAT"


def is_disabled(name: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``TFACCEL_DISABLE_COMPAT`` lists ``name`` (or ``all``).

    Args:
        name: the fix's module name, e.g. ``"keras_mwms"``.
        environ: the environment to read. Defaults to ``os.environ``.

    Returns:
        Whether the user switched this fix off.
    """
    env = os.environ if environ is None else environ
    names = {part.strip() for part in env.get(DISABLE_ENV, "").split(",") if part.strip()}
    return name in names or "all" in names


def switched_off(name: str) -> str:
    """The one phrase every fix uses to say the user switched it off: ``"switched off by TFACCEL_DISABLE_COMPAT
    (keras_mwms)"``."""
    return f"switched off by {DISABLE_ENV} ({name})"


def major_minor(version: str) -> Tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"2.21.0"`` or ``"3.15.1rc0"``; ``(0, 0)`` when unreadable."""
    parts = str(version).split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def outside_versions(library: str, version: str, affected: VersionWindow, if_it_fails: str) -> Optional[str]:
    """Why a fix is left alone when ``version`` lies outside the versions it is known to be needed on, else None.

    Args:
        library: the library's name in the message, e.g. ``"Keras"``.
        version: its installed version, e.g. ``keras.__version__``.
        affected: ``(low, high)``: the fix is needed from ``low`` up to, not including, ``high`` (major, minor).
        if_it_fails: what to do if the upstream problem shows after all, e.g. ``"model.fit fails ..., see ..."``.

    Returns:
        None inside the window; else one line naming the version, the window and ``if_it_fails``.

    Example:
        >>> outside_versions("Keras", "3.16.0", ((3, 0), (3, 16)), "it fails, see keras#1")
        'Keras 3.16.0 is outside the versions this fix is known to be needed on (3.0 up to 3.15.x); not patching. If it fails, see keras#1'
    """
    low, high = affected
    if low <= major_minor(version) < high:
        return None
    return (f"{library} {version} is outside the versions this fix is known to be needed on "
            f"({low[0]}.{low[1]} up to {high[0]}.{high[1] - 1}.x); not patching. If {if_it_fails}")


def gate(name: str, library: str, version: str, affected: VersionWindow, if_it_fails: str) -> Optional[str]:
    """The check every fix makes first: why fix ``name`` is left alone (switched off by ``TFACCEL_DISABLE_COMPAT``,
    or ``version`` of ``library`` outside ``affected``; see outside_versions), or None when the fix may apply."""
    if is_disabled(name):
        return switched_off(name)
    return outside_versions(library, version, affected, if_it_fails)


class ClassSwap:
    """A fix's subclass swapped onto an instance and given back: ``mixin`` before the instance's own class, under the
    same name and module (a saved .keras file names the user's class); ``mark``: the attribute that keeps the class it
    had, one per fix, so that fixes swapped on in turn are given back in the reverse order."""

    def __init__(self, mixin: type, mark: str) -> None:
        self.mixin, self.mark = mixin, mark
        self._made: Dict[type, type] = {}

    def apply(self, obj: Any) -> None:
        """Swaps the subclass onto ``obj`` (nothing when it is on already)."""
        if self.is_applied(obj):
            return
        base = type(obj)
        if base not in self._made:
            self._made[base] = type(base.__name__, (self.mixin, base),
                                    {"__module__": base.__module__, "__qualname__": base.__qualname__})
        setattr(obj, self.mark, base)
        obj.__class__ = self._made[base]

    def remove(self, obj: Any) -> None:
        """Gives ``obj`` the class it had (its state stays)."""
        original = getattr(obj, self.mark, None)
        if original is not None:
            obj.__class__ = original
            delattr(obj, self.mark)

    def is_applied(self, obj: Any) -> bool:
        """True while the subclass is on ``obj``."""
        return getattr(obj, self.mark, None) is not None
