"""scripts/tfaccel_colab_tpu.ipynb runs top to bottom on CPU.

The notebook's code cells are read with the json module (no jupyter/nbconvert dependency), joined in order into
one Python script and run in a subprocess from the repository root (so the notebook sees a checkout), bounded in
time. IPython's shell lines are translated, and any other magic fails the test so the translation stays honest:

- ``!pip ...`` / ``%pip ...`` -> ``pass``: tfaccel is already installed editable in the test environment, and the
  test must not touch the network or the venv. The install *choice* still runs (the cell before it computes
  ``TFACCEL_SPEC``), and the test checks it chose the checkout.
- ``!tfaccel ARGS`` -> ``python -m tfaccel ARGS`` through ``subprocess.run`` with a timeout, output printed (the
  same entry point as the ``tfaccel`` console script).
"""

import json
import re
import shlex
from typing import List

import pytest

import harness

NOTEBOOK = harness.REPO_ROOT / "scripts" / "tfaccel_colab_tpu.ipynb"
TIMEOUT_S = 240.0
MIN_ACCURACY = 0.85  # 10 epochs of the CNN on digits reach ~0.95 on the held-out split here

_PRELUDE = '''\
import subprocess as _subprocess
import sys as _sys


def _tfaccel_cli(args):
    """The translation of a notebook line `!tfaccel ARGS`."""
    proc = _subprocess.run([_sys.executable, "-m", "tfaccel", *args], capture_output=True, text=True, timeout=120)
    print(proc.stdout, end="")
    if proc.returncode:
        raise SystemExit(f"`tfaccel {' '.join(args)}` exited {proc.returncode}: {proc.stderr[-2000:]}")

'''


def translate_line(line: str) -> str:
    """One notebook source line -> plain Python (see the module docstring for the rules)."""
    stripped = line.lstrip()
    indent = line[:len(line) - len(stripped)]
    if not stripped.startswith(("!", "%")):
        return line
    command = stripped[1:].strip()
    words = shlex.split(command)
    if words[:1] == ["pip"]:
        return f"{indent}pass  # notebook: {stripped.strip()}\n"
    if stripped.startswith("!") and words[:1] == ["tfaccel"]:
        return f"{indent}_tfaccel_cli({words[1:]!r})  # notebook: {stripped.strip()}\n"
    raise ValueError(f"notebook line {line.strip()!r}: no translation for this shell/magic line; add one to "
                     "tests/models/test_models_notebook.py (and document it there) or write the cell in Python")


def notebook_to_script(notebook: dict) -> str:
    """The notebook's code cells, translated and joined in order, each announced on stdout."""
    parts: List[str] = [_PRELUDE]
    for number, cell in enumerate(c for c in notebook["cells"] if c["cell_type"] == "code"):
        source = cell["source"]
        lines = (source if isinstance(source, list) else source.splitlines(True))
        body = "".join(translate_line(line if line.endswith("\n") else line + "\n") for line in lines)
        parts.append(f"print('--- notebook code cell {number} ---', flush=True)\n{body}\n")
    return "".join(parts)


def test_translation_rules() -> None:
    assert translate_line("!pip install -q {TFACCEL_SPEC}\n") == "pass  # notebook: !pip install -q {TFACCEL_SPEC}\n"
    assert translate_line("    %pip install x\n") == "    pass  # notebook: %pip install x\n"
    assert translate_line("!tfaccel env --json\n") == "_tfaccel_cli(['env', '--json'])  # notebook: !tfaccel env --json\n"
    assert translate_line("x = 1  # !pip\n") == "x = 1  # !pip\n"
    with pytest.raises(ValueError, match=r"notebook line '%cd tfaccel': no translation for this shell/magic line"):
        translate_line("%cd tfaccel\n")


def test_notebook_is_valid_and_aims_at_a_tpu_runtime() -> None:
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4 and notebook["metadata"]["accelerator"] == "TPU"
    code = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
    assert 'strategy="auto"' in code and 'precision="auto"' in code and "!tfaccel env" in code
    assert all(c["outputs"] == [] and c["execution_count"] is None
               for c in notebook["cells"] if c["cell_type"] == "code"), "commit the notebook without outputs"


def test_notebook_runs_top_to_bottom_on_cpu(tmp_path, clean_tf_config) -> None:
    script = tmp_path / "notebook_as_script.py"
    script.write_text(notebook_to_script(json.loads(NOTEBOOK.read_text(encoding="utf-8"))), encoding="utf-8")
    (result,) = harness.run_tasks(script, tasks=[("notebook", 0, None)], timeout=TIMEOUT_S)
    assert result.returncode == 0 and not result.timed_out, result.describe() + "\n" + result.stdout[-3000:]
    out = result.stdout
    assert "installing tfaccel from: -e . (checkout at" in out, out[:2000]
    assert "TensorFlow version:" in out and "auto strategy: default" in out, out  # the `tfaccel env` report
    assert re.search(r"^plan: strategy default \(1 replica; ", out, re.M), out
    assert re.search(r"^  precision +float32$", out, re.M), out
    match = re.search(r"^held-out accuracy: ([0-9.]+)$", out, re.M)
    assert match, out
    assert float(match.group(1)) >= MIN_ACCURACY, out
