#!/usr/bin/env bash
# Install what Keras' own tests (tests/conformance/keras_tests) import besides Keras: jax, in a folder of its own.
#
# Usage: bash scripts/install_keras_tests.sh [VENV]
#   VENV  the virtual environment the tests run in. Defaults to $VIRTUAL_ENV, else ./.venv.
# The folder is VENV/keras-tests-site; tests/conformance puts it at the END of sys.path of the processes that run
# Keras' tests, and nowhere else.
#
# Why not in the venv: Keras' trainer and data-adapter tests import jax at module level (they run on the TensorFlow
# backend here), but with jax importable every TensorFlow process imports it, and scipy with it, at start-up
# (tf.lite's converter tries `import jax`): about 1 CPU-second more for each of the hundreds of TensorFlow processes
# the suite starts. A user's venv has no jax either. The venv's numpy, ml_dtypes and opt_einsum come first on the
# path, so only jax, jaxlib and scipy load from the folder.
set -euo pipefail

JAX=(jax==0.10.2 jaxlib==0.10.2 "scipy>=1.13,<1.18")
# shellcheck source=scripts/venv_arg.sh
source "$(dirname "$0")/venv_arg.sh"
venv_arg install_keras_tests 2,13 "$@"
site="$venv/keras-tests-site"
tmp="$site.partial"
rm -rf "$tmp"
"$py" -m pip install -q --disable-pip-version-check --no-deps --target "$tmp" "${JAX[@]}" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
# the folder goes last on the path, as tests/conformance puts it: jax must import against the venv's numpy
if ! "$py" -c "import sys; sys.path.append('$tmp'); import jax, numpy; print(jax.__version__, numpy.__version__)" \
        >/dev/null 2>&1; then
    "$py" -c "import sys; sys.path.append('$tmp'); import jax" >&2 || true
    echo "install_keras_tests: FAILED: jax does not import from $tmp after the venv's packages" >&2
    exit 1
fi
rm -rf "$site"
mv "$tmp" "$site"
echo "install_keras_tests: jax $("$py" -c "import sys; sys.path.append('$site'); import jax; print(jax.__version__)") ready in $site"
