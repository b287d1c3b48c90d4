#!/usr/bin/env bash
# Install KerasHub (and tensorflow-text, which it needs) into a venv WITHOUT replacing the venv's TensorFlow.
#
# Usage: bash scripts/install_hub.sh [VENV]
#   VENV  the virtual environment to install into. Defaults to $VIRTUAL_ENV, else ./.venv.
# Run it after `pip install -e '.[cpu,hub]'` (the `hub` extra brings KerasHub's other dependencies).
#
# Why a script and not `pip install keras-hub`: tensorflow-text 2.21.1 (which keras-hub 0.32 requires) declares
# `Requires-Dist: tensorflow<2.22,>=2.21.0` unconditionally, even with its own `[tensorflow-cpu]` extra. Next to
# `tensorflow-cpu` pip therefore installs the full `tensorflow` wheel too; both write the same `tensorflow/`
# package directory, the last one wins, and in that mixed venv TensorFlow tried to load CUDA at start-up. So the
# two packages go in with --no-deps, and their real dependencies come from the `hub` extra; `pip check` must then
# report nothing but tensorflow-text's `tensorflow` requirement, which the chosen wheel (tensorflow-cpu, or
# tensorflow[and-cuda] on a GPU machine) satisfies under another distribution name.
set -euo pipefail

KERAS_HUB="keras-hub==0.32.*"
TF_TEXT="tensorflow-text==2.21.*"
# shellcheck source=scripts/venv_arg.sh
source "$(dirname "$0")/venv_arg.sh"
venv_arg install_hub 2,15 "$@"
log() { echo "install_hub: $*"; }
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"  # TensorFlow's C++ start-up lines are noise here

# Which TensorFlow distribution the venv holds now: that one must still be the one that runs afterwards.
tf_dists() {
    "$py" - <<'EOF'
import re
from importlib import metadata
names = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in metadata.distributions()}
print(" ".join(sorted(names & {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"})))
EOF
}
before="$(tf_dists)"
if [ -z "$before" ]; then
    echo "install_hub: no TensorFlow in $venv; install the project first (pip install -e '.[cpu,hub]')" >&2
    exit 1
fi
log "TensorFlow distribution(s) before: $before"

"$py" -m pip install -q --disable-pip-version-check --no-deps "$KERAS_HUB" "$TF_TEXT" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true

after="$(tf_dists)"
if [ "$after" != "$before" ]; then
    echo "install_hub: FAILED: the TensorFlow distributions changed from '$before' to '$after'" >&2
    exit 1
fi

# Every requirement must hold except tensorflow-text's on the `tensorflow` name (the chosen wheel provides it).
problems="$("$py" -m pip check --disable-pip-version-check 2>&1 | grep -v "^No broken requirements" \
    | grep -Ev "^tensorflow-text [^ ]+ requires tensorflow, which is not installed\.$" || true)"
if [ -n "$problems" ]; then
    echo "$problems" >&2
    echo "install_hub: FAILED: KerasHub's dependencies are incomplete; install the hub extra first:" \
         "pip install -e '.[cpu,hub]'" >&2
    exit 1
fi

if ! "$py" -c 'import keras_hub, tensorflow_text, tensorflow as tf; print(keras_hub.__version__, tf.__version__)' \
        >/dev/null 2>&1; then
    "$py" -c 'import keras_hub, tensorflow_text' >&2 || true
    echo "install_hub: FAILED: keras_hub or tensorflow_text does not import" >&2
    exit 1
fi
log "$("$py" -c 'import keras_hub, tensorflow as tf; print("keras-hub", keras_hub.__version__, "on TensorFlow", tf.__version__)' 2>/dev/null | tail -1) ($after) ready in $venv"
