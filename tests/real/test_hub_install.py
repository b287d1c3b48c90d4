"""KerasHub is installed beside the TensorFlow wheel the project chose, and that wheel is still the one that runs.

tensorflow-text (which keras-hub requires) depends on the full ``tensorflow`` wheel by name; a plain pip install puts
it on top of ``tensorflow-cpu`` in the same package directory (in that mixed venv TensorFlow tried to load CUDA at
start-up). ``scripts/install_hub.sh`` installs the two with --no-deps after the ``hub`` extra. These tests fail, not
skip, where KerasHub is missing: the README's test command installs it.
"""

import base64
import hashlib
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install_hub.sh"
TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly")
INSTALL = "pip install -e '.[cpu,test,ray,hub]' && bash scripts/install_hub.sh .venv"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_tf_dists() -> dict:
    return {_normal(d.metadata["Name"]): d for d in metadata.distributions() if _normal(d.metadata["Name"]) in TF_DISTS}


def _sha256(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def test_running_tensorflow_is_the_chosen_wheel() -> None:
    """One TensorFlow distribution, and the running TensorFlow's files are that one's (hashes from its RECORD)."""
    import tensorflow as tf

    dists = _installed_tf_dists()
    assert len(dists) == 1, f"several TensorFlow wheels share one package directory: {sorted(dists)}"
    if "tensorflow-cpu" in dists or os.environ.get("CI"):
        assert "tensorflow" not in dists, "the full tensorflow wheel was installed over tensorflow-cpu"
    (name, dist), = dists.items()
    assert tf.__version__ == dist.version, f"TensorFlow {tf.__version__} runs, {name} {dist.version} is installed"
    build_info = Path(tf.__file__).parent / "python" / "platform" / "build_info.py"
    recorded = {str(f): f.hash.value for f in dist.files if f.hash}
    assert recorded.get("tensorflow/python/platform/build_info.py") == _sha256(build_info), \
        f"{build_info} is not the file {name} installed: another wheel overwrote it"
    if name == "tensorflow-cpu":
        assert not tf.sysconfig.get_build_info().get("is_cuda_build"), "a CUDA build runs under tensorflow-cpu"


def test_keras_hub_and_tensorflow_text_import() -> None:
    try:
        import keras_hub
        import tensorflow_text
    except ImportError as exc:
        pytest.fail(f"KerasHub is not installed ({exc}); install it as the README's test command does: {INSTALL}")
    assert keras_hub.__version__.startswith("0.32."), keras_hub.__version__
    assert metadata.version("tensorflow-text").startswith("2.21."), tensorflow_text.__file__


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown option '--bogus'; valid: [VENV]"),
    (["/nonexistent-venv"], "no python at '/nonexistent-venv/bin/python'"),
    (["a", "b"], "got two venvs"),
])
def test_install_script_rejects_bad_arguments(args: list, message: str) -> None:
    result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
