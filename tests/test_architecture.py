"""The shape of the tfaccel package, read from its source (no TensorFlow import, well under a second).

Each check has a list of the places known to break it today. A new breach fails the test, and so does an
entry that no longer breaks the rule (so the lists only shrink): fixing a place means deleting its entry.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tfaccel"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400

# Functions over MAX_FUNCTION_LINES ("module:qualified name"), to be split.
KNOWN_LONG_FUNCTIONS: Set[str] = set()
# Modules over MAX_MODULE_LINES, to be split.
KNOWN_LONG_MODULES: Set[str] = set()
# Import cycles, each as its sorted modules joined by " <-> ".
KNOWN_CYCLES: Set[str] = set()
# "importer -> module:name" for private names imported from another module.
KNOWN_PRIVATE_IMPORTS: Set[str] = set()
# Keras/TF internals touched outside tfaccel/compat/ ("path: lines that match").
KNOWN_INTERNALS: Set[str] = set()
# Backend names tested by name in the training code ("path: lines that match").
KNOWN_BACKEND_NAME_TESTS: Set[str] = set()
# Imports inside functions, per package ("(top)": tfaccel/*.py). Only the light modules defer theirs, the ones that
# must start without TensorFlow (`import tfaccel`, the CLI's verbs, the launcher, the cluster readers, the
# integrations the launcher's driver side loads) and the compat fixes applied on demand; optional dependencies
# (Horovod, matplotlib) load through tfaccel._lazy.optional_module. A package not listed has none.
KNOWN_FUNCTION_IMPORTS: Dict[str, int] = {"(top)": 46, "cli": 51, "cluster": 3, "compat": 29, "integrations": 4,
                                          "launch": 19}
# Modules that must import without TensorFlow (the CLI's parser is built too).
LIGHT_MODULES = ("tfaccel", "tfaccel.cluster", "tfaccel.launch", "tfaccel.resilience.contract",
                 "tfaccel.strategies.names", "tfaccel.bench.config", "tfaccel.train.request", "tfaccel.memory.options",
                 "tfaccel.memory.shards", "tfaccel.cli.main")
# Comments citing files outside the repository ("path: lines that match").
KNOWN_OUTSIDE_FILES: Set[str] = set()

# The two greps, as regular expressions over source lines.
INTERNALS = re.compile(r"keras\.src|tf\.__internal__|tensorflow\.(python|compiler)|\._values\b|model\._[a-z]")
BACKEND_NAME = re.compile(r"backend.name|== \"horovod\"|'horovod'")  # as the grep: "." is any character
BACKEND_NAME_SCOPE = ("tfaccel/train/", "tfaccel/plan.py", "tfaccel/xla.py")
# A comment or docstring pointing at a file outside the repository.
OUTSIDE_FILE = re.compile(r"VERIFIED\.md|\.\./shared|/work/(shared|notes)")


def _modules() -> Dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _type_checking_only(tree: ast.AST) -> Set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (no runtime edge)."""
    skipped: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def _imports(name: str, *, type_only: bool = False) -> Iterator[Tuple[str, Optional[str]]]:
    """(imported module, imported name or None) for every runtime import of tfaccel in module ``name`` (with
    ``type_only``, the imports under ``if TYPE_CHECKING:`` too)."""
    tree = TREES[name]
    skipped = set() if type_only else _type_checking_only(tree)
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tfaccel":
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "tfaccel":
                continue
            for alias in node.names:
                yield base, alias.name


