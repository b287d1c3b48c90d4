"""The rooms of the tfaccel package, read from its source: `python scripts/architecture_rooms.py` prints the table
docs/architecture.md shows (the docs build fills ``<!-- tfaccel:rooms -->`` with it, so it is never stale).

A room is a sub-package of tfaccel (``(top)``: the modules directly under tfaccel/). For each: its modules, its
lines, the rooms it imports (top-level and function-level imports alike) and its imports inside functions.
"""

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tfaccel"


def _room(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else "(top)"


def _room_of_module(dotted: str) -> str:
    parts = dotted.split(".")
    if len(parts) < 2:
        return "(top)"
    return parts[1] if (PACKAGE / parts[1]).is_dir() else "(top)"


def _imports(tree: ast.AST) -> Tuple[Set[str], int]:
    """(the rooms this module imports, its imports inside functions)."""
    rooms: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfaccel"):
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            rooms.add(_room_of_module(targets[1] if node.module == "tfaccel" else targets[0]))
        elif isinstance(node, ast.Import):
            rooms.update(_room_of_module(a.name) for a in node.names if a.name.startswith("tfaccel"))
    inside = sum(1 for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom)))
    return rooms, inside


def rooms() -> Dict[str, Dict[str, object]]:
    """Room -> {"modules", "lines", "imports" (rooms), "function_imports"}."""
    found: Dict[str, Dict[str, object]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        entry = found.setdefault(_room(path), {"modules": 0, "lines": 0, "imports": set(), "function_imports": 0})
        used, inside = _imports(ast.parse(source))
        entry["modules"] += 1
        entry["lines"] += len(source.splitlines())
        entry["imports"] |= used
        entry["function_imports"] += inside
    for name, entry in found.items():
        entry["imports"] = sorted(entry["imports"] - {name})
    return found


def render() -> str:
    """The Markdown table of :func:`rooms`."""
    lines: List[str] = ["| room | modules | lines | imports from the rooms | imports inside functions |",
                        "|---|---:|---:|---|---:|"]
    for name, entry in sorted(rooms().items(), key=lambda item: (item[0] != "(top)", item[0])):
        used = ", ".join(f"`{room}`" for room in entry["imports"]) or "none"
        lines.append(f"| `{name}` | {entry['modules']} | {entry['lines']} | {used} | {entry['function_imports']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
