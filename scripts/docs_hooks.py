"""MkDocs hooks (mkdocs.yml `hooks:`): the pages that are generated, not pasted, and the API-reference check.

- ``<!-- tfaccel:cli-help -->`` in a page becomes ``tfaccel --help`` and every ``tfaccel VERB --help``, produced by
  the real argparse parser (tfaccel.cli.main.build_parser), so the CLI page cannot drift from the CLI.
- ``<!-- tfaccel:parity-table -->`` becomes the Keras-parity table that scripts/parity_table.py renders from
  docs/data/parity.json (a results file of `python scripts/parity_table.py --json docs/data/parity.json`).
- ``<!-- tfaccel:keras-conformance-table -->`` becomes the tables of Keras' own tests run through tfaccel, which
  scripts/keras_conformance_table.py renders from docs/data/keras_conformance.json.
- Every public name (tfaccel.__all__, tfaccel.launch.__all__) must have a ``::: module.Name`` entry in the API
  reference, and every entry, and every public method of a documented class, a docstring: a warning otherwise,
  which fails `mkdocs build --strict`.
"""

import contextlib
import importlib.util
import io
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Set

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = "reference/api.md"
PARITY_JSON = ROOT / "docs" / "data" / "parity.json"
CLI_MARK = "<!-- tfaccel:cli-help -->"
PARITY_MARK = "<!-- tfaccel:parity-table -->"
CONFORMANCE_JSON = ROOT / "docs" / "data" / "keras_conformance.json"
CONFORMANCE_MARK = "<!-- tfaccel:keras-conformance-table -->"
HELP_COLUMNS = "100"
log = logging.getLogger("mkdocs.hooks.tfaccel")  # a warning here fails `mkdocs build --strict`
if str(ROOT) not in sys.path:  # the checkout's tfaccel, also where it is not installed
    sys.path.insert(0, str(ROOT))


def cli_help_markdown() -> str:
    """``tfaccel --help`` and each verb's ``--help``, as the command prints them, one section per verb."""
    from tfaccel.cli.main import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS  # argparse wraps to the terminal: fix the width for a stable page
    try:
        parser = build_parser()
        verbs = [name for action in parser._actions if hasattr(action, "choices") and isinstance(action.choices, dict)
                 for name in action.choices]
        sections = [("tfaccel", _help_of(parser, ["--help"]))]
        sections += [(f"tfaccel {verb}", _help_of(parser, [verb, "--help"])) for verb in verbs]
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(f"## `{title}`\n\n```text\n{text.rstrip()}\n```\n" for title, text in sections)


def _help_of(parser: Any, argv: List[str]) -> str:
    """What ``parser.parse_args(argv)`` prints for ``--help`` (argparse exits after printing it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args(argv)
    return out.getvalue()


def parity_table_markdown(path: Path = PARITY_JSON) -> str:
    """The table scripts/parity_table.py prints for the results in ``path``."""
    spec = importlib.util.spec_from_file_location("parity_table", ROOT / "scripts" / "parity_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render(json.loads(path.read_text()))


def conformance_tables_markdown(path: Path = CONFORMANCE_JSON) -> str:
    """The tables scripts/keras_conformance_table.py prints for the results in ``path``."""
    spec = importlib.util.spec_from_file_location("keras_conformance_table",
                                                  ROOT / "scripts" / "keras_conformance_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tables(json.loads(path.read_text()))


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fills the generated parts of a page."""
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_help_markdown())
    if PARITY_MARK in markdown:
        markdown = markdown.replace(PARITY_MARK, parity_table_markdown())
    if CONFORMANCE_MARK in markdown:
        markdown = markdown.replace(CONFORMANCE_MARK, conformance_tables_markdown())
    if page.file.src_uri == API_PAGE:
        for problem in api_problems(markdown):
            log.warning(problem)
    return markdown


def public_names() -> Set[str]:
    """The names a user imports: tfaccel's and tfaccel.launch's ``__all__`` (the version string aside)."""
    import tfaccel
    import tfaccel.launch

    names = {f"tfaccel.{n}" for n in tfaccel.__all__ if n != "__version__"}
    return names | {f"tfaccel.launch.{n}" for n in tfaccel.launch.__all__}


def api_problems(markdown: str) -> List[str]:
    """What the API page lacks: public names without an entry, entries or public methods without a docstring."""
    import griffe

    entries = re.findall(r"^::: ([\w.]+)", markdown, flags=re.M)
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)], docstring_parser=griffe.Parser.google)
    package = loader.load("tfaccel")
    documented: Dict[str, str] = {}
    problems = []
    for entry in entries:
        obj = package[entry.split(".", 1)[1]]
        documented[obj.name] = entry
        problems += [f"{API_PAGE}: {where} has no docstring" for where in _undocumented(entry, obj)]
    for name in sorted(public_names()):
        if name.rsplit(".", 1)[1] not in documented:
            problems.append(f"{API_PAGE}: public name {name} has no '::: module.{name.rsplit('.', 1)[1]}' entry")
    return problems


def _undocumented(entry: str, obj: Any) -> Iterable[str]:
    """``entry`` if its object has no docstring, and ``entry.method`` for each public method of a class without one."""
    if obj.is_alias:
        obj = obj.final_target
    if not (obj.docstring and obj.docstring.value.strip()):
        yield entry
    if obj.is_class:
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias or not member.is_function:
                continue
            if not (member.docstring and member.docstring.value.strip()):
                yield f"{entry}.{name}"
