#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (TensorFlow + Gloo, no MPI) against the TensorFlow of a venv.
#
# Usage: bash scripts/install_horovod.sh [VENV] [--force]
#   VENV     the virtual environment to install into. Defaults to $VIRTUAL_ENV, else ./.venv.
#   --force  rebuild the wheel even if one is cached and reinstall even if horovod already works.
#
# Why a script and not `pip install horovod`: horovod 0.28.1 (June 2023, the newest on PyPI) predates
# TF 2.16+ and Keras 3. Its sdist only builds against TF 2.21 with
#   * --no-build-isolation (the isolated build cannot see the installed TensorFlow),
#   * -I<tf include>/external/highwayhash and -I<tf include>/external/farmhash_archive/src
#     (xla_mpi_ops.cc includes highwayhash/arch_specific.h and farmhash.h by their short names), and
#   * a one-line forwarding header at tensorflow/compiler/xla/client/xla_builder.h, which TF 2.19+
#     moved to xla/hlo/builder/xla_builder.h (see horovod#4302, unmerged).
# Everything comes from the package registry (PyPI); the sdist itself is not modified.
#
# The built wheel is cached in ${TFACCEL_WHEEL_CACHE:-~/.cache/tfaccel/wheels}/<key>/, keyed by the
# horovod, TensorFlow and Python versions, so repeat runs (CI) only reinstall it.
# Environment: MAKEFLAGS (default -j2), HOROVOD_CMAKE (default: cmake on PATH, else pip's cmake).
set -euo pipefail

HOROVOD_VERSION=0.28.1
venv=""
force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        -*) echo "install_horovod: unknown option '$arg'; valid: [VENV] [--force]" >&2; exit 2 ;;
        *) if [ -n "$venv" ]; then
               echo "install_horovod: got two venvs ('$venv', '$arg'); pass one" >&2; exit 2
           fi
           venv="$arg" ;;
    esac
done
venv="${venv:-${VIRTUAL_ENV:-.venv}}"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
    echo "install_horovod: no python at '$py'; pass the venv that holds TensorFlow, e.g." \
         "'bash scripts/install_horovod.sh .venv'" >&2
    exit 2
fi
py="$(cd "$(dirname "$py")" && pwd)/python"
bindir="$(dirname "$py")"
log() { echo "install_horovod: $*"; }

# Horovod already usable with its TensorFlow ops and Gloo: nothing to do.
horovod_ok() {
    "$py" - <<'EOF' >/dev/null 2>&1
import horovod, horovod.tensorflow as hvd
assert horovod.__version__ == "0.28.1", horovod.__version__
assert hvd.gloo_built()
EOF
}
if [ "$force" -eq 0 ] && horovod_ok; then
    log "horovod $HOROVOD_VERSION with TensorFlow ops and Gloo already importable in $venv; nothing to do"
    exit 0
fi

tf_info="$("$py" -c 'import sys, tensorflow as tf; print(tf.__version__, tf.sysconfig.get_include(), "cp%d%d" % sys.version_info[:2])' 2>/dev/null | tail -1)" || {
    echo "install_horovod: TensorFlow is not importable from $py; install it first" \
         "(pip install -e '.[cpu]')" >&2
    exit 1
}
read -r tf_version tf_include py_tag <<<"$tf_info"
cache_root="${TFACCEL_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfaccel/wheels}"
cache_dir="$cache_root/horovod-$HOROVOD_VERSION-tf-$tf_version-$py_tag-$(uname -m)"
log "TensorFlow $tf_version ($py_tag), wheel cache $cache_dir"

