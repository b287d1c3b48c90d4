"""The generated parts of the documentation site (scripts/docs_hooks.py): the CLI page is the parsers' own help,
the Keras-parity table is scripts/parity_table.py's rendering of docs/data/parity.json (the keras-io corpus table
scripts/corpus_table.py's of docs/data/corpus.json), and the API page check
finds a public name that has no entry."""

import importlib.util
import json
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load("docs_hooks", REPO / "scripts" / "docs_hooks.py")
parity_table = _load("parity_table", REPO / "scripts" / "parity_table.py")
corpus_table = _load("corpus_table", REPO / "scripts" / "corpus_table.py")


def test_the_cli_page_is_every_verbs_help() -> None:
    page = hooks.cli_help_markdown()
    for verb in ("env", "tf-config", "launch", "fit", "bench", "memory"):
        assert f"## `tfaccel {verb}`" in page and f"usage: tfaccel {verb}" in page, verb
    assert "--max-restarts K" in page and "--network {auto,private,host}" in page


def test_the_cli_page_in_the_repository_is_the_parsers_help() -> None:
    text = hooks.CLI_PAGE.read_text()
    assert text.count(hooks.CLI_MARK) == 1 and text.count(hooks.CLI_END) == 1
    assert hooks.cli_page(text) == text, "docs/reference/cli.md is stale: `python scripts/docs_hooks.py --write-cli`"
    assert "## `tfaccel fit`" in text and "--scale-learning-rate {linear,sqrt,none}" in text


def test_the_parity_table_is_rendered_from_the_recorded_results() -> None:
    results = json.loads(hooks.PARITY_JSON.read_text())
    table = hooks.parity_table_markdown()
    assert table == parity_table.render(results)
    rows = table.splitlines()[2:]
    assert len(rows) == len(next(iter(results.values()))) >= 20
    cells = [cell.strip() for row in rows for cell in row.strip("|").split("|")]
    assert "not run" not in cells, "a path of the recorded run did not run every case"
    page = (REPO / "docs" / "guides" / "keras-parity.md").read_text()
    assert hooks.PARITY_MARK in page and "| case |" not in page, "the page must hold the marker, not a pasted table"


def test_the_corpus_table_is_rendered_from_the_recorded_results() -> None:
    results = json.loads(hooks.CORPUS_JSON.read_text())
    table = hooks.corpus_table_markdown()
    assert table == corpus_table.render(results)
    rows = table.splitlines()[2:]
    assert len(rows) == len(results["cases"]) >= 25
    cells = [cell.strip() for row in rows for cell in row.strip("|").split("|")]
    assert "not run" not in cells, "a path of the recorded run did not run every case"
    assert all(name in results["outcomes"] for name, _ in corpus_table.COLUMNS)
    page = (REPO / "docs" / "guides" / "keras-parity.md").read_text()
    assert hooks.CORPUS_MARK in page and "| case | source |" not in page, "the page must hold the marker, not a table"


def test_the_api_page_check_finds_a_missing_entry() -> None:
    import griffe  # noqa: F401  (the [docs] extra, which the README's test command installs: fails, not skips)

    page = (REPO / "docs" / "reference" / "api.md").read_text()
    assert hooks.api_problems(page) == []
    without = page.replace("::: tfaccel.memory.estimate.estimate_memory\n", "")
    assert hooks.api_problems(without) == [
        "reference/api.md: public name tfaccel.estimate_memory has no '::: module.estimate_memory' entry"]


conformance_table = _load("keras_conformance_table", REPO / "scripts" / "keras_conformance_table.py")


def test_the_keras_conformance_tables_are_rendered_from_the_recorded_results() -> None:
    data = json.loads(hooks.CONFORMANCE_JSON.read_text())
    tables = hooks.conformance_tables_markdown()
    assert tables == conformance_table.tables(data)
    assert {"keras:default", "tfaccel:default"} <= set(data["modes"]) <= {m for m, _ in conformance_table.COLUMNS}
    assert "| **all** |" in tables and f"{len(data['modes']['keras:default'])}" in tables
    page = (REPO / "docs" / "guides" / "keras-parity.md").read_text()
    assert hooks.CONFORMANCE_MARK in page and "| test module |" not in page, "the page holds the marker, not a table"
    assert f"Keras {data['keras']}" in page, "the page names the Keras version of the recorded run"


def test_the_conformance_table_lists_a_difference_with_its_cause() -> None:
    passed = {"keras/src/x_test.py::T::a": "passed", "keras/src/x_test.py::T::b": "passed"}
    refused = dict(passed, **{"keras/src/x_test.py::T::b": "failed: tfaccel.errors.ConfigError: fit: no because"})
    beyond = {"keras/src/x_test.py::T::a": "failed: AddN"}
    data = {"keras": "3.15.1", "tensorflow": "2.21.0", "python": "3.11.7",
            "modes": {"keras:default": passed, "tfaccel:default": refused, "keras:mirrored": beyond,
                      "tfaccel:mirrored": {"keras/src/x_test.py::T::a": "passed"}},
            "intended_refusals": {"tfaccel:default": {"keras/src/x_test.py::T::b": "because"}}}
    table = conformance_table.render(data)
    assert table.startswith("Keras 3.15.1, TensorFlow 2.21.0, Python 3.11.7;")
    assert "| `x_test.py` | 2 / 2 | 1 / 2 | 0 / 1 | 1 / 1 | 1 / 1 |" in table
    assert "| default | `x_test.py::T::b` | intended refusal | passed | tfaccel.errors.ConfigError: fit: no because |" \
        in table
    assert "| mirrored | `x_test.py::T::a` | passes through tfaccel only | AddN | passed |" in table
    assert "ConfigError: fit: no because | 0 | 1 | 0 | 0 |" in conformance_table.causes(data)
