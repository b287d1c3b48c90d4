"""README.md stays a short front page whose links lead into the docs and whose test command is the one CI runs."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
README = (REPO / "README.md").read_text()
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 250, "README.md is the front page: move the details into docs/"


def test_every_relative_link_of_the_readme_leads_to_a_file() -> None:
    targets = [m.group("target") for m in LINK.finditer(README)]
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+://", t) and not t.startswith("#")]
    assert len(local) >= 10, targets
    missing = sorted({t for t in local if not (REPO / t).is_file()})
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    pytest_line = next(line.strip() for line in ci.splitlines() if line.strip().startswith(".venv/bin/python -m pytest"))
    install = re.search(r"extras='(\.\[[^\]]*\])'", ci).group(1)  # what CI installs (with uv, else pip)
    command = next(line for line in README.splitlines() if pytest_line in line)
    assert f"pip install -e '{install}'" in command, (install, command)
    for script in ("install_hub.sh", "install_horovod.sh", "install_keras_tests.sh"):
        assert f"bash scripts/{script} .venv" in command and f"bash scripts/{script} .venv" in ci, script


def test_every_anchor_link_of_the_readme_leads_to_one_of_its_headings() -> None:
    slugs = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
             for line in README.splitlines() if line.startswith("#")}
    anchors = [m.group("target")[1:] for m in LINK.finditer(README) if m.group("target").startswith("#")]
    assert anchors and not [a for a in anchors if a not in slugs], (anchors, sorted(slugs))