wheel="$(ls "$cache_dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -1 || true)"
if [ "$force" -eq 1 ] || [ -z "$wheel" ]; then
    cmake_bin="${HOROVOD_CMAKE:-$(command -v cmake || true)}"
    if [ -z "$cmake_bin" ]; then
        log "no cmake on PATH; installing cmake from PyPI into $venv"
        "$py" -m pip install -q 'cmake>=3.13,<4'
        cmake_bin="$bindir/cmake"
    fi
    # --no-build-isolation means the venv itself must hold the build requirements.
    "$py" -m pip install -q setuptools wheel

    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    shim="$work/include"
    cxxflags="${CXXFLAGS:-}"
    if [ ! -e "$tf_include/tensorflow/compiler/xla/client/xla_builder.h" ] &&
       [ -e "$tf_include/xla/hlo/builder/xla_builder.h" ]; then
        mkdir -p "$shim/tensorflow/compiler/xla/client"
        echo '#include "xla/hlo/builder/xla_builder.h"' \
            >"$shim/tensorflow/compiler/xla/client/xla_builder.h"
        cxxflags="$cxxflags -I$shim"
    fi
    for d in external/highwayhash external/farmhash_archive/src; do
        if [ -d "$tf_include/$d" ]; then cxxflags="$cxxflags -I$tf_include/$d"; fi
    done

    # Horovod's setup.py has CMake build RelWithDebInfo (-O3 -g): debug information for every TensorFlow header
    # a source includes costs a large part of the compile time and most of the wheel's size. The compilers are
    # called through wrappers that put -g0 last on each command line (the last -g option wins), so the code is the
    # same -O3 build without the debug information.
    for tool in "${CC:-cc}:cc" "${CXX:-c++}:c++"; do
        compiler="$(command -v "${tool%%:*}")" || { echo "install_horovod: no ${tool%%:*} on PATH" >&2; exit 1; }
        printf '#!/bin/sh\nexec %s "$@" -g0\n' "$compiler" >"$work/${tool##*:}"
        chmod +x "$work/${tool##*:}"
    done
    log "building horovod $HOROVOD_VERSION from the PyPI sdist (cmake $cmake_bin, MAKEFLAGS=${MAKEFLAGS:--j2}," \
        "without debug information); this takes a few minutes"
    start=$(date +%s)
    if ! env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
            HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CMAKE="$cmake_bin" \
            MAKEFLAGS="${MAKEFLAGS:--j2}" CXXFLAGS="$cxxflags" CC="$work/cc" CXX="$work/c++" PATH="$bindir:$PATH" \
            "$py" -m pip wheel --no-build-isolation --no-deps --no-binary horovod \
            --no-cache-dir -w "$work/dist" "horovod==$HOROVOD_VERSION" >"$work/build.log" 2>&1; then
        tail -n 60 "$work/build.log" >&2
        echo "install_horovod: FAILED to build horovod $HOROVOD_VERSION against TensorFlow $tf_version" \
             "(full log above, last 60 lines)" >&2
        exit 1
    fi
    log "built in $(( $(date +%s) - start )) s"
    mkdir -p "$cache_dir"
    built="$(ls "$work"/dist/horovod-"$HOROVOD_VERSION"-*.whl)"
    cp "$built" "$cache_dir/.tmp.$$" && mv "$cache_dir/.tmp.$$" "$cache_dir/$(basename "$built")"
    wheel="$cache_dir/$(basename "$built")"
else
    log "using cached wheel $wheel"
fi

# The wheel's own install_requires (cloudpickle, psutil, pyyaml, packaging) come from the registry.
"$py" -m pip install -q --force-reinstall --no-deps "$wheel"
"$py" -m pip install -q cloudpickle psutil pyyaml packaging

if ! horovod_ok; then
    "$py" -c 'import horovod.tensorflow as hvd; print(hvd.gloo_built())' >&2 || true
    echo "install_horovod: FAILED: horovod installed but its TensorFlow ops or Gloo do not load" >&2
    exit 1
fi
check="$(PATH="$bindir:$PATH" "$bindir/horovodrun" --check-build 2>&1)"
echo "$check" | sed -n '/Available Frameworks/,$p'
if ! echo "$check" | grep -q '\[X\] TensorFlow' || ! echo "$check" | grep -q '\[X\] Gloo'; then
    echo "install_horovod: FAILED: 'horovodrun --check-build' does not show TensorFlow and Gloo" >&2
    exit 1
fi
log "horovod $HOROVOD_VERSION ready in $venv"
