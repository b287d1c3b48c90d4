"""MkDocs hooks (mkdocs.yml `hooks:`): the pages that are generated, not pasted, and the API-reference check.

- docs/reference/cli.md holds ``tfaccel --help`` and every ``tfaccel VERB --help`` between ``<!-- tfaccel:cli-help
  -->`` and ``<!-- tfaccel:cli-help-end -->``, produced by the real argparse parser (tfaccel.cli.main.build_parser)
  and written into the file (``python scripts/docs_hooks.py --write-cli``), so it reads in the repository too; the
  build warns (and ``--strict`` fails) where the file differs from what the parsers print now.
- ``<!-- tfaccel:parity-table -->`` becomes the Keras-parity table that scripts/parity_table.py renders from
  docs/data/parity.json (a results file of `python scripts/parity_table.py --json docs/data/parity.json`).
- ``<!-- tfaccel:corpus-table -->`` becomes the keras-io corpus table that scripts/corpus_table.py renders from
  docs/data/corpus.json (a results file of `python scripts/corpus_table.py --json docs/data/corpus.json`).
- ``<!-- tfaccel:keras-conformance-table -->`` becomes the tables of Keras' own tests run through tfaccel, which
  scripts/keras_conformance_table.py renders from docs/data/keras_conformance.json.
- ``<!-- tfaccel:rooms -->`` becomes the table of the package's rooms that scripts/architecture_rooms.py reads from
  the source (docs/architecture.md).
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
CORPUS_JSON = ROOT / "docs" / "data" / "corpus.json"
CLI_MARK = "<!-- tfaccel:cli-help -->"
CLI_END = "<!-- tfaccel:cli-help-end -->"
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
PARITY_MARK = "<!-- tfaccel:parity-table -->"
CORPUS_MARK = "<!-- tfaccel:corpus-table -->"
CONFORMANCE_JSON = ROOT / "docs" / "data" / "keras_conformance.json"
CONFORMANCE_MARK = "<!-- tfaccel:keras-conformance-table -->"
ROOMS_MARK = "<!-- tfaccel:rooms -->"
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
        sections = [("tfaccel", _help_of(parser, ["--help"]))]
        for verb, sub in _subcommands(parser):
            sections.append((f"tfaccel {verb}", _help_of(parser, [verb, "--help"])))
            # a verb with actions of its own (`tfaccel k8s manifest`): each action's --help too
            sections += [(f"tfaccel {verb} {name}", _help_of(parser, [verb, name, "--help"]))
                         for name, _ in _subcommands(sub)]
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(f"## `{title}`\n\n```text\n{text.rstrip()}\n```\n" for title, text in sections)


def _subcommands(parser: Any) -> List[Any]:
    """``[(name, subparser), ...]`` of an argparse parser's sub-commands, in the order they were added."""
    return [(name, sub) for action in parser._actions if isinstance(getattr(action, "choices", None), dict)
            for name, sub in action.choices.items()]


def _help_of(parser: Any, argv: List[str]) -> str:
    """What ``parser.parse_args(argv)`` prints for ``--help`` (argparse exits after printing it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args(argv)
    return out.getvalue()


def _script(script: str) -> Any:
    """``scripts/<script>.py`` loaded as a module."""
    spec = importlib.util.spec_from_file_location(script, ROOT / "scripts" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _render(script: str, path: Path, function: str = "render") -> str:
    """``scripts/<script>.py``'s ``function`` (its ``render``) of the results in ``path``."""
    return getattr(_script(script), function)(json.loads(path.read_text()))


def cli_page(markdown: str) -> str:
    """``markdown`` (the CLI page) with its generated part between the markers replaced by ``cli_help_markdown()``."""
    head, rest = markdown.split(CLI_MARK, 1)
    tail = rest.split(CLI_END, 1)[1] if CLI_END in rest else "\n"
    return f"{head}{CLI_MARK}\n\n{cli_help_markdown()}\n{CLI_END}{tail}"


def write_cli_page(path: Path = CLI_PAGE) -> bool:
    """Rewrites the generated part of the CLI page; returns whether the file changed."""
    old = path.read_text()
    new = cli_page(old)
    if new != old:
        path.write_text(new)
    return new != old


def parity_table_markdown(path: Path = PARITY_JSON) -> str:
    """The table scripts/parity_table.py prints for the results in ``path``."""
    return _render("parity_table", path)


def corpus_table_markdown(path: Path = CORPUS_JSON) -> str:
    """The table scripts/corpus_table.py prints for the results in ``path``."""
    return _render("corpus_table", path)


def conformance_tables_markdown(path: Path = CONFORMANCE_JSON) -> str:
    """The tables scripts/keras_conformance_table.py prints for the results in ``path``."""
    return _render("keras_conformance_table", path, "tables")


def rooms_table_markdown() -> str:
    """The table of the package's rooms (scripts/architecture_rooms.py), read from the source now."""
    return _script("architecture_rooms").render()


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Checks the generated parts that pages keep, and fills the others."""
    if CLI_MARK in markdown and cli_page(markdown) != markdown:
        log.warning(f"{page.file.src_uri}: the command-line help differs from what the parsers print now; run "
                    "`python scripts/docs_hooks.py --write-cli`")
    if PARITY_MARK in markdown:
        markdown = markdown.replace(PARITY_MARK, parity_table_markdown())
    if CORPUS_MARK in markdown:
        markdown = markdown.replace(CORPUS_MARK, corpus_table_markdown())
    if CONFORMANCE_MARK in markdown:
        markdown = markdown.replace(CONFORMANCE_MARK, conformance_tables_markdown())
    if ROOMS_MARK in markdown:
        markdown = markdown.replace(ROOMS_MARK, rooms_table_markdown())
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


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-cli"]:
        sys.exit("usage: python scripts/docs_hooks.py --write-cli   (rewrites docs/reference/cli.md's generated part)")
    print(f"{CLI_PAGE}: {'rewritten' if write_cli_page() else 'already up to date'}")
