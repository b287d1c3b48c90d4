"""Reading a cluster description's text: a bounded file, JSON or YAML (a safe loader that rejects duplicate
keys), nesting and size bounded before and after parsing. What comes out is plain data for validation.

This module never imports TensorFlow; PyYAML is imported when a YAML text is first read.
"""

import json
import os
from typing import Any, Callable, Dict, Tuple, Union

from tfaccel.cluster.errors import NOTHING, ClusterConfigError, cluster_error, fail
from tfaccel.cluster.limits import MAX_BYTES, loads_json, nesting_problem, read_bounded, shorten

__all__ = ["MAX_YAML_VALUES", "read_cluster_file", "parse_text"]

MAX_YAML_VALUES = 60_000  # a YAML cluster file of 30,000 hosts, one a line, reads in ~0.5 s; JSON has no such bound


def read_cluster_file(path: Union[str, "os.PathLike[str]"]) -> Tuple[Any, str]:
    """Reads and parses a cluster file (``.json`` as JSON, anything else as YAML, which reads JSON too).

    Returns:
        ``(document, source)``: the parsed data, and ``"cluster file <path>"`` for error messages.

    Raises:
        ClusterConfigError: the file is missing, unreadable, larger than the limit, or not valid JSON/YAML.
    """
    source = f"cluster file {shorten(os.fspath(path))}"
    try:
        data, _size = read_bounded(os.fspath(path))
        if data is None:
            return fail(source, None, NOTHING, f"larger than {MAX_BYTES:,} bytes (the limit for a cluster "
                        "description); is it the right file?")
        text = data.decode("utf-8")
    except FileNotFoundError:
        return fail(source, None, NOTHING, "no such file; check the path")
    except (OSError, UnicodeDecodeError) as exc:
        return fail(source, None, NOTHING, f"cannot read it ({shorten(str(exc))})")
    return parse_text(text, source, json_only=str(path).endswith(".json")), source


def parse_text(text: str, source: str, *, json_only: bool = False) -> Any:
    """Parses JSON or YAML (``safe_load``), rejecting duplicate keys; errors name ``source`` and the line.

    Raises:
        ClusterConfigError: invalid JSON/YAML, a key given twice, too large or nested too deeply.
    """
    doc = _parse_json(text, source) if json_only else _parse_yaml(text, source)
    problem = nesting_problem(doc)
    if problem is not None:
        fail(source, None, NOTHING, f"{problem}; a cluster description is role -> list of \"host:port\"")
    return doc


def _duplicate_key(source: str) -> Callable[[str], None]:
    def duplicate(key: str) -> None:
        fail(source, shorten(key, 80), NOTHING, "key given twice; keep one")
    return duplicate


def _parse_json(text: str, source: str) -> Any:
    try:
        return loads_json(text, _duplicate_key(source))
    except ClusterConfigError:
        raise
    except json.JSONDecodeError as exc:
        return fail(source, None, NOTHING, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return fail(source, None, NOTHING, f"not valid JSON: {shorten(str(exc))}")
    except RecursionError:
        return fail(source, None, NOTHING, "nested too deeply to read; a cluster description is role -> list "
                    "of \"host:port\"")


def _parse_yaml(text: str, source: str) -> Any:
    if text.lstrip().startswith("{"):  # JSON is YAML too, and Python's JSON reader is 10-100x faster
        try:
            return loads_json(text, _duplicate_key(source))
        except ClusterConfigError:
            raise
        except (ValueError, RecursionError):
            pass  # not JSON after all: YAML says what is wrong
    bound = 2 * (text.count(",") + text.count("\n") + 1) + text.count("[") + text.count("{")
    if bound > MAX_YAML_VALUES:  # PyYAML builds ~70,000 values a second: bound the work before it starts
        fail(source, None, NOTHING, f"too large to read as YAML: up to {bound:,} values (from its commas and "
             f"lines), more than {MAX_YAML_VALUES:,}; write a cluster this large as JSON (a .json file)")
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # a SafeLoader subclass: safe_load plus duplicate check
    except ClusterConfigError as exc:
        raise ClusterConfigError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a list used as a mapping key, an integer of more than 4300 digits
        return fail(source, None, NOTHING, f"not a valid cluster description ({shorten(str(exc))})")
    except RecursionError:
        return fail(source, None, NOTHING, "nested too deeply to read; a cluster description is role -> list "
                    "of \"host:port\"")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return fail(source, None, NOTHING, f"not valid YAML: {shorten(problem)}{where}")


_LOADER: Any = None


def _strict_loader() -> Any:
    global _LOADER
    if _LOADER is None:
        import yaml

        # libyaml's parser when PyYAML has it: ~8x faster on a 1 MB file, and it refuses deep nesting itself.
        base = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader

        class _StrictSafeLoader(base):  # type: ignore[valid-type,misc]
            pass

        def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Dict[Any, Any]:
            loader.flatten_mapping(node)
            out: Dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=deep)
                if key in out:
                    where = f"{shorten(str(key), 80)} (line {key_node.start_mark.line + 1})"
                    raise cluster_error(where, None, NOTHING, "key given twice; keep one")
                out[key] = loader.construct_object(value_node, deep=deep)
            return out

        _StrictSafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
        _LOADER = _StrictSafeLoader
    return _LOADER
