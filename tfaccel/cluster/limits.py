"""Bounds on cluster input: how much text, how deep, how many values, and how much of a value a message shows.

A cluster description is a few roles and a list of ``host:port`` per role: even a 10,000-host cluster is a few
hundred kilobytes, three levels deep. Anything far beyond that is a mistake or hostile (a YAML alias bomb, an
endless file such as ``/dev/zero``, ``[`` repeated 100,000 times), and must end in one clear line, quickly and in
little memory, never in ``MemoryError`` or ``RecursionError``.

This module raises nothing of its own: it answers questions (how deep? how many values? how does a value read in
one short line?) and leaves the error to its caller, so that it imports nothing from the cluster package.
"""

import json
import reprlib
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_VALUES", "MAX_SHOWN", "MAX_DIGITS", "show", "shorten", "read_bounded",
           "nesting_problem", "loads_json"]

MAX_BYTES = 1024 * 1024  # cluster files and TF_CONFIG: 1 MiB (a 10,000-host cluster is ~300 KB)
MAX_DEPTH = 32  # nesting levels (a TF_CONFIG document needs 4)
MAX_VALUES = 200_000  # lists, mappings and scalars after YAML aliases are expanded
MAX_SHOWN = 200  # characters of a received value that an error message shows
MAX_DIGITS = 9  # digits of a number read from text (ports, indexes, SLURM counts): Python's int() refuses > 4300

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was.

    Example:
        >>> shorten("a" * 300, 10)
        'aaaaaaaaaa... (300 characters)'
    """
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def show(value: Any) -> str:
    """One short line for a received value: a string JSON-quoted, anything else a bounded ``repr``.

    The ``repr`` looks at no more than a few levels and items, so a value that YAML aliases make huge (or a
    structure nested thousands deep) costs microseconds, not the whole expansion.

    Example:
        >>> show("x" * 3)
        '"xxx"'
        >>> show([[1] * 100])
        '[[1, 1, 1, 1, 1, 1, 1, 1, ...]]'
    """
    if isinstance(value, str):
        return json.dumps(shorten(value))
    try:
        text = _REPR.repr(value)
    except (RecursionError, ValueError):  # noqa: PERF203 - e.g. a self-referencing YAML mapping
        text = f"<{type(value).__name__}>"
    return shorten(text)


def read_bounded(path: str, limit: int = MAX_BYTES) -> Tuple[Optional[bytes], int]:
    """The file's bytes, or ``(None, read)`` when it holds more than ``limit`` bytes (never reads past it).

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        return None, len(data)
    return data, len(data)


def nesting_problem(value: Any, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> Optional[str]:
    """What is wrong with the shape of a parsed document, or None: too deep, or too many values once expanded.

    YAML aliases make a small file a graph whose expansion is exponential: every list and mapping is measured
    once (by identity), so the answer costs the size of the file, not of its expansion.

    Example:
        >>> nesting_problem({"worker": ["a:1"]}) is None
        True
        >>> nesting_problem([[[1]]], max_depth=2)
        'nested deeper than 2 levels'
    """
    memo: Dict[int, Tuple[int, int]] = {}
    depth, count = _measure(value, 1, max_depth, memo)
    if depth > max_depth:
        return f"nested deeper than {max_depth} levels"
    if count > max_values:
        return (f"expands to more than {max_values:,} values (YAML aliases repeat what they name; a cluster "
                "description needs a few)")
    return None


def _measure(value: Any, level: int, max_depth: int, memo: Dict[int, Tuple[int, int]]) -> Tuple[int, int]:
    """(depth, number of values) of ``value``; stops descending past ``max_depth`` (so recursion stays short)."""
    if not isinstance(value, (dict, list, tuple)):
        return 1, 1
    if id(value) in memo:
        return memo[id(value)]
    if level > max_depth:
        return max_depth + 1, 1
    children: List[Any] = [*value.keys(), *value.values()] if isinstance(value, dict) else list(value)
    depth, count = 1, 1
    memo[id(value)] = (max_depth + 1, 1)  # a mapping that contains itself counts as too deep
    for child in children:
        child_depth, child_count = _measure(child, level + 1, max_depth, memo)
        depth = max(depth, child_depth + 1)
        count += child_count
        if depth > max_depth:
            break
    memo[id(value)] = (depth, count)
    return depth, count


def loads_json(text: str, on_duplicate: Callable[[str], None]) -> Any:
    """``json.loads`` that calls ``on_duplicate(key)`` for a key given twice in one object (it should raise).

    Raises:
        ValueError: not valid JSON (``json.JSONDecodeError``).
        RecursionError: nested deeper than Python's recursion limit.
    """
    def hook(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                on_duplicate(key)
            out[key] = value
        return out

    return json.loads(text, object_pairs_hook=hook)