def _graph(*, type_only: bool = False) -> Dict[str, Set[str]]:
    """Module -> the tfaccel modules it imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    edges: Dict[str, Set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for module, imported in _imports(name, type_only=type_only):
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in MODULES else module
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target in MODULES and target != name:
                edges[name].add(target)
    return edges


def _cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[Tuple[str, ast.AST]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def _grep(pattern: "re.Pattern[str]", scope: Tuple[str, ...] = ("tfaccel/",),
          exclude: Tuple[str, ...] = ()) -> Set[str]:
    """"path: N" for each file in scope with N matching lines (counts, not line numbers: other edits move lines)."""
    hits = set()
    for path in MODULES.values():
        rel = _rel(path)
        if not rel.startswith(scope) or rel.startswith(exclude):
            continue
        count = sum(1 for line in path.read_text().splitlines() if pattern.search(line))
        if count:
            hits.add(f"{rel}: {count}")
    return hits


def _agree(found: Set[str], known: Set[str], what: str) -> None:
    new, stale = sorted(found - known), sorted(known - found)
    assert not new, f"{what}: {new}"
    assert not stale, f"{what}: these known entries are fixed now; delete them from the test's list: {stale}"


def test_the_import_graph_sees_the_package() -> None:
    edges = _graph()
    assert "tfaccel.train.api" in edges["tfaccel.cli.fit"] or any(
        "tfaccel.train" in target for target in edges["tfaccel.cli.fit"]), edges["tfaccel.cli.fit"]
    assert "tfaccel.errors" in edges["tfaccel.train.api"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    found = {" <-> ".join(cycle) for cycle in _cycles(_graph())}
    _agree(found, KNOWN_CYCLES, "import cycles (function-level imports count too)")


def test_no_cycle_through_type_only_imports_either() -> None:
    """A cycle kept alive by ``if TYPE_CHECKING:`` imports is still two modules that need each other (the fit
    context and the loops were one, until the context moved to train/fit_context.py)."""
    assert _cycles(_graph(type_only=True)) == []


def test_no_private_name_imported_from_another_module() -> None:
    found = set()
    for name in MODULES:
        for module, imported in _imports(name):
            if imported and imported.startswith("_") and not imported.startswith("__") and module != name:
                found.add(f"{name} -> {module}:{imported}")
    _agree(found, KNOWN_PRIVATE_IMPORTS, "private names imported from another module")


def _function_imports() -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for name, tree in TREES.items():
        parts = name.split(".")
        package = parts[1] if len(parts) > 2 or (len(parts) == 2 and MODULES[name].name == "__init__.py") else "(top)"
        skipped = _type_checking_only(tree)
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found = [node for node in ast.walk(function)
                         if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped]
                if found:
                    counts[package] = counts.get(package, 0) + len(found)
    return counts


def test_imports_at_the_top_outside_the_light_modules() -> None:
    """train/, resilience/, strategies/, memory/, bench/ ... import at the top; the light ones only shrink."""
    found = _function_imports()
    grown = {pkg: n for pkg, n in found.items() if n > KNOWN_FUNCTION_IMPORTS.get(pkg, 0)}
    assert not grown, f"imports inside functions (move them to the top of the module): {grown}"
    shrunk = {pkg: found.get(pkg, 0) for pkg, n in KNOWN_FUNCTION_IMPORTS.items() if found.get(pkg, 0) < n}
    assert not shrunk, f"fewer imports inside functions now; lower the test's counts to {shrunk}"


def test_the_light_modules_load_without_tensorflow() -> None:
    code = ("import importlib, sys\n"
            f"for name in {LIGHT_MODULES!r}: importlib.import_module(name)\n"
            "import tfaccel.cluster.k8s_manifest, tfaccel.launch.elastic, tfaccel.launch.restarts\n"
            "from tfaccel.cli.main import build_parser; build_parser()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout[-2000:]


def test_no_function_over_60_lines() -> None:
    found = set()
    for name, tree in TREES.items():
        for qualname, node in _functions(tree):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
                found.add(f"{name}:{qualname}")
    _agree(found, KNOWN_LONG_FUNCTIONS, f"functions over {MAX_FUNCTION_LINES} lines")


def test_no_module_over_400_lines() -> None:
    found = {name for name, path in MODULES.items() if len(path.read_text().splitlines()) > MAX_MODULE_LINES}
    _agree(found, KNOWN_LONG_MODULES, f"modules over {MAX_MODULE_LINES} lines")


def test_keras_and_tf_internals_only_in_compat() -> None:
    _agree(_grep(INTERNALS, exclude=("tfaccel/compat/",)), KNOWN_INTERNALS,
           "Keras/TF internals outside tfaccel/compat/ (put them behind a tested function there)")


def test_training_code_does_not_test_backend_names() -> None:
    _agree(_grep(BACKEND_NAME, scope=BACKEND_NAME_SCOPE), KNOWN_BACKEND_NAME_TESTS,
           "backend names tested in the training code (make the difference a Backend method or attribute)")


def test_no_comment_points_outside_the_repository() -> None:
    _agree(_grep(OUTSIDE_FILE), KNOWN_OUTSIDE_FILES, "comments citing files outside the repository")


@pytest.mark.parametrize("pattern, line, hit", [
    (INTERNALS, "from keras.src.x import y", True), (INTERNALS, "w._values[k]", True),
    (INTERNALS, "model._symbolic_build()", True), (INTERNALS, "model.fit()", False),
    (BACKEND_NAME, 'if backend.name == "multi_worker":', True), (BACKEND_NAME, "backend.scope()", False),
    (OUTSIDE_FILE, "# see VERIFIED.md", True), (OUTSIDE_FILE, "# see README.md", False),
    (OUTSIDE_FILE, '>>> write("/tmp/digits")', False),
])
def test_the_patterns_match_what_they_mean(pattern: "re.Pattern[str]", line: str, hit: bool) -> None:
    assert bool(pattern.search(line)) is hit
