"""The ```python blocks of the documentation run, so a guide cannot rot.

Every ```python block of every page under docs/ runs, on CPU, in a fresh process per page: the page's blocks in
order, in one namespace (a later block may use what an earlier one defined), in an empty working directory that
holds links to the repository's tf_config/ and models/ (the paths the guides use). A block that must not run here
(several hosts, a GPU, a cluster, a download) is preceded by a line ``<!-- docs-test: skip REASON -->``; the
reason is required and shows in the page source.
"""

import re
import sys
import textwrap
from pathlib import Path
from typing import List, NamedTuple

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
DOCS = REPO / "docs"
SKIP = re.compile(r"^<!-- docs-test: skip (?P<reason>\S.*?) -->$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)")
PAGE_TIMEOUT = 150.0  # seconds for one page's blocks, TensorFlow's import included


class Block(NamedTuple):
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip: str  # the reason, or ""


def blocks_of(path: Path) -> List[Block]:
    """Every fenced block of a Markdown page, with the skip reason written just above it."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, start = len(match.group("indent")), i
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            i += 1
        code = textwrap.dedent("\n".join(line[indent:] for line in lines[start + 1:i]))
        above = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.match(above)
        if above.startswith("<!-- docs-test") and not skip:
            raise ValueError(f"{path}:{start}: {above!r}: write `<!-- docs-test: skip REASON -->` (a reason is required)")
        found.append(Block(path.name if DOCS not in path.parents else path.relative_to(DOCS).as_posix(), start + 1, match.group("lang"), code,
                           skip.group("reason") if skip else ""))
        i += 1
    return found


PAGES = sorted(p for p in DOCS.rglob("*.md") if any(b.lang == "python" for b in blocks_of(p)))


def program_for(blocks: List[Block], workdir: Path) -> str:
    """A Python program that runs the blocks in order in one namespace; a failure names the page and line."""
    parts = ["import os", f"os.chdir({str(workdir)!r})", "namespace = {'__name__': '__main__'}"]
    for block in blocks:
        parts.append(f"exec(compile({block.code!r}, {f'docs/{block.page}, block at line {block.line}'!r}, 'exec'), "
                     "namespace)")
    return "\n".join(parts) + "\n"


def test_the_blocks_are_found_and_few_are_skipped() -> None:
    every = [b for p in DOCS.rglob("*.md") for b in blocks_of(p) if b.lang == "python"]
    skipped = [b for b in every if b.skip]
    assert len(every) >= 10, f"found only {len(every)} python blocks under docs/: is the fence parser broken?"
    assert len(skipped) <= len(every) // 2, [f"{b.page}:{b.line}: {b.skip}" for b in skipped]


def test_the_parser_reads_fences_and_skip_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n<!-- docs-test: skip needs a GPU -->\n"
                    "```python\ny = 2\n```\n\n- item:\n\n  ```bash\n  z 3\n  ```\n")
    assert [(b.line, b.lang, b.skip, b.code) for b in blocks_of(page)] == [
        (1, "python", "", "x = 1"), (6, "python", "needs a GPU", "y = 2"), (12, "bash", "", "z 3")]
    page.write_text("<!-- docs-test: skip -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="a reason is required"):
        blocks_of(page)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_the_python_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    runnable = [b for b in blocks_of(page) if b.lang == "python" and not b.skip]
    if not runnable:
        return  # every block of this page is marked (the count above keeps such pages few)
    workdir = tmp_path / "work"
    workdir.mkdir()
    for name in ("tf_config", "models"):
        (workdir / name).symlink_to(REPO / name)
    program = tmp_path / "snippets.py"
    program.write_text(program_for(runnable, workdir))
    [result] = harness.run_tasks(program, tasks=[("worker", 0, None)], timeout=PAGE_TIMEOUT,
                                 env={"TMPDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, (f"docs/{page.relative_to(DOCS)}: its python blocks failed "
                                    f"(exit {result.returncode}, timed out: {result.timed_out}):\n"
                                    f"{result.stderr[-3000:]}")
